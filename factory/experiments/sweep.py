"""Sweeps: a base experiment plus a search over some of its fields, expanded into cells.

A sweep file in `configs/sweeps/` returns a `SweepConfig`:

    SweepConfig(name="smoke_lr", base=smoke().derive(steps=30), search="grid",
                params={"optimizer.lr": [1e-3, 3e-3], "global_batch": [8, 16]})

`params` maps a field path of the base's class to a list of values (grid: the product; random:
a seeded choice per cell), to `Uniform`/`LogUniform` (random only), or — for `mix_weights` — to
`Dirichlet` over the mix's tables (the auto-mixer's proxies). A value may be a whole sub-config
(`"model": [ModelConfig(...), ...]`); a later, deeper path (`model.mup_base_width`) then sets a
field of the chosen one. Every cell is the base with its values, validated as the base's own
class, so exactly like a hand-written config; its run name is the sweep name plus the cell's
identity hash (`Cell.run`), so a cell is reproducible from its config and an unchanged cell is
never run twice.

The base is a pre-training `ExperimentConfig` (cells are `training_run` partitions) or an
`RLConfig` (cells are `rl_run` partitions). An RL cell's config is *named* its run name
`<sweep>-<hash8>` — an RL run's partition, checkpoints and rollouts are keyed by its config's
name — and the hash leaves out the name and the execution choices (`RLConfig.identity_hash`).

What ranks the cells (`metric`, and `better`: which way): an eval metric of `evals.results`
(`task/metric`, default `bpb/all`, lower is better), or for an RL sweep `rollouts/reward`, its
default: the mean reward of the last 20 % of the run's steps in `rl.rollouts` (higher is better).

The budget bounds what a launch may start: `max_runs` is checked when the sweep expands,
`max_tokens` (all cells together) when the cells are queued: tokens trained for training cells,
and for RL cells the rollout tokens they may sample at most (steps x prompts x group x max_tokens).

Everything a sweep can check on its own it checks when it is built, naming the parameter: a
distribution's bounds (`params.optimizer.lr: LogUniform low=0.01 > high=0.001`, a NaN bound, a
LogUniform reaching 0), and every listed value against its field's own type and constraints
(`params.optimizer.lr[1]: Input should be a finite number`). A distribution checks its bounds
only inside a sweep, where its path is known: built alone it cannot name the field it serves.
"""

from __future__ import annotations

import itertools
import math
from typing import Annotated, Any, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from pydantic.fields import FieldInfo

from factory.experiments.spec import ExperimentConfig, ExperimentError, validation_message
from factory.posttrain.rl.config import RLConfig

REWARD_METRIC = "rollouts/reward"  # an RL sweep's default metric: mean reward of its last steps (rl.rollouts)
WEIGHT_DECIMALS = 4  # sampled mix weights are rounded so the identity hash and the card stay readable


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _bounds(name: str, low: float, high: float) -> str | None:
    for side, value in (("low", low), ("high", high)):
        if not math.isfinite(value):
            return f"{name} {side}={value} is not a finite number"
    if low >= high:
        return f"{name} low={low:g} {'>' if low > high else '='} high={high:g} (low must be below high)"
    return None


class Uniform(_Frozen):
    """A float drawn uniformly from [low, high] (random search)."""

    kind: Literal["uniform"] = "uniform"
    low: float
    high: float

    def problem(self) -> str | None:
        return _bounds("Uniform", self.low, self.high)

    def sample(self, rng: np.random.Generator) -> float:
        return float(f"{rng.uniform(self.low, self.high):.4g}")


class LogUniform(_Frozen):
    """A float whose log is uniform on [log low, log high]: learning rates (random search)."""

    kind: Literal["log_uniform"] = "log_uniform"
    low: float
    high: float

    def problem(self) -> str | None:
        if self.low <= 0:  # before the order: log(low) is what fails
            return f"LogUniform low={self.low:g} must be > 0 (its log is taken)"
        return _bounds("LogUniform", self.low, self.high)

    def sample(self, rng: np.random.Generator) -> float:
        return float(f"{math.exp(rng.uniform(math.log(self.low), math.log(self.high))):.4g}")


class Dirichlet(_Frozen):
    """Mix weights over `tables` ~ Dirichlet(alpha * prior), as RegMix samples its proxy mixes."""

    kind: Literal["dirichlet"] = "dirichlet"
    tables: tuple[str, ...] = Field(min_length=2, description="The mix's tables, in a fixed order.")
    alpha: float = Field(1.0, description="Concentration (> 0): small = corners of the simplex, large = near "
                                          "the prior.")
    prior: tuple[float, ...] | None = Field(None, description="Centre of the draws (default: uniform over tables).")

    def problem(self) -> str | None:
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            return f"Dirichlet alpha={self.alpha} must be a finite number > 0"
        if self.prior is not None and (len(self.prior) != len(self.tables)
                                       or not all(math.isfinite(p) and p > 0 for p in self.prior)):
            return f"Dirichlet prior needs one finite positive value per table ({len(self.tables)}), got {self.prior}"
        return None

    def sample(self, rng: np.random.Generator) -> dict[str, float]:
        prior = np.array(self.prior or [1.0] * len(self.tables), dtype=np.float64)
        w = rng.dirichlet(self.alpha * len(self.tables) * prior / prior.sum())
        return round_weights(dict(zip(self.tables, w.tolist())))


