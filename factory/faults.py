"""Fault injection: the faults a test asks a training or export process to suffer, as one object.

Tests prove recovery paths (resume after SIGKILL, a skipped NaN step, a rollback after a spike, a
replica that drifts, an export that no longer matches its checkpoint) by injecting the fault into a
real run. They reach a process started by torchrun or Dagster Pipes only through its environment,
so the request travels as JSON in `FACTORY_FAULTS`; `factory.settings.faults()` is the one place
that reads and validates it into a `Faults`. Code that can fail on purpose takes a `Faults` as an
argument and defaults to `NO_FAULTS`, which does nothing: a library call never picks up a fault
from the environment, only an entry point (`python -m factory.train`, an export) hands one down.

The schema is closed (`extra="forbid"`): a misspelt key (`crash_at_step`) fails loudly instead of
silently injecting nothing and letting a recovery test pass without exercising recovery.

| key | effect |
|---|---|
| `kill_at_step` | the trainer SIGKILLs itself right after that step (checkpoint included, if due) |
| `nan_at_steps` | those steps' loss is NaN (the guards skip or stop) |
| `spike_at_steps` | those steps' loss is x1000 (a spike for the guards) |
| `corrupt` | `{"step", "rank", "param"}`: after that step, one rank adds 1e-3 to one parameter |
| `corrupt_export` | an export scales one weight matrix by 1.01 (the parity check must catch it) |
| `corrupt_sync` | `{"version", "tensor", "mode"}`: the RL weight sync to that policy version perturbs (+1e-3) or skips one tensor |
| `checkpoint_stall_s` | each checkpoint file waits that long between its temp file's fsync and its rename (a slow disk) |
"""

from __future__ import annotations

import os
import signal
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Corruption(BaseModel):
    """Perturb `param` on `rank` after `step`: silent data corruption on one replica."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int = Field(ge=1)
    rank: int = Field(ge=0)
    param: str


class SyncCorruption(BaseModel):
    """Sabotage the RL weight sync to policy `version`: `tensor` (a Llama name) is perturbed or left out."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = Field(ge=0)
    tensor: str
    mode: Literal["perturb", "skip"] = "perturb"


class Faults(BaseModel):
    """Faults to inject; the default instance injects none."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kill_at_step: int | None = Field(None, ge=1)
    nan_at_steps: frozenset[int] = frozenset()
    spike_at_steps: frozenset[int] = frozenset()
    corrupt: Corruption | None = None
    corrupt_export: bool = False
    checkpoint_stall_s: float = Field(0.0, ge=0)
    corrupt_sync: SyncCorruption | None = None

    def loss_scale(self, step: int) -> float:
        """What the loss of optimizer step `step` (1-based) is multiplied by: 1.0 unless faulted."""
        if step in self.nan_at_steps:
            return float("nan")
        return 1e3 if step in self.spike_at_steps else 1.0

    def corrupt_replica(self, step: int, model, rank: int) -> None:
        """Perturb this rank's copy of one parameter, if asked for after `step` on `rank`."""
        spec = self.corrupt
        if spec is not None and spec.step == step and spec.rank == rank:
            import torch

            with torch.no_grad():
                dict(model.named_parameters())[spec.param].add_(1e-3)

    def checkpoint_stall(self):
        """The `save_checkpoint` hook that stalls each file's write before its rename; None (no
        hook) unless asked for."""
        if not self.checkpoint_stall_s:
            return None
        return lambda path: time.sleep(self.checkpoint_stall_s)

    def kill_after(self, step: int) -> None:
        """SIGKILL this process, if asked for after `step`: no exception, nothing may flush or
        clean up, as with an OOM kill or a lost node."""
        if self.kill_at_step == step:
            os.kill(os.getpid(), signal.SIGKILL)


NO_FAULTS = Faults()
