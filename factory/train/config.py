"""Typed configs of the training engine: model, optimizer, schedule, guards, checkpoints.

Every field says its unit. Values that follow from others (head size, FFN width, gradient
accumulation, steps from tokens) are computed, never asked for. Validation happens when a config
is built, so a bad experiment fails before any process starts, with the field path in the message.
Every float must be finite (`allow_inf_nan=False`): `lr=inf` or `grad_clip=nan` would otherwise
pass `gt=0` (inf does; nan fails it with a misleading "greater than 0") and surface as a NaN loss
steps into the run.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

BlockKind = Literal["attention"]  # the seam for variants (e.g. "linear_attention") in model.BLOCKS


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ModelConfig(_Frozen):
    """A decoder-only transformer: RMSNorm, RoPE, SwiGLU, grouped-query attention."""

    vocab_size: int | None = Field(None, gt=0, description="Tokens; None = the mix's tokenizer vocabulary.")
    d_model: int = Field(gt=0, description="Residual width.")
    n_layers: int = Field(gt=0)
    n_heads: int = Field(gt=0, description="Query heads; must divide d_model.")
    n_kv_heads: int | None = Field(None, gt=0, description="Key/value heads (GQA); None = n_heads; must divide n_heads.")
    ffn_hidden: int | None = Field(None, gt=0, description="SwiGLU hidden width; None = 8/3 d_model rounded up to 64.")
    max_seq_len: int = Field(gt=0, description="Longest sequence RoPE is precomputed for (tokens).")
    rope_theta: float = Field(10_000.0, gt=0)
    norm_eps: float = Field(1e-5, gt=0)
    tie_embeddings: bool = Field(True, description="Share the input embedding with the LM head.")
    init_std: float = Field(0.02, gt=0, description="Std of the normal init (at mup_base_width when set).")
    mup_base_width: int | None = Field(None, gt=0, description="muP: the width hyperparameters were tuned at; None = standard parametrization.")
    layer_pattern: list[BlockKind] = Field(default_factory=lambda: ["attention"], description="Block kinds, cycled over layers.")

    @model_validator(mode="after")
    def _shapes(self) -> "ModelConfig":
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads={self.n_heads} must divide d_model={self.d_model}")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_kv_heads={self.kv_heads} must divide n_heads={self.n_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head size d_model/n_heads={self.head_dim} must be even for RoPE")
        return self

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ffn_dim(self) -> int:
        return self.ffn_hidden or 64 * -(-int(8 * self.d_model / 3) // 64)

    @property
    def width_multiplier(self) -> float:
        """d_model / mup_base_width (1.0 without muP)."""
        return self.d_model / self.mup_base_width if self.mup_base_width else 1.0


class OptimizerConfig(_Frozen):
    """AdamW."""

    lr: float = Field(gt=0, description="Peak learning rate.")
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.1, ge=0, description="Decoupled decay on matrices (not norms or embeddings).")
    grad_clip: float | None = Field(1.0, gt=0, description="Max global gradient norm; None = no clipping.")

    @model_validator(mode="after")
    def _betas(self) -> "OptimizerConfig":
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas={self.betas}: each must be in [0, 1) (Adam's moment decay rates)")
        return self


class ScheduleConfig(_Frozen):
    """Learning-rate schedule over the run's steps."""

    kind: Literal["cosine", "wsd", "constant"] = "cosine"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final lr / peak lr (cosine, wsd).")
    decay_fraction: float = Field(0.2, gt=0, le=1, description="wsd: share of steps in the final decay.")


class GuardConfig(_Frozen):
    """Numerics guards."""

    nonfinite: Literal["skip", "error"] = Field("skip", description="NaN/Inf loss or gradients: skip the step and record it, or stop.")
    spike_window: int = Field(50, ge=5, description="Steps in the rolling loss / grad-norm statistics.")
    spike_sigma: float = Field(6.0, gt=0, description="A value this many std above the rolling mean is a spike.")
    spike_action: Literal["warn", "skip", "rollback"] = Field("warn", description="rollback = reload the last good checkpoint and skip the offending batch.")
    max_consecutive_skips: int = Field(10, ge=1, description="More skipped steps in a row than this stops the run.")


class ReplicaCheckConfig(_Frozen):
    """Cross-replica verification (data-parallel runs)."""

    hash_every: int = Field(50, ge=1, description="Steps between parameter-hash comparisons across replicas.")
    redundant_dry_run: bool = Field(False, description="Replicas process the same micro-batch and compare gradient hashes before the all-reduce.")


class CheckpointConfig(_Frozen):
    every: int = Field(50, ge=1, description="Steps between checkpoints (the last step always saves).")
    keep_last: int = Field(3, ge=1, description="Checkpoints kept; older ones are deleted after a newer one is valid.")


class ParallelConfig(_Frozen):
    nproc_per_node: int = Field(1, ge=1, description="Processes (data-parallel ranks) on this node.")
    nnodes: int = Field(1, ge=1)
    backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="auto = nccl with CUDA, else gloo.")
    fsdp: bool = Field(False, description="FSDP2 sharding (GPU only) instead of DDP.")

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


# the tracking backends, spelt once: factory.train.trackers.BACKENDS builds each, the deploy profile
# and TrackerResource accept these names
TrackerBackend = Literal["mlflow", "neptune", "iceberg"]


class TrackerConfig(_Frozen):
    backends: list[TrackerBackend] = Field(default_factory=lambda: ["mlflow", "iceberg"])
    neptune_project: str = Field("factory/offline", description="Neptune project name (offline mode).")
    log_every: int = Field(1, ge=1, description="Steps between metric rows.")
