"""What gets queued: experiments and sweep cells as run requests, in plain data.

The experiment sensor, the sweep schedules and `factory experiment submit` / `factory sweep
launch` all turn configs into the same `QueuedRun`: the run name (`<name>-<hash8>`, also the
`training_run` partition), the validated experiment as JSON in the run config (so the run trains
exactly what was queued, even if the file changes again before it starts) beside where it was
queued from (`source`), the tags the run queue acts on, and the run's Markdown card written
beside its future checkpoints.

Tags are few because the UI's runs list shows every one on every row: `factory/kind` (what the
instance's concurrency limits count), `dagster/priority` and `dagster/max_retries` (Dagster hides its
own `dagster/` tags in the list) and, for a sweep cell, `factory/sweep`. The run name is the `dagster/partition` tag, so
"has this run been queued, run or finished?" is a query on that tag, whoever launched the run
(the sensor, `factory experiment submit`, `dagster asset materialize`, the UI). The identity hash
is in the run name (first 8 characters), the run config's experiment and the card; a cell's
values are in its experiment.

`pending_experiments` is the experiment sensor's rule, without Dagster: an experiment whose run
is finished (its final step is in `train.checkpoints`, however it was trained) or that Dagster
already knows (the caller's `known` answers for the instance) is not queued, and its card is not
rewritten.

Every run is planned against the lake before it is queued: a missing mix or a model shorter than
the mix's sequences is an error here, naming the experiment, never a run that fails later.

Run-queue priorities (Dagster's `dagster/priority`, higher starts first): evals jump ahead of
training, and sweep cells wait behind hand-launched training. `factory/kind` carries the class
the instance's tag concurrency limits count (one `training` run at a time locally).

Retries: a training run is retried `RETRIES` times (`dagster/max_retries`; the instance enables
run retries, configs/dagster.yaml). A preempted trainer exits after checkpointing the step in
progress (`factory.train.preempt`), its run fails, and the retry resumes from that checkpoint.

RL sweep cells (`queued_rl_run`) are the same `QueuedRun` for another job: `rl_job`, partition
= the cell's run name in `rl_runs` (also its RLConfig's name), the config as JSON in the run
config of `rl_run`, the same tags, a card. Before they are queued they are checked against the lake
like a training plan (`check_rl_config`: the start checkpoint, a task table), once per distinct
start; their `tokens` are the rollout tokens they may sample at most (`rollout_tokens`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from pyiceberg.expressions import In

from factory.experiments.card import render_card, render_rl_card, write_card
from factory.experiments.registry import discover_experiments, discover_rl_experiments, discover_sweeps
from factory.experiments.spec import ExperimentConfig, ExperimentError, plan_experiment
from factory.experiments.sweep import SweepConfig, check_token_budget, expand, rollout_tokens, run_name
from factory.home import run_dir
from factory.posttrain.rl.config import RLConfig

PRIORITY = {"eval": 10, "training": 0, "sweep": -10}
RETRIES = 3  # preemptions (or lost run workers) a training run survives before it stays failed
RERUNNABLE = {"FAILURE", "CANCELED"}  # a config whose runs all ended so may be queued again; any other status blocks it
TRAIN_JOB, TRAINING_PARTITIONS = "train_job", "training_runs"  # jobs/ and assets/train.py
RL_JOB, RL_PARTITIONS = "rl_job", "rl_runs"  # jobs/ and assets/posttrain.py


class QueuedRun(BaseModel):
    model_config = ConfigDict(frozen=True)

    run: str
    experiment: ExperimentConfig | RLConfig
    config_hash: str
    tags: dict[str, str]
    card: str
    card_path: str
    tokens: int  # trained, or (RL) rollout tokens sampled at most
    steps: int
    source: str
    job: str = TRAIN_JOB
    partitions: str = TRAINING_PARTITIONS  # the dynamic partitions definition `run` is added to

    @property
    def run_config(self) -> dict:
        if isinstance(self.experiment, RLConfig):
            return {"ops": {"rl_run": {"config": {"config_json": self.experiment.model_dump_json()}}}}
        return {"ops": {"training_run": {"config": {"experiment_json": self.experiment.model_dump_json(),
                                                    "source": self.source}}}}

    def save_card(self, lake) -> None:
        write_card(lake.home, self.run, self.card)


def queued_run(lake, experiment: ExperimentConfig, *, source: str, kind: str = "training",
               tags: dict[str, str] | None = None, write: bool = True) -> QueuedRun:
    """Plan `experiment` (errors name it), write its card (unless not `write`) and build its request."""
    plan = plan_experiment(lake, experiment)
    run = run_name(experiment)
    card = render_card(plan)
    queued = QueuedRun(run=run, experiment=experiment, config_hash=plan.config_hash, card=card,
                       card_path=str(run_dir(lake.home, run) / "card.md"), tokens=plan.tokens,
                       steps=plan.steps, source=source, tags=_tags(kind, tags))
    if write:
        queued.save_card(lake)
    return queued


def _tags(kind: str, tags: dict[str, str] | None) -> dict[str, str]:
    return {"factory/kind": "training", "dagster/priority": str(PRIORITY[kind]), "dagster/max_retries": str(RETRIES),
            **(tags or {})}


def queued_rl_run(lake, config: RLConfig, *, source: str, kind: str = "training",
                  tags: dict[str, str] | None = None, write: bool = True) -> QueuedRun:
    """The request of an RL run (partition = its config's name); the caller has checked the config
    against the lake (`check_rl_config`)."""
    queued = QueuedRun(run=config.name, experiment=config, config_hash=config.identity_hash(),
                       card=render_rl_card(config, source), card_path=str(run_dir(lake.home, config.name) / "card.md"),
                       tokens=rollout_tokens(config), steps=config.steps, source=source, tags=_tags(kind, tags),
                       job=RL_JOB, partitions=RL_PARTITIONS)
    if write:
        queued.save_card(lake)
    return queued


def check_rl_cells(lake, sweep: SweepConfig, configs: list[RLConfig]) -> None:
    """Each distinct start checkpoint and task table checked once (`check_rl_config`); errors name the sweep."""
    from factory.posttrain.rl.config import RLConfigError, check_rl_config

    checked = set()
    for config in configs:
        if (config.start, config.task_table) in checked:
            continue
        try:
            check_rl_config(config, lake)
        except RLConfigError as e:
            raise ExperimentError(f"sweep {sweep.name}: {e}") from None
        checked.add((config.start, config.task_table))


def experiment_runs(lake, directory: Path | None = None, names: list[str] | None = None,
                    skip: set[str] = frozenset()) -> tuple[list[QueuedRun], list[str]]:
    """Requests for the experiments in `directory` (all, or `names`), except those whose identity
    hash is in `skip` (already queued: not even planned again), and one error per experiment that
    cannot be queued (broken file, unknown name, plan failure)."""
    found = discover_experiments(directory)
    errors = list(found.errors)
    if names:
        errors += [f"no experiment {n!r} (have: {', '.join(sorted(found.found))})" for n in names if n not in found.found]
    runs = []
    for name, f in sorted(found.found.items()):
        if (names and name not in names) or f.config.identity_hash() in skip:
            continue
        try:
            runs.append(queued_run(lake, f.config, source=f"configs/experiments/{f.source}"))
        except ExperimentError as e:
            errors.append(f"{f.source}: {e}")
    return runs, errors


@dataclass
class Pending:
    """One look at the experiment files: what to queue, and what is already done or known."""

    runs: list[QueuedRun] = field(default_factory=list)  # to queue; their cards are written
    done: dict[str, str] = field(default_factory=dict)  # run name -> why it is not queued
    seen: set[str] = field(default_factory=set)  # identity hashes decided (queued or done)
    errors: list[str] = field(default_factory=list)


def pending_experiments(lake, directory: Path | None, skip: set[str],
                        known: Callable[[list[str]], dict[str, str]] = lambda runs: {}) -> Pending:
    """The experiments of `directory` to queue now: not in `skip` (identity hashes already
    decided), not `known` (run name -> reason, e.g. Dagster has a queued, running or successful
    run of that partition), and not finished in the lake (`finished_runs`). Only the new ones are
    planned; a known one is not even planned, a finished one is planned but its card is kept."""
    found = discover_experiments(directory)
    out = Pending(errors=list(found.errors))
    fresh = {run_name(f.config): f for _, f in sorted(found.found.items()) if f.config.identity_hash() not in skip}
    out.done = known(list(fresh))
    planned = []
    for run, f in fresh.items():
        if run in out.done:
            out.seen.add(f.config.identity_hash())
            continue
        try:
            planned.append(queued_run(lake, f.config, source=f"configs/experiments/{f.source}", write=False))
        except ExperimentError as e:
            out.errors.append(f"{f.source}: {e}")
    finished = finished_runs(lake, {r.run: r.steps for r in planned})
    out.done |= finished
    for r in planned:
        out.seen.add(r.config_hash)
        if r.run not in finished:
            r.save_card(lake)
            out.runs.append(r)
    return out


def finished_runs(lake, steps: dict[str, int]) -> dict[str, str]:
    """run -> "trained to step N" for the runs of `steps` (run -> planned steps) whose final
    checkpoint is in `train.checkpoints` (one scan, filtered on those runs)."""
    from factory.train.checkpoint import CHECKPOINTS_TABLE  # torch: only when there is something to check

    if not steps or not lake.has_table(CHECKPOINTS_TABLE):
        return {}
    rows = lake.table(CHECKPOINTS_TABLE).scan(row_filter=In("run", list(steps)), selected_fields=("run", "step"))
    last: dict[str, int] = {}
    for row in rows.to_arrow().to_pylist():
        last[row["run"]] = max(last.get(row["run"], 0), row["step"])
    return {run: f"trained: train.checkpoints has its final step {last[run]}"
            for run, n in steps.items() if last.get(run, -1) >= n}


def resolve_run(run: str, experiments_dir: Path | None = None, sweeps_dir: Path | None = None) -> ExperimentConfig:
    """The experiment whose run name is `run`, among the experiment files and the sweep cells as
    they are now (for a run launched by partition alone, e.g. from the UI)."""
    found = discover_experiments(experiments_dir)
    for f in found.found.values():
        if run_name(f.config) == run:
            return f.config
    cell = _sweep_cell(run, ExperimentConfig, sweeps_dir)
    if cell is not None:
        return cell
    raise ExperimentError(f"no experiment or sweep cell has run name {run!r} now (its file may have changed since it "
                          "was queued; runs queued by the sensor or `factory experiment submit` carry their config)")


def resolve_rl_run(run: str, experiments_dir: Path | None = None, sweeps_dir: Path | None = None) -> RLConfig:
    """The RL config named `run`: an `-> RLConfig` experiment, or an RL sweep's cell as it is now."""
    found = discover_rl_experiments(experiments_dir)
    if run in found.found:
        return found.found[run].config
    cell = _sweep_cell(run, RLConfig, sweeps_dir)
    if cell is not None:
        return cell
    raise ExperimentError(f"no RL experiment or RL sweep cell is named {run!r} now (have: "
                          f"{', '.join(sorted(found.found)) or 'none'}; runs queued by `factory sweep launch` carry "
                          "their config)")


def _sweep_cell(run: str, cls: type, sweeps_dir: Path | None):
    for f in discover_sweeps(sweeps_dir).found.values():
        if run.startswith(f.name + "-") and isinstance(f.config.base, cls):
            for cell in expand(f.config):
                if cell.run == run:
                    return cell.experiment
    return None


def sweep_runs(lake, sweep: SweepConfig) -> list[QueuedRun]:
    """One request per cell, tagged with the sweep and the cell's values; the whole sweep is
    refused when any cell cannot be planned (RL: checked) or the cells exceed the budget."""
    cells = expand(sweep)
    sources = [f"configs/sweeps/{sweep.name} cell {c.index}: " + json.dumps(c.params, sort_keys=True) for c in cells]
    tags = {"factory/sweep": sweep.name}
    if sweep.is_rl:
        configs = [c.experiment for c in cells]
        check_token_budget(sweep, [rollout_tokens(c) for c in configs])  # before the lake is read: it is arithmetic
        check_rl_cells(lake, sweep, configs)
        return [queued_rl_run(lake, c, source=s, kind="sweep", tags=tags) for c, s in zip(configs, sources)]
    runs = [queued_run(lake, c.experiment, source=s, kind="sweep", tags=tags) for c, s in zip(cells, sources)]
    check_token_budget(sweep, [r.tokens for r in runs])
    return runs
