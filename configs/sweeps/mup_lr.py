"""Goal: does the best learning rate stay put as the model widens under muP, and move without it?

A grid: learning rate (7 values, factor 2 apart) x width (d_model 64 / 128 / 256; heads 2 / 4 / 8 at
a fixed head size of 32, 2 layers) x parametrization (`model.mup_base_width` None = standard, 64 =
muP tuned at the narrowest width): 42 cells of 40 steps x 8 sequences of 256 tokens on the default
mix, each scored once at its end on held-out bits per byte (`heldout` suite, `bpb/all`). At width
64 the two parametrizations are the same model (width multiplier 1), so those cells must agree
exactly: a built-in control.

    python bench/mup_bench.py --run          # train + score every cell, then the table and the plot
    factory sweep run mup_lr                 # or: the CLI (vLLM scores each cell; slower), or `sweep launch`
    factory sweep results mup_lr --write     # sweeps.results + the plot (one panel per parametrization)

Read the plot's two panels (a star marks each line's best lr): with muP the minima line up over
the widths; with the standard parametrization the wider models' minima sit at smaller learning
rates. `bench/mup_bench.py` prints the best lr per width and parametrization and its spread over
widths, log2(max best lr / min best lr), and how far apart the width curves lie at equal lr.
On the demo lake the standard optimum moved down with width (about 6e-3 at 64 to 2e-3 at 256) and
muP's curves lay 4x closer together, but muP's own optima were not resolved: at 40 steps its
width-256 curve is flat within the noise (bumps of ~0.04 bpb), so more steps and seeds are next.
Sized for two CPU cores: a cell takes 30 s (d_model 64) to 1.5 min (256) on an idle core, the 42
cells about 40 minutes on shared cores (measured: 30 cells in 31 min, then 12 more in 9 min).
"""

from __future__ import annotations

from factory.experiments import ExperimentConfig
from factory.experiments.sweep import SweepBudget, SweepConfig
from factory.train.config import CheckpointConfig, ModelConfig, OptimizerConfig, ScheduleConfig, TrackerConfig

HEAD_DIM = 32  # widths grow by adding heads at this size (what the model's muP assumes)
WIDTHS = (64, 128, 256)
BASE_WIDTH = 64  # muP's base: the narrowest width, where both parametrizations coincide
LRS = [1.25e-3, 2.5e-3, 5e-3, 1e-2, 2e-2, 4e-2, 8e-2]
STEPS = 40


def width(d_model: int) -> ModelConfig:
    return ModelConfig(d_model=d_model, n_layers=2, n_heads=d_model // HEAD_DIM, max_seq_len=256)


def proxy() -> ExperimentConfig:
    """A short run of a tiny model, its width and parametrization set by the sweep."""
    return ExperimentConfig(
        name="mup_lr",
        description="muP transfer: a tiny model's held-out loss against learning rate, width and parametrization.",
        model=width(BASE_WIDTH),
        mix="default", follow_mix=False,
        global_batch=8, micro_batch=8, steps=STEPS,
        optimizer=OptimizerConfig(lr=1e-2, weight_decay=0.1),
        schedule=ScheduleConfig(kind="cosine", warmup_steps=STEPS // 10),
        checkpoint=CheckpointConfig(every=STEPS, keep_last=1),
        eval_every=STEPS, eval_suite="heldout",
        tracker=TrackerConfig(backends=["iceberg"], log_every=10),
    )


def mup_lr() -> SweepConfig:
    # params order = the plot's layout: lr on the x axis, one line per width, one panel per
    # parametrization; `model.mup_base_width` comes after `model`, so it is set on the chosen width
    return SweepConfig(
        name="mup_lr",
        description="Learning rate x width (64/128/256) x parametrization (standard / muP at base width 64).",
        base=proxy(),
        search="grid",
        params={"optimizer.lr": LRS, "model": [width(d) for d in WIDTHS], "model.mup_base_width": [None, BASE_WIDTH]},
        budget=SweepBudget(max_runs=48, max_tokens=6_000_000),
    )
