"""Generators: what turns a candidate's fields into new text, with retries and accounting.

Three kinds behind one call, `generate(fields_list) -> list[Generation]`:
- `engine`: a prompt template over the factory's inference engine (in-process vLLM on an export —
  the latest one by default), batched;
- `endpoint`: the same template sent to any OpenAI-compatible completions endpoint (another
  factory's `factory serve`, or a hosted model; the key comes from an environment variable named
  in config, read at run time);
- `function`: a Python function `module:function(fields) -> str` — programmatic generation, e.g.
  porting a word problem to a program whose answer the sandbox checks.

Two kinds of failure, kept apart. A *rejection* is about one candidate: a template field it lacks,
a function stage raising `ValueError` (its way of saying "not this seed", e.g. no function to
extract), an endpoint refusing that one request (HTTP 400/413/422). It becomes a `Generation`
with `error` set, which the pipeline records as a rejected row with the reason. Anything else
means the generator cannot work, and the run fails with a `GeneratorError` naming the stage and
the cause, before anything is committed: an engine whose `generate` raises (vLLM died), an
endpoint still down after `max_attempts` tries or refusing the key, a function raising anything
but `ValueError` (a bug). Why: a dead engine recorded as 1,000 rejected rows is a run that
"succeeded" with nothing, and the next one would do the same.

Only endpoint requests are retried (HTTP 408/429/5xx, timeouts, refused connections, answers
that are not a completion), with a growing pause. An engine is not retried in-process (a crashed
engine stays crashed; the run's retry policy restarts it), and a function is deterministic:
calling it again gives the same answer, so a retry would only add the pause.
"""

from __future__ import annotations

import hashlib
import http.client
import importlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

from factory import settings
from factory.synth.config import GeneratorConfig

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})  # the server may answer next time
REJECT_STATUS = frozenset({400, 413, 422})  # this request (its prompt) is refused; others may pass


class GeneratorError(RuntimeError):
    """A generator cannot work at all (see the module docstring): the run fails with this."""


class _Transient(Exception):
    """An endpoint failure worth another try."""


@dataclass
class Generation:
    text: str | None
    tokens: int = 0
    attempts: int = 1
    error: str | None = None


def template_hash(config: GeneratorConfig) -> str:
    """Identity of what produced a row: the template or function, and the sampling settings."""
    keys = ("kind", "template", "function", "max_tokens", "temperature", "top_p", "stop")
    return hashlib.sha256(json.dumps({k: getattr(config, k) for k in keys}, sort_keys=True,
                                     default=list).encode()).hexdigest()[:16]


def load_function(ref: str) -> Callable:
    module, _, name = ref.partition(":")
    if not module or not name:
        raise ValueError(f"function {ref!r}: expected module:function")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"function {ref!r} cannot be loaded: {exc}") from exc


def render(template: str, fields: Mapping) -> str:
    """`template` filled from `fields`; a ValueError naming what this candidate lacks."""
    try:
        return template.format(**fields)
    except KeyError as exc:
        raise ValueError(f"template needs field {exc.args[0]!r}; the candidate has {sorted(fields)}") from None
    except (IndexError, AttributeError, TypeError, ValueError) as exc:  # `{n:d}` on a string, `{a.b}`, `{a[2]}`
        raise ValueError(f"template cannot be filled from this candidate: {type(exc).__name__}: {exc}") from None


