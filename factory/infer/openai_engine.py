"""The `Engine` over an OpenAI-compatible server: the cluster's vLLM Service, or `factory serve`.

Purpose: on Kubernetes, eval and synthetic-data pods do not each start a vLLM of their own; they
send the same token-id requests to a shared vLLM Deployment (`inference: {kind: openai, endpoint:
http://vllm.factory.svc:8000/v1}`). Same interface and, the server being vLLM, the same numbers
as `VLLMEngine` in-process (a test holds greedy tokens and log-probs to 1e-4 in fp32).

Design:
- Identity before anything else. An eval of export X must never score whatever the server holds,
  so opening the engine asks `GET /models` and requires (1) a served model named the export's id
  (`export/<run>@<step>`, what `factory serve` passes as `--served-model-name`), (2) served from
  the export's content-addressed directory (`ModelCard.root` ends in `<run>@<step>-<sha12>`, whose
  name carries the hash of the export's files), and (3) the export's context length. Every request
  then names the export id, so a replica that serves something else answers 404 and the call fails.
  The deep check is the equivalence check itself, which runs over this engine like any other.
- One request per prompt, `max_concurrency` in flight (a thread pool): a sampling seed is per prompt
  (seed + i, as in-process) and the server batches concurrent requests itself.
- Scoring uses vLLM's `prompt_logprobs` extra parameter on `/completions` with token-id prompts and
  `max_tokens: 1` — for every position, the actual token's log-prob (and the top k, with ranks).
  The distribution after the last token is the one generated step's `logprobs: k`, its keys token
  ids through `return_tokens_as_token_ids`.
- Sampling settings a server would otherwise default from a model's generation_config.json (top_k,
  min_p, penalties) are sent at vLLM's neutral values, as in-process `SamplingParams` has them.
- Failures raise `EndpointError` naming the URL and the cause. Connection errors, timeouts and HTTP
  408/429/5xx are retried `ATTEMPTS` times with a growing pause (a replica restarting); anything
  else fails at once. A failed request fails the eval — never a score of 0.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import PurePosixPath

from factory.infer.engine import Engine, EngineConfig, Sample, SamplingConfig, cut_at_stop
from factory.infer.export import ExportRef

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
ATTEMPTS = 3
PAUSE_S = 0.5
# vLLM's defaults for what SamplingParams leaves neutral; sent so a generation_config cannot change them
NEUTRAL = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


class EndpointError(RuntimeError):
    """The server does not answer, refuses a request, or does not serve the export asked for."""


class OpenAIEngine(Engine):
    """Batched generation and scoring of one export through a vLLM OpenAI-compatible server."""

    name = "openai"

    def __init__(self, export: ExportRef, config: EngineConfig):
        super().__init__(export, config)  # tokenizer and context from the export's own files
        self.base = config.endpoint.rstrip("/")
        self.model = export.export_id
        self.headers = {"Content-Type": "application/json"}
        if config.api_key is not None:
            self.headers["Authorization"] = f"Bearer {config.api_key.resolve('inference.api_key')}"
        self.card = self._served_card()
        self.pool = ThreadPoolExecutor(config.max_concurrency, thread_name_prefix="openai-engine")

    def _served_card(self) -> dict:
        """The server's entry for the export; EndpointError unless it is the export (module docstring)."""
        listed = self._call("/models")
        cards = [c for c in listed.get("data") or [] if isinstance(c, dict)] if isinstance(listed, dict) else []
        served = "; ".join(f"{c.get('id')!r} from {c.get('root')}" for c in cards) or "no model"
        asked = f"{self.model} (directory {self.export.path.name}, sha256 {self.export.sha256[:12]})"
        where = f"inference endpoint {self.base}"
        card = next((c for c in cards if c.get("id") == self.model), None)
        if card is None:
            raise EndpointError(f"{where} does not serve {asked}: it serves {served}. Start the server on the "
                                f"export's directory with --served-model-name {self.model}")
        root = str(card.get("root") or "")
        if PurePosixPath(root).name != self.export.path.name:
            raise EndpointError(f"{where} serves {self.model!r} from {root or 'an unnamed path'}, not from the "
                                f"export's content-addressed directory {self.export.path.name}: the weights behind "
                                f"that name are not known to be {asked}")
        if card.get("max_model_len") not in (None, self.max_len):
            raise EndpointError(f"{where} serves {self.model} with a context of {card['max_model_len']} tokens; "
                                f"the export's is {self.max_len} (start it with --max-model-len {self.max_len})")
        return card

    def _call(self, path: str, body: dict | None = None):
        """The JSON answer of GET (no body) or POST `path`, with retries of transient failures."""
        url = f"{self.base}{path}"
        data = None if body is None else json.dumps(body).encode()
        last = ""
        for attempt in range(1, ATTEMPTS + 1):
            request = urllib.request.Request(url, data=data, headers=self.headers,
                                             method="GET" if body is None else "POST")
            try:
                with urllib.request.urlopen(request, timeout=self.config.timeout_s) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as exc:
                detail = _detail(exc)
                if exc.code not in RETRY_STATUS:  # 400 bad request, 401 key, 404 model: the same next time
                    raise EndpointError(f"inference endpoint {url} answered HTTP {exc.code} for {self.model}: "
                                        f"{detail}") from None
                last = f"HTTP {exc.code}: {detail}"
            except (OSError, http.client.HTTPException, ValueError) as exc:  # refused, reset, timed out, not JSON
                last = f"{type(exc).__name__}: {exc}"
            if attempt < ATTEMPTS:
                time.sleep(PAUSE_S * attempt)
        raise EndpointError(f"inference endpoint {url} does not answer ({ATTEMPTS} tries; last: {last})")

    def _choices(self, body: dict) -> list[dict]:
        answer = self._call("/completions", {"model": self.model, **NEUTRAL, **body})
        try:
            choices = sorted(answer["choices"], key=lambda c: c["index"])
        except (KeyError, TypeError) as exc:
            raise EndpointError(f"inference endpoint {self.base}/completions: not a completion "
                                f"({type(exc).__name__}: {exc}): {str(answer)[:200]}") from None
        want = body.get("n", 1)
        if len(choices) != want:
            raise EndpointError(f"inference endpoint {self.base}/completions: {len(choices)} choices, asked for {want}")
        return choices

    def _map(self, fn, *items) -> list:
        return list(self.pool.map(fn, *items))

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> list[list[Sample]]:
        def one(i: int, prompt: list[int]) -> list[Sample]:
            choices = self._choices({
                "prompt": prompt, "n": sampling.n, "temperature": sampling.temperature, "top_p": sampling.top_p,
                "max_tokens": min(sampling.max_tokens, self.max_len - len(prompt)), "seed": sampling.seed + i,
                "stop": list(sampling.stop), "return_token_ids": True})
            return [Sample(token_ids=list(c["token_ids"]), text=cut_at_stop(c["text"], sampling.stop)[0],
                           finish_reason="stop" if c.get("finish_reason") == "stop" else "length")
                    for c in choices]

        return self._map(one, range(len(prompts)), prompts)

    def _scored(self, seq: list[int], k: int, **extra) -> dict:
        """The one choice of a 1-token greedy completion of `seq` with prompt log-probs (top `k`)."""
        choice = self._choices({"prompt": seq, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": k, **extra})[0]
        rows = choice.get("prompt_logprobs")
        if not isinstance(rows, list) or len(rows) != len(seq):
            raise EndpointError(f"inference endpoint {self.base}/completions: no prompt_logprobs for a "
                                f"{len(seq)}-token prompt (is it a vLLM server?)")
        return choice

    def logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        def one(seq: list[int]) -> list[float]:
            rows = self._scored(seq, 0)["prompt_logprobs"]
            return [float(rows[t][str(tok)]["logprob"]) for t, tok in enumerate(seq[1:], start=1)]

        return self._map(one, sequences)

    def top_logprobs(self, sequences: list[list[int]], k: int) -> list[list[dict[int, float]]]:
        def one(seq: list[int]) -> list[dict[int, float]]:
            choice = self._scored(seq, k, logprobs=k, return_tokens_as_token_ids=True)
            # prompt_logprobs[t] is about the token at t given seq[:t] (none at 0); the actual token
            # is always listed, with its rank: keep the top k only
            rows = [{int(tid): float(lp["logprob"]) for tid, lp in choice["prompt_logprobs"][t].items()
                     if lp["rank"] <= k} for t in range(1, len(seq))]
            last = choice["logprobs"]["top_logprobs"][0]  # {"token_id:<id>": logprob} after the whole sequence
            ranked = sorted(((int(key.removeprefix("token_id:")), float(v)) for key, v in last.items()),
                            key=lambda kv: -kv[1])
            return [*rows, dict(ranked[:k])]

        return self._map(one, sequences)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _detail(exc: urllib.error.HTTPError) -> str:
    """The server's error message (vLLM: {"error": {"message": ...}}), else the body's start."""
    try:
        raw = exc.read(2000).decode("utf-8", "replace").strip()
    except OSError:
        return str(exc.reason)
    try:
        return str(json.loads(raw)["error"]["message"])[:500]
    except (ValueError, KeyError, TypeError):
        return raw[:300] or str(exc.reason)
