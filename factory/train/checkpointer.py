"""`Checkpointer`: a training run's saves — when to save, what to keep, where to resume from.

The trainer asks it three things: `resume()` once at the start (model, optimizer and RNG back to
the latest valid checkpoint, loader and guard state handed over), `due(step)` after every step
(every `checkpoint.every` steps and the last one), and `save(...)` or `rollback(...)` when it
must. It holds what a save needs and the run never changes — the plan, the lake, the ranks, the
model and optimizer, the run's names — and what each save hands to the next (the previous
checkpoint id, for lineage). The file format, manifests and pruning rules live in `checkpoint`.

Every rank calls every method: the loader states are gathered from all ranks and every rank
waits at a barrier, so no rank runs ahead of a checkpoint that may yet fail; only rank 0 writes
files and rows, and which checkpoint to resume from is rank 0's choice, broadcast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from factory.experiments.spec import Plan
from factory.faults import NO_FAULTS, Faults
from factory.lake import Lake
from factory.train import checkpoint as ckpt
from factory.train.distributed import Dist
from factory.train.report import Reporter


@dataclass(frozen=True)
class Resumed:
    """What a resumed run continues from, beyond the weights, optimizer and RNG already restored."""

    step: int
    loader: dict
    guards: dict
    checkpoint_id: str


class Checkpointer:
    def __init__(self, plan: Plan, lake: Lake, d: Dist, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 *, run: str, run_id: str, reporter: Reporter, faults: Faults = NO_FAULTS, upstream: tuple[str, ...] = ()):
        self.plan, self.lake, self.d = plan, lake, d
        self.model, self.optimizer = model, optimizer
        self.run, self.run_id, self.rep, self.faults = run, run_id, reporter, faults
        self.config = plan.experiment.checkpoint
        self.directory = ckpt.checkpoint_dir(lake.home, run)
        self.upstream = upstream  # a fine-tune's start checkpoint: its first checkpoint's lineage parent
        self.previous: str | None = None  # the newest checkpoint id: the next one's lineage parent
        self.saved: list[str] = []

    def due(self, step: int) -> bool:
        """Save after this step? Every `checkpoint.every` steps, and always after the last."""
        return step % self.config.every == 0 or step == self.plan.steps

    def resume(self) -> Resumed | None:
        """Restore the latest valid checkpoint (None: a fresh run), then make the directory."""
        ref = self._agreed_latest()
        if self.d.main:
            self.directory.mkdir(parents=True, exist_ok=True)
        if ref is None:
            return None
        payload = self._restore(ref)
        torch.set_rng_state(payload["rng"])
        self.previous = ref.checkpoint_id
        self.rep.log(f"resumed from {ref.path} (step {ref.step})")
        return Resumed(payload["step"], payload["loader"], payload["guards"], ref.checkpoint_id)

    def rollback(self, step: int) -> None:
        """Back to the last good checkpoint's weights and optimizer; the data since is not replayed."""
        ref = self._agreed_latest()
        if ref is None:
            self.rep.warn(f"step {step}: rollback requested but no checkpoint exists yet; continuing")
            return
        self._restore(ref)
        self.rep.warn(f"step {step}: rolled back to {ref.checkpoint_id}; skipping the batches since")

    def save(self, step: int, loss: float, guards: dict, loader) -> str:
        """Checkpoint after `step` (files, `train.checkpoints` row, lineage), prune; its id."""
        from factory.version import code_version

        states = self.d.all_gather_objects(loader.state_dict())
        ref_id = f"ckpt/{self.run}@{step}"
        if self.d.main:
            plan = self.plan
            payload = {"step": step, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                       "rng": torch.get_rng_state(), "loader": loader.merge_states(states), "guards": guards,
                       "plan": plan.model_dump_json(), "code_version": code_version()}
            ref = ckpt.save_checkpoint(self.directory, step, payload, run=self.run, tokens=step * plan.tokens_per_step,
                                       loss=loss if math.isfinite(loss) else None,
                                       _before_rename=self.faults.checkpoint_stall())
            mix = loader.version.version_id
            ckpt.record_checkpoint(self.lake, ref, experiment=plan.experiment.name, mix_version=mix,
                                   config_hash=plan.config_hash, eval_every=plan.experiment.eval_every,
                                   upstream=[mix, plan.tokenizer] + ([self.previous] if self.previous else list(self.upstream)),
                                   run_id=self.run_id)
            ckpt.prune(self.directory, self.config.keep_last)
            ref_id = ref.checkpoint_id
        self.d.barrier()
        self.previous = ref_id
        self.saved.append(ref_id)
        return ref_id

    def _agreed_latest(self) -> ckpt.CheckpointRef | None:
        """Rank 0's newest intact checkpoint, broadcast: every rank must load the same one."""
        found = ckpt.latest_valid(self.directory, self.rep.warn) if self.d.main and self.directory.exists() else None
        return self.d.broadcast_object(found)

    def _restore(self, ref: ckpt.CheckpointRef) -> dict:
        payload = ckpt.load_checkpoint(ref)
        self.model.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        return payload
