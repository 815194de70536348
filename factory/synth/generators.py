"""Generators: what turns a candidate's fields into new text, with retries and accounting.

Three kinds behind one call, `generate(fields_list) -> list[Generation]`:
- `engine`: a prompt template over the factory's inference engine (in-process vLLM on an export —
  the latest one by default), batched;
- `endpoint`: the same template sent to any OpenAI-compatible completions endpoint (another
  factory's `factory serve`, or a hosted model; the key comes from an environment variable named
  in config, read at run time);
- `function`: a Python function `module:function(fields) -> str` — programmatic generation, e.g.
  porting a word problem to a program whose answer the sandbox checks.

A call that raises or times out is retried up to `max_attempts` times; one that still fails
becomes a `Generation` with `error` set, which the pipeline records as a rejected row with the
reason. A batch never fails silently and never invents text.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import time
import urllib.request
from dataclasses import dataclass
from typing import Callable

from factory.synth.config import GeneratorConfig
from factory import settings


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


def render(template: str, fields: dict) -> str:
    try:
        return template.format(**fields)
    except KeyError as exc:
        raise ValueError(f"template needs field {exc.args[0]!r}; the candidate has {sorted(fields)}") from None


def _retry(call: Callable[[], tuple[str, int]], attempts: int, pause_s: float = 0.5) -> Generation:
    error = None
    for attempt in range(1, attempts + 1):
        try:
            text, tokens = call()
            return Generation(text, tokens, attempt)
        except Exception as exc:  # noqa: BLE001 - recorded as the row's rejection reason, not swallowed
            error = f"{type(exc).__name__}: {exc}"
            if attempt < attempts:
                time.sleep(pause_s * attempt)
    return Generation(None, 0, attempts, error)


class Generator:
    """One stage's generator; `engine_for(export_ref)` opens the in-process engine on demand."""

    def __init__(self, config: GeneratorConfig, *, max_attempts: int, seed: int,
                 engine_for: Callable[[str], object] | None = None):
        self.config, self.max_attempts, self.seed = config, max_attempts, seed
        self.engine_for = engine_for
        self.export_id: str | None = None
        self._function = load_function(config.function) if config.kind == "function" else None

    def generate(self, batch: list[dict]) -> list[Generation]:
        if self.config.kind == "function":
            return [_retry(lambda f=f: (str(self._function(dict(f))), 0), self.max_attempts) for f in batch]
        prompts = [render(self.config.template, f) for f in batch]
        if self.config.kind == "endpoint":
            return [_retry(lambda p=p, i=i: self._complete(p, i), self.max_attempts) for i, p in enumerate(prompts)]
        return self._engine_batch(prompts)

    def _engine_batch(self, prompts: list[str]) -> list[Generation]:
        from factory.infer import SamplingConfig

        if self.engine_for is None:
            raise ValueError("kind=engine needs an inference engine (none was given to the pipeline)")
        engine = self.engine_for(self.config.export)
        self.export_id = engine.export.export_id
        c = self.config
        sampling = SamplingConfig(max_tokens=c.max_tokens, temperature=c.temperature, top_p=c.top_p,
                                  seed=self.seed, stop=c.stop)
        ids = [engine.fit(engine.document_ids(p), c.max_tokens) for p in prompts]
        error = None
        for attempt in range(1, self.max_attempts + 1):
            try:
                outputs = engine.generate(ids, sampling)
                return [Generation(s[0].text, len(s[0].token_ids), attempt) for s in outputs]
            except Exception as exc:  # noqa: BLE001 - recorded on every row of the batch
                error = f"{type(exc).__name__}: {exc}"
        return [Generation(None, 0, self.max_attempts, error) for _ in prompts]

    def _complete(self, prompt: str, index: int) -> tuple[str, int]:
        endpoint = self.config.endpoint
        headers = {"Content-Type": "application/json"}
        if endpoint.api_key_env:
            key = settings.secret(endpoint.api_key_env)
            if not key:
                raise ValueError(f"environment variable {endpoint.api_key_env} (the endpoint's API key) is not set")
            headers["Authorization"] = f"Bearer {key}"
        body = {"model": endpoint.model, "prompt": prompt, "max_tokens": self.config.max_tokens,
                "temperature": self.config.temperature, "top_p": self.config.top_p, "seed": self.seed + index,
                "stop": list(self.config.stop) or None}
        request = urllib.request.Request(f"{endpoint.base_url.rstrip('/')}/completions",
                                         data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(request, timeout=endpoint.timeout_s) as response:
            answer = json.loads(response.read())
        self.export_id = endpoint.model
        return answer["choices"][0]["text"], int(answer.get("usage", {}).get("completion_tokens", 0))
