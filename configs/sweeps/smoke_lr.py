"""Goal: which learning rate and batch size does the smoke model want at a fixed token budget?

A 2 x 2 grid around the smoke experiment, each cell 40 steps and evaluated once at its end on
held-out bits per byte. Launch: `factory sweep launch smoke_lr`; compare: `factory sweep results smoke_lr`.
"""

from __future__ import annotations

from configs.experiments.smoke import smoke
from factory.experiments.sweep import SweepBudget, SweepConfig
from factory.train.config import CheckpointConfig


def smoke_lr() -> SweepConfig:
    return SweepConfig(
        name="smoke_lr",
        description="Learning rate x batch size for the smoke model, 40 steps per cell.",
        base=smoke().derive(steps=40, checkpoint=CheckpointConfig(every=40, keep_last=1), eval_every=40,
                            eval_suite="heldout"),
        search="grid",
        params={"optimizer.lr": [1e-3, 3e-3], "global_batch": [8, 16]},
        budget=SweepBudget(max_runs=4, max_tokens=1_000_000),
    )
