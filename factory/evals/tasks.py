"""The eval task registry: a task is a config model plus a function from (config, context) to scores.

Design (nanochat's `TaskMixture`, datatrove's one protocol per block): every task has a frozen
pydantic config whose `task` field names it, and a function `run(config, ctx) -> TaskResult`.
`register` puts both in `TASKS`; a suite is a list of such configs, validated through the
registry, so adding a task is one module with one decorator. A task returns metrics (value, n,
stderr), per-item samples (what was asked, what came back, the verdict — `evals.samples`) and the
versions it read (held-out snapshots, the HumanEval file), which become lineage.

A task that cannot run raises; it never returns a made-up score (a failed eval is not a 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from factory.infer.engine import Engine
    from factory.infer.export import ExportRef
    from factory.lake import Lake
    from factory.sandbox import Sandbox


class TaskConfig(BaseModel):
    """Base of every task's config; `task` is the registry key, `name` labels the results."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: str
    name: str = Field("", description="Result label (default: the task name); lets a suite run a task twice.")

    @property
    def label(self) -> str:
        return self.name or self.task


@dataclass(frozen=True)
class Metric:
    metric: str
    value: float
    n: int
    stderr: float | None = None


@dataclass
class TaskResult:
    metrics: list[Metric]
    samples: list[dict[str, Any]] = field(default_factory=list)  # item, prompt, completion, outcome, score
    upstream: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class TaskContext:
    """What a task may use. `sandbox()` starts the pool on first use (only code tasks need it)."""

    lake: "Lake"
    export: "ExportRef"
    engine: "Engine"
    sandbox: Callable[[], "Sandbox"]
    log: Callable[[str], None] = print

    @property
    def mix_version(self) -> str:
        return self.export.mix_version


TASKS: dict[str, tuple[type[TaskConfig], Callable[[Any, TaskContext], TaskResult]]] = {}


def register(config_cls: type[TaskConfig]):
    """Register `run(config, ctx)` for the task named by `config_cls`'s `task` default."""
    key = config_cls.model_fields["task"].default

    def wrap(fn):
        if key in TASKS:
            raise ValueError(f"eval task {key!r} is registered twice")
        TASKS[key] = (config_cls, fn)
        return fn

    return wrap


BUILTIN = ("bpb", "completion", "humaneval", "repo_tasks")  # the modules of factory/evals that register tasks


def builtin_tasks() -> dict:
    """`TASKS` with the built-in tasks registered: their modules are imported on first lookup, not
    with the package, because they bring the inference engine (torch) with them."""
    import importlib

    for module in BUILTIN:
        importlib.import_module(f"factory.evals.{module}")
    return TASKS


def parse_task(raw: TaskConfig | dict) -> TaskConfig:
    """A task config from a dict (`{"task": "bpb", ...}`) or an instance; errors name the task."""
    if isinstance(raw, TaskConfig):
        return raw
    builtin_tasks()
    key = raw.get("task")
    if key not in TASKS:
        raise ValueError(f"unknown eval task {key!r}; registered: {sorted(TASKS)}")
    return TASKS[key][0].model_validate(raw)


def run_task(config: TaskConfig, ctx: TaskContext) -> TaskResult:
    return builtin_tasks()[config.task][1](config, ctx)


def mean_stderr(values: list[float]) -> tuple[float, float | None]:
    """Mean and its standard error (None for fewer than two values)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values to average")
    mean = sum(values) / n
    if n < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)
