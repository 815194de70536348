"""One inference interface, two implementations: vLLM (the engine) and transformers (the reference).

Purpose: evals, the equivalence check, synthetic-data generators and `factory serve` all talk to
an `Engine` — batched generation and log-likelihood scoring over token ids — so swapping vLLM on
a GPU for vLLM's CPU build, for a shared vLLM server (`openai`: the cluster's Service, see
`openai_engine.py`), or for the transformers reference, is configuration (`EngineConfig`).

Design:
- Requests are token ids, not text: both engines then see exactly the same inputs, and a caller
  that must fit a context (a long HumanEval prompt) truncates ids, not characters (`fit`).
- `logprobs(seqs)` returns log p(token_t | tokens_<t) for t = 1..len-1 — everything bits per byte
  and multiple-choice scoring need. `top_logprobs` exists for the equivalence check.
- Stop strings cut the decoded text (vLLM does it natively; the reference cuts afterwards), so a
  HumanEval completion ends before the next top-level statement in both.
- `open_engine` keeps one engine per process and reuses it for the same export: vLLM costs ~15 s
  to import and start on CPU, and an export asset and the eval asset after it share one run.
"""

from __future__ import annotations

import abc
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from factory.health.infer import instrument_engine
from factory.deploy.config import Secret, check_endpoint
from factory.infer.export import ExportRef


class EngineConfig(BaseModel):
    """Which engine and how it runs; an execution choice, never part of an eval's identity."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["vllm", "transformers", "openai"] = Field(
        "vllm", description="vllm = the engine; transformers = reference; openai = a vLLM server at `endpoint`.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Compute dtype (fp32 on CPU).")
    kv_cache_gib: float = Field(1.0, gt=0, description="vLLM CPU KV cache (VLLM_CPU_KVCACHE_SPACE), GiB.")
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="vLLM on GPU: fraction of memory it may use.")
    max_num_seqs: int = Field(64, ge=1, description="Sequences vLLM schedules together.")
    seed: int = Field(0, description="Engine seed (sampling requests carry their own seeds too).")
    endpoint: str | None = Field(None, description="openai: the server's base URL, http(s)://host:port/v1.")
    api_key: Secret | None = Field(None, description="openai: the server's bearer token.")
    timeout_s: float = Field(300.0, gt=0, description="openai: seconds one request may take.")
    max_concurrency: int = Field(16, ge=1, description="openai: requests in flight at once.")

    @model_validator(mode="after")
    def _endpoint(self):
        check_endpoint(self.kind, self.endpoint, self.api_key)
        return self


class SamplingConfig(BaseModel):
    """How to decode one batch of prompts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(128, ge=1, description="New tokens per sample at most.")
    temperature: float = Field(0.0, ge=0, description="0 = greedy.")
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1, description="Samples per prompt.")
    seed: int = Field(0, description="Prompt i samples with seed + i: reproducible whatever the batching.")
    stop: tuple[str, ...] = Field((), description="Cut the text before the first of these.")


class Sample(BaseModel):
    model_config = ConfigDict(frozen=True)

    token_ids: list[int]
    text: str
    finish_reason: str  # stop | length


