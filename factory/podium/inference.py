"""Streaming generation for Podium: in-process, or through the vLLM OpenAI endpoint of the profile.

- `local`: the export's `LlamaForCausalLM` in this process (transformers, the factory's reference
  engine), decoded token by token through `TextIteratorStreamer` in a worker thread. Up to
  `max_models` exports stay loaded (a battle needs two), least recently used first out; one
  generation at a time per model.
- `openai`: `POST /v1/completions` with `stream: true` to the server the deployment profile's
  `inference.endpoint` names (the cluster's vLLM Service, or `factory serve`). The endpoint is
  first asked who it serves (`OpenAIEngine`'s identity check), so a chat never goes to a server
  holding some other model.

Prompts: an export whose tokenizer has a chat template (a fine-tuned export) is prompted with the
whole conversation through that template (`mode = chat`); one without is continued from the last
user message alone, as a document start (`mode = completion`, eos then the text, the way the
factory's evals prompt a base model). The prompt keeps its last ids when it is longer than the
context leaves room for.
"""

from __future__ import annotations

import collections
import json
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Iterator

from factory.infer.engine import EngineConfig
from factory.infer.export import ExportRef


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 128
    seed: int = 0

    def as_dict(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens, "seed": self.seed}


@dataclass
class Generation:
    """What one streamed generation produced, filled in as it runs."""

    mode: str
    prompt_tokens: int
    text: str = ""
    tokens: int = 0
    finish_reason: str = "length"
    first_token_s: float | None = None
    started: float = field(default_factory=time.perf_counter)


class _Model:
    def __init__(self, export: ExportRef):
        from factory.infer.engine import TransformersEngine

        self.engine = TransformersEngine(export, EngineConfig(kind="transformers"))
        self.lock = threading.Lock()


def chat_mode(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def prompt_ids(tokenizer, messages: list[dict]) -> tuple[list[int], str]:
    """The ids to send for `messages` and the mode (module docstring)."""
    if chat_mode(tokenizer):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"], "chat"
    last = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    return [tokenizer.eos_token_id, *tokenizer(last, add_special_tokens=False)["input_ids"]], "completion"


def _begin(engine, messages: list[dict], sampling: Sampling,
           out: Generation | None) -> tuple[list[int], int, Generation]:
    """The prompt's ids (its last ones, leaving the answer room: `Engine.fit`), the tokens to
    generate, and the Generation to fill in."""
    new = min(sampling.max_tokens, engine.max_len - 1)
    ids, mode = prompt_ids(engine.tokenizer, messages)
    ids = engine.fit(ids, new)
    gen = out if out is not None else Generation(mode, len(ids))
    gen.mode, gen.prompt_tokens = mode, len(ids)
    return ids, new, gen


class LocalBackend:
    """In-process generation (module docstring)."""

    name = label = "local"  # label: what podium.conversations.backend records

    def __init__(self, max_models: int = 4):
        self.max_models = max_models
        self._models: collections.OrderedDict[str, _Model] = collections.OrderedDict()
        self._lock = threading.Lock()

    def _model(self, export: ExportRef) -> _Model:
        key = f"{export.path}|{export.sha256}"
        with self._lock:
            if key in self._models:
                self._models.move_to_end(key)
            else:
                while len(self._models) >= self.max_models:
                    self._models.popitem(last=False)
                self._models[key] = _Model(export)
            return self._models[key]

    def tokenizer(self, export: ExportRef):
        return self._model(export).engine.tokenizer

    def stream(self, export: ExportRef, messages: list[dict], sampling: Sampling, out: Generation | None = None
               ) -> Iterator[str]:
        import torch
        from transformers import TextIteratorStreamer

        model = self._model(export)
        engine = model.engine
        ids, new, gen = _begin(engine, messages, sampling, out)
        streamer = TextIteratorStreamer(engine.tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=300)
        result: dict = {}
        greedy = sampling.temperature == 0

        def run():
            try:
                torch.manual_seed(sampling.seed)
                result["out"] = engine.model.generate(
                    torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                    max_new_tokens=new, do_sample=not greedy,
                    temperature=None if greedy else sampling.temperature, top_p=None if greedy else sampling.top_p,
                    top_k=None, pad_token_id=engine.tokenizer.pad_token_id, eos_token_id=engine.tokenizer.eos_token_id,
                    streamer=streamer)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
                result["error"] = exc
                streamer.end()

        with model.lock:
            worker = threading.Thread(target=run, daemon=True, name="podium-generate")
            worker.start()
            for piece in streamer:
                if piece:
                    if gen.first_token_s is None:
                        gen.first_token_s = time.perf_counter() - gen.started
                    gen.text += piece
                    yield piece
            worker.join()
        if "error" in result:
            raise result["error"]
        new = result["out"][0, len(ids):].tolist()
        eos = engine.tokenizer.eos_token_id
        gen.tokens = new.index(eos) + 1 if eos in new else len(new)
        gen.finish_reason = "stop" if eos in new else "length"


class OpenAIBackend:
    """Generation streamed from a vLLM OpenAI-compatible server (module docstring)."""

    name = "openai"

    def __init__(self, config: EngineConfig):
        self.config = config
        self._engines: dict[str, object] = {}
        self._lock = threading.Lock()

    def _engine(self, export: ExportRef):
        from factory.infer.openai_engine import OpenAIEngine

        with self._lock:
            if export.export_id not in self._engines:
                self._engines[export.export_id] = OpenAIEngine(export, self.config)  # checks who the server serves
            return self._engines[export.export_id]

    def tokenizer(self, export: ExportRef):
        return self._engine(export).tokenizer

    def stream(self, export: ExportRef, messages: list[dict], sampling: Sampling, out: Generation | None = None
               ) -> Iterator[str]:
        from factory.infer.openai_engine import NEUTRAL, EndpointError

        engine = self._engine(export)
        ids, new, gen = _begin(engine, messages, sampling, out)
        body = {"model": engine.model, **NEUTRAL, "prompt": ids, "max_tokens": new,
                "temperature": sampling.temperature, "top_p": sampling.top_p, "seed": sampling.seed, "stream": True,
                "stream_options": {"include_usage": True}}
        url = f"{engine.base}/completions"
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=engine.headers, method="POST")
        try:
            response = urllib.request.urlopen(request, timeout=self.config.timeout_s)
        except OSError as exc:
            raise EndpointError(f"inference endpoint {url}: {exc}") from None
        with response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line.removeprefix("data:").strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    gen.tokens = int(chunk["usage"].get("completion_tokens") or gen.tokens)
                for choice in chunk.get("choices") or []:
                    piece = choice.get("text") or ""
                    if choice.get("finish_reason"):
                        gen.finish_reason = choice["finish_reason"]
                    if piece:
                        if gen.first_token_s is None:
                            gen.first_token_s = time.perf_counter() - gen.started
                        gen.text += piece
                        yield piece

    @property
    def label(self) -> str:  # what podium.conversations.backend records: the endpoint's URL
        return self.config.endpoint
