"""The smoke experiments: the whole path (mix -> training -> checkpoints -> evals) on one CPU.

Queue them with `factory experiment submit smoke` (or let the experiment sensor notice this
file); run one without Dagster with `python -m factory.train --experiment smoke`.

Only the final checkpoint is evaluated (`eval_every` = `steps`): `make demo` trains and scores
smoke itself, so opening the UI afterwards leaves nothing of it for the sensors to do; the
checkpoints at 40 and 80 stay evaluable by hand (`factory eval smoke@40`).
"""

from __future__ import annotations

from factory.experiments import ExperimentConfig
from factory.train.config import CheckpointConfig, ModelConfig, OptimizerConfig, ParallelConfig, ScheduleConfig


def smoke() -> ExperimentConfig:
    """Goal: prove the whole path (mix -> training -> checkpoints -> metrics) on one CPU in about
    a minute, with a loss that clearly falls. 1.84 M parameters at d=128 on the default mix, 8
    sequences of 256 tokens per step in two micro-batches (the accumulation path runs too)."""
    return ExperimentConfig(
        name="smoke",
        description="A tiny model on the default mix: does everything run end to end, and does the loss fall?",
        model=ModelConfig(d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=256),
        mix="default",
        global_batch=8,
        micro_batch=4,
        steps=120,
        optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.1),
        schedule=ScheduleConfig(kind="cosine", warmup_steps=10),
        checkpoint=CheckpointConfig(every=40, keep_last=3),
        eval_every=120,
    )


def smoke_ddp() -> ExperimentConfig:
    """The smoke run on two gloo ranks (torchrun --nproc-per-node 2)."""
    return smoke().derive(name="smoke_ddp", parallel=ParallelConfig(nproc_per_node=2))