def round_weights(weights: dict[str, float]) -> dict[str, float]:
    """Weights rounded to WEIGHT_DECIMALS that still sum to exactly 1 (the remainder goes to the largest)."""
    q = 10 ** WEIGHT_DECIMALS
    units = {t: max(1, round(w * q)) for t, w in weights.items()}  # keep every table in the mix
    top = max(units, key=units.get)
    units[top] += q - sum(units.values())
    return {t: u / q for t, u in units.items()}


Distribution = Union[Uniform, LogUniform, Dirichlet]


class SweepBudget(_Frozen):
    max_runs: int = Field(16, ge=1, description="Cells a launch may start at most.")
    max_tokens: int | None = Field(None, gt=0, description="Tokens of all cells together at most: trained "
                                   "(training cells), or rollout tokens sampled at most (RL cells).")


class SweepConfig(_Frozen):
    """A base experiment (pre-training or RL) and a search over some of its fields."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$", description="Sweep name; its cells' runs are <name>-<hash8>.")
    description: str = Field("", description="The question the sweep answers (shown in the UI and the summary).")
    base: Union[ExperimentConfig, RLConfig]
    search: Literal["grid", "random"] = "grid"
    params: dict[str, Union[list[Any], Distribution]] = Field(min_length=1, description="Field path -> values or distribution.")
    samples: int | None = Field(None, ge=1, description="Cells drawn by random search.")
    seed: int = Field(0, description="Seeds random search.")
    budget: SweepBudget = SweepBudget()
    metric: str = Field(None, description="What ranks the cells: task/metric of evals.results, or rollouts/reward "
                                          "(RL: mean reward of the last 20 % of steps). Default: bpb/all, RL rollouts/reward.")
    better: Literal["lower", "higher"] = Field(None, description="Which way the metric is better. Default: higher for "
                                                                 "rollouts/reward, lower for eval metrics (bpb, loss).")
    cron: str | None = Field(None, description="Launch the sweep on this cron schedule (the schedule starts stopped).")

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        """The metric and its direction follow from the base when not given (an RL base has a reward)."""
        if not isinstance(data, dict):
            return data
        base = data.get("base")
        rl = isinstance(base, RLConfig) or (isinstance(base, dict) and "reward" in base)
        metric = data.get("metric") or (REWARD_METRIC if rl else "bpb/all")
        return {**data, "metric": metric, "better": data.get("better") or ("higher" if metric == REWARD_METRIC else "lower")}

    @property
    def is_rl(self) -> bool:
        return isinstance(self.base, RLConfig)

    @model_validator(mode="after")
    def _check(self) -> "SweepConfig":
        for path, values in self.params.items():
            field = _check_path(type(self.base), path)
            if isinstance(values, list) and not values:
                raise ValueError(f"params.{path}: no values")
            if self.search == "grid" and not isinstance(values, list):
                raise ValueError(f"params.{path}: grid search needs a list of values, not {type(values).__name__}")
            if isinstance(values, Dirichlet) != (path == "mix_weights") and not isinstance(values, list):
                raise ValueError(f"params.{path}: Dirichlet is for mix_weights, and mix_weights needs Dirichlet or a list")
            if isinstance(values, list):
                _check_values(path, field, values)
            elif problem := values.problem():
                raise ValueError(f"params.{path}: {problem}")
        if self.search == "random" and self.samples is None:
            raise ValueError("random search needs samples")
        if self.search == "grid" and self.samples is not None:
            raise ValueError("samples is for random search; a grid has one cell per combination")
        if "/" not in self.metric:
            raise ValueError(f"metric {self.metric!r} must be task/metric, e.g. bpb/all")
        if self.metric == REWARD_METRIC and not self.is_rl:
            raise ValueError(f"metric {REWARD_METRIC} ranks RL sweeps by rl.rollouts; a training sweep ranks by an eval "
                             "metric (task/metric, e.g. bpb/all)")
        return self


def _check_path(cls: type[BaseModel], path: str) -> FieldInfo:
    """The field of `cls` that `path` names (its type and constraints); an error when it names none
    (`name` is the sweep's to set)."""
    fields = cls.model_fields
    head, *rest = path.split(".")
    if head not in fields or head == "name":
        raise ValueError(f"params: {path!r} is not a field of {cls.__name__}")
    field = fields[head]
    for part in rest:
        sub = getattr(field.annotation, "model_fields", None)
        if not sub or part not in sub:
            raise ValueError(f"params: {path!r} is not a field of {cls.__name__} ({part!r} unknown)")
        field = sub[part]
    return field


def _check_values(path: str, field: FieldInfo, values: list) -> None:
    """Each value against its field's own type and constraints (finite floats included); checks
    between fields (batch divisible by micro-batch) wait for the cells, where the others are known."""
    annotated = Annotated[field.annotation, field]
    is_model = isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
    adapter = TypeAdapter(annotated) if is_model else TypeAdapter(annotated, config=ConfigDict(allow_inf_nan=False))
    for i, value in enumerate(values):
        try:
            adapter.validate_python(value)
        except ValidationError as e:
            raise ValueError(f"params.{path}[{i}]: {validation_message(e)}") from None


class Cell(_Frozen):
    """One point of a sweep: its index, the values it sets, the experiment it runs (training or RL)."""

    sweep: str
    index: int
    params: dict[str, Any]
    experiment: Union[ExperimentConfig, RLConfig]

    @property
    def run(self) -> str:
        """`<sweep>-<hash8>`; an RL cell's config already carries it as its name."""
        return self.experiment.name if isinstance(self.experiment, RLConfig) else run_name(self.experiment)


def run_name(experiment: ExperimentConfig) -> str:
    """`<name>-<hash8>`: every identity gets its own run, checkpoints and lineage (as Marin names
    its output paths), so editing an experiment never resumes another config's checkpoints."""
    return f"{experiment.name}-{experiment.identity_hash()[:8]}"


def _cell_config(cls: type, data: dict, sweep: str) -> ExperimentConfig | RLConfig:
    """`data` validated as `cls`; an RL cell is then renamed to its run name (its hash ignores the name)."""
    config = cls.model_validate(data)
    if cls is RLConfig:
        config = RLConfig.model_validate({**data, "name": f"{sweep}-{config.identity_hash()[:8]}"})
    return config


def _set(data: dict, path: str, value: Any) -> dict:
    head, *rest = path.split(".")
    if not rest:
        return {**data, head: value}
    return {**data, head: _set(dict(data.get(head) or {}), ".".join(rest), value)}


def expand(sweep: SweepConfig) -> list[Cell]:
    """The sweep's cells in a fixed order (grid: product in `params` order; random: seeded draws)."""
    paths = list(sweep.params)
    if sweep.search == "grid":
        points = [dict(zip(paths, combo)) for combo in itertools.product(*(sweep.params[p] for p in paths))]
    else:
        rng = np.random.default_rng(sweep.seed)
        points = [{p: (v.sample(rng) if not isinstance(v, list) else v[int(rng.integers(len(v)))])
                   for p, v in sweep.params.items()} for _ in range(sweep.samples)]
    if len(points) > sweep.budget.max_runs:
        raise ExperimentError(f"sweep {sweep.name}: {len(points)} cells exceed budget.max_runs={sweep.budget.max_runs}")
    base = sweep.base.model_dump()
    cells, seen = [], {}
    for i, point in enumerate(points):
        # a whole sub-config as a value (`"model": [ModelConfig(...), ...]`) travels as its JSON fields,
        # so a cell's params serialize (run source, sweeps.results) and a deeper path can set into it
        point = {p: v.model_dump(mode="json") if isinstance(v, BaseModel) else v for p, v in point.items()}
        data = {**base, "name": sweep.name}
        for path, value in point.items():
            data = _set(data, path, value)
        try:
            experiment = _cell_config(type(sweep.base), data, sweep.name)
        except ValidationError as e:
            raise ExperimentError(f"sweep {sweep.name}: cell {i} {point}: {validation_message(e)}") from None
        cell = Cell(sweep=sweep.name, index=i, params=point, experiment=experiment)
        if cell.run in seen:
            raise ExperimentError(f"sweep {sweep.name}: cells {seen[cell.run]} and {i} are the same experiment {point}")
        seen[cell.run] = i
        cells.append(cell)
    return cells


def check_token_budget(sweep: SweepConfig, tokens: list[int]) -> None:
    """`tokens`: per cell, trained (training) or rollout tokens sampled at most (RL, `rollout_tokens`)."""
    if sweep.budget.max_tokens is not None and sum(tokens) > sweep.budget.max_tokens:
        what = "may sample up to" if sweep.is_rl else "train"
        raise ExperimentError(f"sweep {sweep.name}: its cells {what} {sum(tokens):,} tokens, over "
                              f"budget.max_tokens={sweep.budget.max_tokens:,}")


def rollout_tokens(config: RLConfig) -> int:
    """The completion tokens an RL run samples at most: steps x prompts x group x max_tokens."""
    r = config.rollout
    return config.steps * r.prompts_per_step * r.group_size * r.max_tokens
