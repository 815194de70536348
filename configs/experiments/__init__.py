"""Experiments as code: each function returns a validated `ExperimentConfig`; a variant calls its
base and changes a few fields (`base().derive(...)`, validated again). Launch one with
`dagster asset materialize -m definitions --select training_run --partition <name>` or
`python -m factory.train --experiment <name>`."""

from __future__ import annotations

from collections.abc import Callable

from factory.experiments import ExperimentConfig, ExperimentError
from factory.train.config import CheckpointConfig, ModelConfig, OptimizerConfig, ParallelConfig, ScheduleConfig


def smoke() -> ExperimentConfig:
    """Goal: prove the whole path (mix -> training -> checkpoints -> metrics) on one CPU in about
    a minute, with a loss that clearly falls. 1.3 M parameters at d=128 on the default mix."""
    return ExperimentConfig(
        name="smoke",
        description="A tiny model on the default mix: does everything run end to end, and does the loss fall?",
        model=ModelConfig(d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=256),
        mix="default",
        global_batch=16,
        micro_batch=8,
        steps=120,
        optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.1),
        schedule=ScheduleConfig(kind="cosine", warmup_steps=10),
        checkpoint=CheckpointConfig(every=40, keep_last=3),
        eval_every=40,
    )


def smoke_ddp() -> ExperimentConfig:
    """The smoke run on two gloo ranks (torchrun --nproc-per-node 2)."""
    return smoke().derive(name="smoke_ddp", parallel=ParallelConfig(nproc_per_node=2))


EXPERIMENTS: dict[str, Callable[[], ExperimentConfig]] = {"smoke": smoke, "smoke_ddp": smoke_ddp}


def experiment(name: str) -> ExperimentConfig:
    if name not in EXPERIMENTS:
        raise ExperimentError(f"no experiment {name!r} in configs/experiments (have: {', '.join(sorted(EXPERIMENTS))})")
    return EXPERIMENTS[name]()