class Engine(abc.ABC):
    """Batched generation and scoring over one export."""

    name: str

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        instrument_engine(cls)  # every engine's calls timed and counted, present and future (factory.health.infer)

    def __init__(self, export: ExportRef, config: EngineConfig):
        from transformers import AutoConfig, PreTrainedTokenizerFast

        self.export, self.config = export, config
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(str(export.path))
        self.tokenizer.model_max_length = 1 << 30  # callers fit ids to the context themselves (`fit`)
        self.max_len = int(AutoConfig.from_pretrained(str(export.path)).max_position_embeddings)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def document_ids(self, text: str) -> list[int]:
        """Ids of `text` as a document start: eos (the separator training put before every
        document), then the text — how evals and generators prompt a model trained on packed docs."""
        return [self.tokenizer.eos_token_id, *self.encode(text)]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def max_score_len(self) -> int:
        """Longest sequence `logprobs` takes: vLLM needs room for one generated token."""
        return self.max_len - 1

    def fit(self, ids: list[int], room: int) -> list[int]:
        """The last `max_len - room` ids: leaves `room` positions for new tokens."""
        keep = self.max_len - room
        if keep < 1:
            raise ValueError(f"{self.export.export_id}: no room for a prompt ({room} new tokens, context {self.max_len})")
        return ids[-keep:]

    @abc.abstractmethod
    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> list[list[Sample]]:
        """`sampling.n` samples per prompt, in prompt order."""

    @abc.abstractmethod
    def logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        """log p(seq[t] | seq[:t]) for t = 1..len(seq)-1, per sequence."""

    @abc.abstractmethod
    def top_logprobs(self, sequences: list[list[int]], k: int) -> list[list[dict[int, float]]]:
        """The k most likely next tokens and their log-probs after each prefix seq[:t+1]."""

    def close(self) -> None:
        """Release the engine's memory (the process may open another)."""


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """`text` before the first stop string, and whether one was found."""
    cut = min((i for s in stops if (i := text.find(s)) >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


class TransformersEngine(Engine):
    """`LlamaForCausalLM` from the export: the reference implementation, plain and slow."""

    name = "transformers"

    def __init__(self, export: ExportRef, config: EngineConfig):
        from transformers import LlamaForCausalLM

        super().__init__(export, config)
        dtype = getattr(torch, config.dtype)
        self.model = LlamaForCausalLM.from_pretrained(str(export.path), dtype=dtype).eval()

    @torch.no_grad()
    def logits(self, ids: list[int]) -> torch.Tensor:
        """fp32 logits [len, vocab] for one sequence."""
        return self.model(torch.tensor([ids])).logits[0].float()

    def logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        out = []
        for seq in sequences:
            lp = torch.log_softmax(self.logits(seq), -1)
            out.append(lp[:-1].gather(1, torch.tensor(seq[1:])[:, None])[:, 0].tolist())
        return out

    def top_logprobs(self, sequences: list[list[int]], k: int) -> list[list[dict[int, float]]]:
        out = []
        for seq in sequences:
            values, indices = torch.log_softmax(self.logits(seq), -1).topk(k, dim=-1)
            out.append([dict(zip(i.tolist(), v.tolist())) for v, i in zip(values, indices)])
        return out

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> list[list[Sample]]:
        results = []
        for i, prompt in enumerate(prompts):
            torch.manual_seed(sampling.seed + i)
            greedy = sampling.temperature == 0
            room = min(sampling.max_tokens, self.max_len - len(prompt))
            out = self.model.generate(
                torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=room, do_sample=not greedy, num_return_sequences=sampling.n,
                temperature=None if greedy else sampling.temperature, top_p=None if greedy else sampling.top_p,
                top_k=None, pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.tokenizer.eos_token_id,
            )
            samples = []
            for row in out[:, len(prompt):].tolist():
                ids = row[:row.index(self.tokenizer.eos_token_id) + 1] if self.tokenizer.eos_token_id in row else row
                text, stopped = cut_at_stop(self.decode(ids), sampling.stop)
                ended = stopped or (ids and ids[-1] == self.tokenizer.eos_token_id)
                samples.append(Sample(token_ids=ids, text=text, finish_reason="stop" if ended else "length"))
            results.append(samples)
        return results


_OPEN: dict[str, Engine] = {}


def open_engine(export: ExportRef, config: EngineConfig = EngineConfig()) -> Engine:
    """The process's engine for `export` under `config`, started on first use and reused after;
    a different export or config closes the previous one first (one model in memory)."""
    key = f"{export.path}|{export.sha256}|{config.model_dump_json()}"
    if key not in _OPEN:
        close_engines()
        if config.kind == "vllm":
            from factory.infer.vllm_engine import VLLMEngine

            _OPEN[key] = VLLMEngine(export, config)
        elif config.kind == "openai":
            from factory.infer.openai_engine import OpenAIEngine

            _OPEN[key] = OpenAIEngine(export, config)
        else:
            _OPEN[key] = TransformersEngine(export, config)
    return _OPEN[key]


def close_engines() -> None:
    while _OPEN:
        _OPEN.popitem()[1].close()
