"""The Podium web app (FastAPI, server-rendered Jinja2 pages, one small static script).

Pages: models (`/models`, every export from lineage with its run, step and eval scores, linked to
its lineage), chat (`/chat`), battle (`/battle`), leaderboard (`/leaderboard`) and the dataset
browser (`/datasets`). The writes are JSON calls from `static/podium.js`: `POST /api/chat`
and `POST /api/battle/<id>/<side>` stream the generated text as it comes (chunked text/plain, put on
the page with `textContent`, so model output is never markup); `POST /api/battle` opens a battle,
`POST /api/battle/<id>/vote` records a vote and answers with the two names.

Safety: every request needs a user (`auth`: a token from the token list, kept in a cookie after
`/login?token=...`, or the auth proxy's header); every write needs the CSRF token of its user
(`X-CSRF-Token`, an HMAC of the user under the app's secret, rendered into each page); chats and
battles count against a per-user sliding-minute limit. A refused request changes nothing. Jinja2
escapes everything it renders.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import Body, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pyiceberg.expressions import AlwaysTrue, And, EqualTo
from pyiceberg.types import BooleanType, DoubleType, FloatType, IntegerType, LongType

from factory.lake import Lake
from factory.podium.config import PodiumConfig, load_secret, load_tokens
from factory.podium.inference import Generation, LocalBackend, OpenAIBackend, Sampling
from factory.podium.models import Exports, list_models
from factory.podium.ratings import leaderboard
from factory.podium.store import VOTES, PodiumError, PodiumStore, read_votes

HERE = Path(__file__).parent
COOKIE = "podium_token"
TEXT_CELL = 400  # characters of a text cell the dataset browser shows (the rest behind "more")
FULL_CELL = 20_000  # ... and at most this many behind it


def make_backend(config: PodiumConfig):
    from factory.deploy import load_profile
    from factory.infer import EngineConfig

    profile = load_profile().inference
    kind = config.backend if config.backend != "profile" else ("openai" if profile.kind == "openai" else "local")
    if kind == "local":
        return LocalBackend(config.max_models)
    if profile.kind != "openai":
        raise ValueError("backend 'openai' needs the deployment profile's inference.kind 'openai' and its endpoint")
    return OpenAIBackend(EngineConfig(kind="openai", endpoint=profile.endpoint, api_key=profile.api_key,
                                      timeout_s=profile.timeout_s, max_concurrency=profile.max_concurrency))


class RateLimiter:
    """At most `per_minute` events per user in any 60 s."""

    def __init__(self, per_minute: int):
        self.per_minute = per_minute
        self._events: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self._lock = threading.Lock()

    def take(self, user: str) -> None:
        now = time.monotonic()
        with self._lock:
            events = self._events[user]
            while events and now - events[0] > 60:
                events.popleft()
            if len(events) >= self.per_minute:
                raise PodiumError(f"user {user!r}: rate limit of {self.per_minute} generations a minute reached; "
                                  f"try again in {60 - (now - events[0]):.0f} s", 429)
            events.append(now)


def create_app(config: PodiumConfig, lake: Lake, backend=None) -> FastAPI:
    """The app over `lake`; `backend` defaults to the one `config` and the profile name."""
    app = FastAPI(title="Podium", docs_url=None, redoc_url=None, openapi_url=None)
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    store = PodiumStore(lake)
    exports = Exports(lake)
    backend = backend if backend is not None else make_backend(config)
    limiter = RateLimiter(config.generations_per_minute)
    secret = load_secret(config)
    tokens = load_tokens(config) if config.auth == "tokens" else {}
    board_cache: dict[str, Any] = {}
    app.state.store, app.state.config = store, config

    def csrf_of(user: str) -> str:
        return hmac.new(secret, f"csrf\0{user}".encode(), hashlib.sha256).hexdigest()

    def user_of(request: Request) -> str:
        if config.auth == "header":
            user = request.headers.get(config.user_header, "").strip()
            if not user:
                raise PodiumError(f"no user: the auth proxy's header {config.user_header} is missing", 401)
            return user
        token = request.cookies.get(COOKIE) or request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not token or token not in tokens:
            raise PodiumError("not signed in: open /login?token=<your token> (`factory podium` prints the link)", 401)
        return tokens[token]

    def writer(request: Request) -> str:
        user = user_of(request)
        sent = request.headers.get("X-CSRF-Token", "")
        if not hmac.compare_digest(sent, csrf_of(user)):
            raise PodiumError("CSRF token missing or wrong: reload the page", 403)
        return user

    def page(request: Request, name: str, **context) -> HTMLResponse:
        user = user_of(request)
        return templates.TemplateResponse(request, name, {"user": user, "csrf": csrf_of(user), "page": name, **context})

    @app.exception_handler(PodiumError)
    async def refused(request: Request, exc: PodiumError):
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        return templates.TemplateResponse(request, "error.html", {"user": None, "page": "", "error": str(exc),
                                                                  "status": exc.status}, status_code=exc.status)

    def object_of(body) -> dict:
        if body is None:
            return {}
        if not isinstance(body, dict):
            raise PodiumError("the request body must be a JSON object")
        return body

    def sampling_of(body: dict) -> Sampling:
        raw = body.get("sampling") or {}
        try:
            sampling = Sampling(temperature=float(raw.get("temperature", 0.7)), top_p=float(raw.get("top_p", 0.95)),
                                max_tokens=int(raw.get("max_tokens", 128)), seed=int(raw.get("seed", 0)))
        except (TypeError, ValueError, AttributeError):
            raise PodiumError(f"sampling {raw!r}: temperature and top_p must be numbers, max_tokens and seed "
                              f"integers") from None
        if not 0 <= sampling.temperature <= 2 or not 0 < sampling.top_p <= 1:
            raise PodiumError(f"sampling: temperature {sampling.temperature} must be in [0, 2] and top_p "
                              f"{sampling.top_p} in (0, 1]")
        if not 1 <= sampling.max_tokens <= config.max_new_tokens:
            raise PodiumError(f"sampling: max_tokens {sampling.max_tokens} must be in [1, {config.max_new_tokens}]")
        return sampling

    def check_prompt(prompt) -> str:
        if not isinstance(prompt, str) or not prompt.strip():
            raise PodiumError("the prompt is empty")
        if len(prompt) > config.max_prompt_chars:
            raise PodiumError(f"the prompt has {len(prompt)} characters; the limit is {config.max_prompt_chars}", 413)
        return prompt

    def streamed(export, messages: list[dict], sampling: Sampling, row: dict, battle=None) -> StreamingResponse:
        gen = Generation("", 0)
        pieces = backend.stream(export, messages, sampling, gen)

        def body():
            complete = False
            try:
                for piece in pieces:
                    yield piece
                complete = True
            except Exception as exc:  # noqa: BLE001 - the page shows it; the row says error
                gen.finish_reason = "error"
                yield f"\n[generation failed: {type(exc).__name__}: {exc}]"
            finally:
                if battle is not None and (not complete or gen.finish_reason == "error"):
                    store.release_side(battle, row["side"])  # it can be generated again
                if complete or gen.finish_reason == "error":
                    store.record_generation({
                        **row, "export_id": export.export_id, "export_sha256": export.sha256,
                        "checkpoint_id": export.checkpoint_id, "mode": gen.mode, "messages": json.dumps(messages),
                        "prompt": next(m["content"] for m in reversed(messages) if m["role"] == "user"),
                        "response": gen.text, "finish_reason": gen.finish_reason,
                        "sampling": json.dumps(sampling.as_dict(), sort_keys=True), "backend": backend.label,
                        "first_token_ms": None if gen.first_token_s is None else gen.first_token_s * 1000,
                        "tokens": gen.tokens}, battle if gen.finish_reason != "error" else None)

        return StreamingResponse(body(), media_type="text/plain; charset=utf-8",
                                 headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})

    # -- sign in -------------------------------------------------------------------------------------
    @app.get("/login")
    def login(token: str = "", next: str = "/models"):
        if config.auth != "tokens":
            return RedirectResponse("/models", 303)
        if token not in tokens:
            raise PodiumError("unknown token", 401)
        target = next if next.startswith("/") and not next.startswith("//") else "/models"
        response = RedirectResponse(target, 303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
        return response

    @app.get("/")
    def home():
        return RedirectResponse("/models", 303)

    # -- models --------------------------------------------------------------------------------------
    @app.get("/models", response_class=HTMLResponse)
    def models(request: Request):
        entries = list_models(lake)
        metrics = sorted({m for e in entries for m in e.scores})
        return page(request, "models.html", models=entries, metrics=metrics)

    @app.get("/lineage", response_class=HTMLResponse)
    def lineage(request: Request, id: str):
        tree = lake.lineage.upstream_of(id)
        if tree["record"] is None:
            raise PodiumError(f"version {id!r}: not in lineage", 404)

        def flat(node, depth=0):
            record = node["record"]
            yield {"depth": depth, "version_id": node["version_id"], "kind": record.kind if record else "",
                   "created_at": record.created_at if record else "", "asset_key": record.asset_key if record else ""}
            for child in node["upstream"]:
                yield from flat(child, depth + 1)

        return page(request, "lineage.html", root=id, nodes=list(flat(tree)))

    # -- chat ----------------------------------------------------------------------------------------
    @app.get("/chat", response_class=HTMLResponse)
    def chat(request: Request, export: str = ""):
        entries = list_models(lake)
        if export and export not in {e.export_id for e in entries}:
            raise PodiumError(f"export {export!r}: not in lineage", 404)
        return page(request, "chat.html", models=entries, selected=export or (entries[0].export_id if entries else ""),
                    conversation_id=uuid.uuid4().hex[:16], max_new_tokens=config.max_new_tokens)

    @app.post("/api/chat")
    def chat_send(request: Request, body: Any = Body(None)):
        user = writer(request)
        body = object_of(body)
        export = exports.get(str(body.get("export", "")))
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str)
                for m in messages) or messages[-1]["role"] != "user":
            raise PodiumError("messages must be a list of {role: user|assistant, content} ending with a user turn")
        check_prompt(messages[-1]["content"])
        if sum(len(m["content"]) for m in messages) > 8 * config.max_prompt_chars:
            raise PodiumError("the conversation is too long; start a new one", 413)
        sampling = sampling_of(body)
        conversation_id = str(body.get("conversation_id") or uuid.uuid4().hex[:16])[:64]
        limiter.take(user)
        row = {"conversation_id": conversation_id, "turn": sum(m["role"] == "user" for m in messages) - 1,
               "kind": "chat", "side": "", "user": user}
        return streamed(export, messages, sampling, row)

    # -- battles -------------------------------------------------------------------------------------
    def on_disk() -> list[str]:
        """The exports a battle can use: in lineage, and their directories still there."""
        found = []
        for entry in list_models(lake):
            try:
                exports.get(entry.export_id)
            except PodiumError:
                continue
            found.append(entry.export_id)
        return found

    @app.get("/battle", response_class=HTMLResponse)
    def battle(request: Request):
        return page(request, "battle.html", max_new_tokens=config.max_new_tokens, pairing=config.pairing)

    @app.post("/api/battle")
    def battle_new(request: Request, body: Any = Body(None)):
        user = writer(request)
        body = object_of(body)
        prompt = check_prompt(body.get("prompt"))
        sampling = sampling_of(body)
        a, b = choose_pair(on_disk(), current_board() if config.pairing == "leader" else None)
        limiter.take(user)
        battle_id = uuid.uuid4().hex[:20]
        store.open_battle(battle_id, user, prompt, sampling.as_dict(), a, b)
        return {"battle_id": battle_id}

    @app.post("/api/battle/{battle_id}/vote")
    def battle_vote(request: Request, battle_id: str, body: Any = Body(None)):
        user = writer(request)
        body = object_of(body)
        fight = store.vote(battle_id, user, str(body.get("vote", "")))
        return {"battle_id": battle_id, "vote": fight.vote, "a": fight.a.export_id, "b": fight.b.export_id}

    @app.post("/api/battle/{battle_id}/{side}")  # after /vote: routes match in order

    def battle_side(request: Request, battle_id: str, side: str):
        user = writer(request)
        if side not in ("A", "B"):
            raise PodiumError(f"side {side!r}: must be A or B")
        fight = store.battle_for(battle_id, user)
        export = exports.get((fight.a if side == "A" else fight.b).export_id)
        store.claim_side(fight, side)  # one generation per side, even from two tabs at once
        sampling = Sampling(**fight.sampling)
        row = {"conversation_id": battle_id, "turn": 0, "kind": "battle", "side": side, "user": user}
        return streamed(export, [{"role": "user", "content": fight.prompt}], sampling, row, fight)

    # -- leaderboard ---------------------------------------------------------------------------------
    def current_board():
        """The leaderboard of the votes table's current snapshot, refitted only when it moved."""
        snapshot = lake.current_snapshot_id(VOTES)
        if "board" not in board_cache or board_cache["snapshot"] != snapshot:
            votes = read_votes(lake, snapshot)
            board_cache.update(snapshot=snapshot, board=leaderboard(
                [(v["export_a"], v["export_b"], v["vote"]) for v in votes], bootstrap=100, seed=0))
        return board_cache["board"]

    @app.get("/leaderboard", response_class=HTMLResponse)
    def leaderboard_page(request: Request):
        board = current_board()
        names = [r.export_id for r in board.ratings]
        return page(request, "leaderboard.html", board=board, names=names)

    # -- datasets ------------------------------------------------------------------------------------
    @app.get("/datasets", response_class=HTMLResponse)
    def datasets(request: Request):
        return page(request, "datasets.html", tables=lake.tables())

    @app.get("/datasets/{table}", response_class=HTMLResponse)
    def dataset(request: Request, table: str, page_no: int = 1, column: list[str] = Query(default=[]),
                value: list[str] = Query(default=[])):
        user_of(request)
        if table not in lake.tables():
            raise PodiumError(f"table {table!r}: not in the lake", 404)
        if page_no < 1:
            raise PodiumError(f"page {page_no}: pages start at 1")
        if len(column) != len(value):
            raise PodiumError(f"filters: {len(column)} columns but {len(value)} values")
        ice = lake.table(table)
        fields = {f.name: f for f in ice.schema().fields}
        filters = [(c, v) for c, v in zip(column, value) if c]
        row_filter = AlwaysTrue()
        for name, wanted in filters:
            if name not in fields:
                raise PodiumError(f"column {name!r}: {table} has {', '.join(fields)}")
            if not fields[name].field_type.is_primitive:
                raise PodiumError(f"column {name!r} of {table} is a {fields[name].field_type}: only plain columns "
                                  f"filter")
            row_filter = And(row_filter, EqualTo(name, _typed(name, fields[name].field_type, wanted)))
        size = config.page_size
        started = time.perf_counter()
        if ice.current_snapshot() is None:
            rows = []
        else:  # the scan stops once it has the rows up to this page (and one more: is there a next page?)
            rows = ice.scan(row_filter=row_filter, limit=page_no * size + 1).to_arrow().slice((page_no - 1) * size) \
                .to_pylist()
        more = len(rows) > size
        rows = rows[:size]
        cells = [[_cell(row[name]) for name in fields] for row in rows]
        query = urlencode([p for c, v in filters for p in (("column", c), ("value", v))])
        return page(request, "dataset.html", table=table, columns=list(fields), cells=cells, page_no=page_no,
                    more=more, filters=filters, query=query, read_ms=(time.perf_counter() - started) * 1000)

    return app