class Generator:
    """One stage's generator; `engine_for(export_ref)` opens the in-process engine on demand.
    `name` (e.g. "stage explain") heads the errors that fail the run."""

    def __init__(self, config: GeneratorConfig, *, max_attempts: int, seed: int,
                 engine_for: Callable[[str], object] | None = None, name: str = "generator",
                 pause_s: float = 0.5):
        self.config, self.max_attempts, self.seed = config, max_attempts, seed
        self.engine_for, self.name, self.pause_s = engine_for, name, pause_s
        self.export_id: str | None = None
        self._function = load_function(config.function) if config.kind == "function" else None

    def generate(self, batch: list[Mapping]) -> list[Generation]:
        if self.config.kind == "function":
            return [self._call(f) for f in batch]
        prompts: list[str | Generation] = []
        for f in batch:
            try:
                prompts.append(render(self.config.template, f))
            except ValueError as exc:  # this candidate lacks a field: nothing was asked of the model
                prompts.append(Generation(None, 0, 0, f"ValueError: {exc}"))
        asks = [p for p in prompts if isinstance(p, str)]
        if self.config.kind == "endpoint":
            headers = self._headers()
            answers = [self._request(p, i, headers) for i, p in enumerate(asks)]
        else:
            answers = self._engine_batch(asks) if asks else []
        it = iter(answers)
        return [next(it) if isinstance(p, str) else p for p in prompts]

    def _call(self, fields: Mapping) -> Generation:
        try:
            text = self._function(dict(fields))
        except ValueError as exc:  # the function's way to reject this candidate
            return Generation(None, 0, 1, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a bug: re-raised with the stage and function named, never a row
            raise GeneratorError(f"{self.name}: function {self.config.function} raised {type(exc).__name__}: {exc} "
                                 "(a function rejects a candidate by raising ValueError)") from exc
        if not isinstance(text, str):
            raise GeneratorError(f"{self.name}: function {self.config.function} returned {type(text).__name__}, "
                                 "not str (raise ValueError to reject a candidate)")
        return Generation(text, 0, 1)

    def _engine_batch(self, prompts: list[str]) -> list[Generation]:
        from factory.infer import SamplingConfig

        if self.engine_for is None:
            raise GeneratorError(f"{self.name}: kind=engine needs an inference engine (none was given to the pipeline)")
        engine = self.engine_for(self.config.export)
        self.export_id = engine.export.export_id
        c = self.config
        sampling = SamplingConfig(max_tokens=c.max_tokens, temperature=c.temperature, top_p=c.top_p,
                                  seed=self.seed, stop=c.stop)
        ids = [engine.fit(engine.document_ids(p), c.max_tokens) for p in prompts]
        try:
            outputs = engine.generate(ids, sampling)
        except Exception as exc:  # the engine itself failed (vLLM's core died, out of memory): fail the run
            raise GeneratorError(f"{self.name}: engine on {self.export_id} failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
        return [Generation(s[0].text, len(s[0].token_ids), 1) for s in outputs]

    def _headers(self) -> dict[str, str]:
        endpoint = self.config.endpoint
        headers = {"Content-Type": "application/json"}
        if endpoint.api_key_env:
            key = settings.secret(endpoint.api_key_env)
            if not key:
                raise GeneratorError(f"{self.name}: environment variable {endpoint.api_key_env} (the endpoint's "
                                     "API key) is not set")
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _request(self, prompt: str, index: int, headers: dict) -> Generation:
        url = f"{self.config.endpoint.base_url.rstrip('/')}/completions"
        for attempt in range(1, self.max_attempts + 1):
            try:
                text, tokens = self._complete(url, prompt, index, headers)
                return Generation(text, tokens, attempt)
            except urllib.error.HTTPError as exc:
                detail = _body(exc)
                if exc.code in REJECT_STATUS:
                    return Generation(None, 0, attempt, f"HTTP {exc.code} from {url}: {detail}")
                if exc.code not in RETRY_STATUS:  # 401/403/404: the key, the URL or the model is wrong
                    raise GeneratorError(f"{self.name}: endpoint {url} answered HTTP {exc.code}: {detail}") from None
                last = f"HTTP {exc.code}: {detail}"
            except (_Transient, OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, garbled
                last = f"{type(exc).__name__}: {exc}"
            if attempt < self.max_attempts:
                time.sleep(self.pause_s * attempt)
        raise GeneratorError(f"{self.name}: endpoint {url} failed {self.max_attempts} times; last: {last}")

    def _complete(self, url: str, prompt: str, index: int, headers: dict) -> tuple[str, int]:
        endpoint = self.config.endpoint
        body = {"model": endpoint.model, "prompt": prompt, "max_tokens": self.config.max_tokens,
                "temperature": self.config.temperature, "top_p": self.config.top_p, "seed": self.seed + index,
                "stop": list(self.config.stop) or None}
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(request, timeout=endpoint.timeout_s) as response:
            raw = response.read()
        try:
            answer = json.loads(raw)
            text, tokens = answer["choices"][0]["text"], int((answer.get("usage") or {}).get("completion_tokens", 0))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise _Transient(f"not a completion ({type(exc).__name__}: {exc}): {raw[:200]!r}") from None
        if not isinstance(text, str):
            raise _Transient(f"not a completion (text is {type(text).__name__}): {raw[:200]!r}")
        self.export_id = endpoint.model
        return text, tokens


def _body(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read(300).decode("utf-8", "replace").strip() or exc.reason
    except OSError:
        return str(exc.reason)
