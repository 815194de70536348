"""What gets queued: experiments and sweep cells as run requests, in plain data.

The experiment sensor, the sweep schedules and `factory experiment submit` / `factory sweep
launch` all turn configs into the same `QueuedRun`: the run name (`<name>-<hash8>`, also the
`training_run` partition), the validated experiment as JSON in the run config (so the run trains
exactly what was queued, even if the file changes again before it starts), the tags the run
queue acts on, and the run's Markdown card written beside its future checkpoints.

Every run is planned against the lake before it is queued: a missing mix or a model shorter than
the mix's sequences is an error here, naming the experiment, never a run that fails later.

Run-queue priorities (Dagster's `dagster/priority`, higher starts first): evals jump ahead of
training, and sweep cells wait behind hand-launched training. `factory/kind` carries the class
the instance's tag concurrency limits count (one `training` run at a time locally).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from factory.experiments.card import render_card, write_card
from factory.experiments.registry import discover_experiments, discover_sweeps
from factory.experiments.spec import ExperimentConfig, ExperimentError, plan_experiment
from factory.experiments.sweep import SweepConfig, check_token_budget, expand, run_name

PRIORITY = {"eval": 10, "training": 0, "sweep": -10}
RERUNNABLE = {"FAILURE", "CANCELED"}  # a config whose runs all ended so may be queued again; any other status blocks it
TRAIN_JOB = "train_job"


class QueuedRun(BaseModel):
    model_config = ConfigDict(frozen=True)

    run: str
    experiment: ExperimentConfig
    config_hash: str
    tags: dict[str, str]
    card: str
    card_path: str
    tokens: int

    @property
    def run_config(self) -> dict:
        return {"ops": {"training_run": {"config": {"experiment_json": self.experiment.model_dump_json()}}}}


def queued_run(lake, experiment: ExperimentConfig, *, source: str, kind: str = "training",
               tags: dict[str, str] | None = None) -> QueuedRun:
    """Plan `experiment` (errors name it), write its card and build its request."""
    plan = plan_experiment(lake, experiment)
    run = run_name(experiment)
    card = render_card(plan)
    path = write_card(lake.home, run, card)
    return QueuedRun(run=run, experiment=experiment, config_hash=plan.config_hash, card=card, card_path=str(path),
                      tokens=plan.tokens, tags={
        "factory/kind": "training", "factory/experiment": experiment.name, "factory/run": run,
        "factory/config_hash": plan.config_hash, "factory/source": source, "factory/card": str(path),
        "dagster/priority": str(PRIORITY[kind]), **(tags or {}),
    })


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


def resolve_run(run: str, experiments_dir: Path | None = None, sweeps_dir: Path | None = None) -> ExperimentConfig:
    """The experiment whose run name is `run`, among the experiment files and the sweep cells as
    they are now (for a run launched by partition alone, e.g. from the UI)."""
    found = discover_experiments(experiments_dir)
    for f in found.found.values():
        if run_name(f.config) == run:
            return f.config
    sweeps = discover_sweeps(sweeps_dir)
    for f in sweeps.found.values():
        if run.startswith(f.name + "-"):
            for cell in expand(f.config):
                if cell.run == run:
                    return cell.experiment
    raise ExperimentError(f"no experiment or sweep cell has run name {run!r} now (its file may have changed since it "
                          "was queued; runs queued by the sensor or `factory experiment submit` carry their config)")


def sweep_runs(lake, sweep: SweepConfig) -> list[QueuedRun]:
    """One request per cell, tagged with the sweep and the cell's values; the whole sweep is
    refused when any cell cannot be planned or the cells exceed the budget."""
    cells = expand(sweep)
    runs = [queued_run(lake, c.experiment, source=f"configs/sweeps: {sweep.name}", kind="sweep",
                       tags={"factory/sweep": sweep.name, "factory/cell": str(c.index),
                             "factory/params": json.dumps(c.params, sort_keys=True)[:4000]}) for c in cells]
    check_token_budget(sweep, [r.tokens for r in runs])
    return runs