def choose_pair(exports: list[str], board=None, rng=random) -> tuple[str, str]:
    """Two exports for a battle: at random, or (with the current `board`: pairing `leader`) the
    leader against the export with the fewest votes, in random order. Exports no vote has rated yet
    count as having none, so a new export is paired first."""
    if len(exports) < 2:
        raise PodiumError(f"a battle needs two exports on disk; the lake has {len(exports)}", 409)
    ranked = [r.export_id for r in board.ratings if r.export_id in exports] if board is not None else []
    if not ranked:
        return tuple(rng.sample(exports, 2))
    leader = ranked[0]
    counts = {r.export_id: r.votes for r in board.ratings}
    challenger = min((e for e in exports if e != leader), key=lambda e: (counts.get(e, 0), rng.random()))
    return tuple(rng.sample([leader, challenger], 2))


def _typed(column: str, field_type, value: str):
    try:
        if isinstance(field_type, (IntegerType, LongType)):
            return int(value)
        if isinstance(field_type, (DoubleType, FloatType)):
            return float(value)
        if isinstance(field_type, BooleanType):
            if value.lower() not in ("true", "false"):
                raise ValueError(value)
            return value.lower() == "true"
    except ValueError:
        raise PodiumError(f"filter {column}={value!r}: not a {field_type}") from None
    return value


def _cell(value) -> dict:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return {"text": text[:TEXT_CELL], "cut": len(text) > TEXT_CELL, "full": text[:FULL_CELL]}
