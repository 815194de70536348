"""Goal: which weights of the default mix's three sources give the lowest held-out loss? (RegMix)

Sixteen small proxy models (~0.6 M parameters, 60 steps each) train on Dirichlet-sampled weights
of `configs/mixes/default.yaml`'s tables; each is scored once at its end on held-out bits per
byte of every source (the `heldout` suite). `factory automix automix` then fits a
regression from weights to that loss and registers its proposal as `mix/automix@vN`.

    factory sweep launch automix      # or: factory sweep run automix  (no Dagster, sequential)
    factory automix automix
"""

from __future__ import annotations

from configs.mixes import mix_spec
from factory.experiments import ExperimentConfig
from factory.experiments.sweep import Dirichlet, SweepBudget, SweepConfig
from factory.train.config import CheckpointConfig, ModelConfig, OptimizerConfig, ScheduleConfig, TrackerConfig


def proxy() -> ExperimentConfig:
    """The proxy model: small enough that sixteen train in a few minutes on two CPU cores."""
    return ExperimentConfig(
        name="automix_proxy",
        description="A RegMix proxy: tiny model, short run, scored on held-out bits per byte.",
        model=ModelConfig(d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, max_seq_len=256),
        mix="default", follow_mix=False,
        global_batch=16, micro_batch=16, steps=60,
        optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.1),
        schedule=ScheduleConfig(kind="cosine", warmup_steps=6),
        checkpoint=CheckpointConfig(every=60, keep_last=1),
        eval_every=60, eval_suite="heldout",
        tracker=TrackerConfig(backends=["iceberg"], log_every=10),
    )


def automix() -> SweepConfig:
    return SweepConfig(
        name="automix",
        description="RegMix proxies over the default mix's sources: Dirichlet weights -> held-out bits per byte.",
        base=proxy(),
        search="random", samples=16, seed=0,
        params={"mix_weights": Dirichlet(tables=tuple(mix_spec("default").weights), alpha=1.0)},
        budget=SweepBudget(max_runs=32, max_tokens=8_000_000),
    )
