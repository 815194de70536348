"""Experiments as code, queued by themselves: the experiment sensor and one schedule per sweep.

`experiment_sensor` reads `configs/experiments/` every tick (fresh: an edit is seen at the next
tick) and requests a `train_job` run for every experiment whose identity hash it has not queued
before: partition = run name `<name>-<hash8>` (added in the same tick), `run_key` = the hash,
the experiment as JSON in the run config, its card written beside the run. An unchanged
experiment is never queued again; an edited one is a new run. An experiment that cannot be
planned (broken file, missing mix) is logged with its file and reason and retried next tick.

`sweep_schedule(sweep)` launches every cell of a sweep on its cron (stopped by default; start it
in the UI, or evaluate it there once to launch by hand). Cells carry `factory/sweep` tags and the
lowest priority. A schedule's run keys only dedupe within one tick, so it skips cells that already
have a queued, running or successful run (same config hash): each tick queues only new or changed
cells, and a failed cell is retried.
"""

import json

from dagster import (
    DefaultScheduleStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    schedule,
    sensor,
)

from assets.train import training_runs
from factory.experiments.queue import RERUNNABLE, experiment_runs, sweep_runs
from factory.experiments.registry import get_sweep
from factory.experiments.sweep import SweepConfig
from jobs import train_job
from resources.experiments import ExperimentsResource
from resources.lake import LakeResource

NIGHTLY = "0 4 * * *"  # sweeps without a cron of their own: nightly, once started


def _request(r) -> RunRequest:
    return RunRequest(run_key=r.config_hash, partition_key=r.run, run_config=r.run_config, tags=r.tags)


@sensor(job=train_job, minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING,
        description="Queue a training run for every new or changed experiment in configs/experiments.")
def experiment_sensor(context: SensorEvaluationContext, lake: LakeResource, experiments: ExperimentsResource):
    queued = set(json.loads(context.cursor or "[]"))
    runs, errors = experiment_runs(lake.lake(), experiments.experiments_path(), skip=queued)
    for error in errors:
        context.log.warning(error)
    if not runs:
        return SkipReason("no new or changed experiments" + (f"; {len(errors)} cannot be queued" if errors else ""))
    context.log.info(f"queueing {', '.join(r.run for r in runs)}")
    return SensorResult(
        run_requests=[_request(r) for r in runs],
        dynamic_partitions_requests=[training_runs.build_add_request([r.run for r in runs])],
        cursor=json.dumps(sorted(queued | {r.config_hash for r in runs})),
    )


def _live_hashes(instance, hashes: list[str]) -> set[str]:
    """The config hashes among `hashes` that have a queued, running or successful run (one query)."""
    runs = instance.get_runs(RunsFilter(tags={"factory/config_hash": hashes}))
    return {r.tags["factory/config_hash"] for r in runs if r.status.value not in RERUNNABLE}


def sweep_schedule(sweep: SweepConfig, cron: str | None = None) -> ScheduleDefinition:
    """The schedule that launches `sweep` (read fresh from its file at each tick when it has one)."""
    name = sweep.name

    @schedule(name=f"sweep_{name}", job=train_job, cron_schedule=cron or sweep.cron or NIGHTLY,
              default_status=DefaultScheduleStatus.STOPPED,
              description=f"Launch every cell of sweep {name}: {sweep.description or sweep.search + ' search'}")
    def launch(context: ScheduleEvaluationContext, lake: LakeResource, experiments: ExperimentsResource):
        try:
            current = get_sweep(name, experiments.sweeps_path())
        except ValueError:
            current = sweep  # defined in code, not in a file
        # a schedule's run keys only dedupe within one tick: skip cells that already have a live run
        cells = sweep_runs(lake.lake(), current)
        live = _live_hashes(context.instance, [r.config_hash for r in cells])
        runs = [r for r in cells if r.config_hash not in live]
        if not runs:
            return SkipReason(f"every cell of {name} already has a run (unchanged cells are not rerun)")
        context.instance.add_dynamic_partitions(training_runs.name, [r.run for r in runs])
        context.log.info(f"launching {len(runs)} cells of {name}: {', '.join(r.run for r in runs)}")
        return [_request(r) for r in runs]

    return launch
