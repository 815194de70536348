"""Experiments as code, queued by themselves: the experiment sensor and one schedule per sweep.

`experiment_sensor` reads `configs/experiments/` every tick (fresh: an edit is seen at the next
tick) and requests a `train_job` run for every experiment it has not decided before (its cursor
holds the identity hashes decided) whose run is not already done or under way, however it was
launched: partition = run name `<name>-<hash8>` (added in the same tick), `run_key` = the hash,
the experiment as JSON in the run config, its card written beside the run.

The rule, in order (the first that holds decides, and the hash joins the cursor):
1. the run name's `training_run` partition has a Dagster run that is queued, running or
   succeeded (a `dagster/partition` tag query: the sensor, `factory experiment submit`, `make
   demo`'s `dagster asset materialize`, the UI's Materialize all count) -> skipped, "in Dagster";
2. `train.checkpoints` holds the run's final step (trained without Dagster, e.g. `python -m
   factory.train`, or in an instance since wiped) -> skipped, "trained";
3. otherwise it is queued. An experiment whose runs all failed or were canceled is queued again
   when the sensor first sees it; once the sensor has queued it, it is not retried (relaunch the
   failed run in the UI).
An unchanged experiment is never queued again; an edited one is a new run. An experiment that
cannot be planned (broken file, missing mix) is logged with its file and reason and retried
next tick. Every tick that decides something logs what it queued and what it skipped as done.

`sweep_schedule(sweep)` launches every cell of a sweep on its cron (stopped by default; start it
in the UI, or evaluate it there once to launch by hand). Cells carry `factory/sweep` tags and the
lowest priority. A schedule's run keys only dedupe within one tick, so it skips cells that already
have a queued, running or successful run (same run name, so the same identity): each tick queues
only new or changed cells, and a failed cell is retried. An RL sweep's schedule targets `rl_job`
(cells are `rl_run` partitions in `rl_runs`); a schedule has one job, so a sweep file whose base
changed kind since the definitions loaded is skipped until the code location is reloaded.
"""

import json

from dagster import (
    AssetKey,
    DagsterRunStatus,
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
from factory.experiments.queue import RERUNNABLE, pending_experiments, sweep_runs
from factory.experiments.registry import get_sweep
from factory.experiments.sweep import SweepConfig
from jobs import rl_job, train_job
from resources.experiments import ExperimentsResource
from resources.lake import LakeResource

NIGHTLY = "0 4 * * *"  # sweeps without a cron of their own: nightly, once started


def _request(r) -> RunRequest:
    return RunRequest(run_key=r.config_hash, partition_key=r.run, run_config=r.run_config, tags=r.tags)


@sensor(job=train_job, minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING,
        description="Queue a training run for each experiment in configs/experiments (new or edited) whose run is "
                    "not already trained (final step in train.checkpoints) or queued, running or succeeded in "
                    "Dagster, however it was launched. Each experiment is decided once.")
def experiment_sensor(context: SensorEvaluationContext, lake: LakeResource, experiments: ExperimentsResource):
    decided = set(json.loads(context.cursor or "[]"))
    pending = pending_experiments(lake.lake(), experiments.experiments_path(), skip=decided,
                                  known=lambda runs: _in_dagster(context.instance, runs))
    for error in pending.errors:
        context.log.warning(error)
    if pending.done:
        context.log.info(f"skipped {len(pending.done)} already done: "
                         + "; ".join(f"{run} ({why})" for run, why in sorted(pending.done.items())))
    cursor = json.dumps(sorted(decided | pending.seen))
    if not pending.runs:
        if pending.seen:  # the done ones are decided: not looked up again
            context.update_cursor(cursor)
        done = f"; {len(pending.done)} already done: {', '.join(sorted(pending.done))}" if pending.done else ""
        return SkipReason("no new or changed experiments to train" + done
                          + (f"; {len(pending.errors)} cannot be queued" if pending.errors else ""))
    context.log.info(f"queueing {len(pending.runs)}: {', '.join(r.run for r in pending.runs)}")
    return SensorResult(
        run_requests=[_request(r) for r in pending.runs],
        dynamic_partitions_requests=[training_runs.build_add_request([r.run for r in pending.runs])],
        cursor=cursor,
    )


TRAINING_RUN = AssetKey("training_run")
RL_RUN = AssetKey("rl_run")


def _dagster_runs(instance, runs: list[str], job=train_job, asset: AssetKey = TRAINING_RUN) -> dict[str, object]:
    """run name -> the newest Dagster run of its `asset` partition that is queued, running or
    succeeded (one query on the partition tag, whichever job or command launched it)."""
    if not runs:
        return {}
    blocking = [s for s in DagsterRunStatus if s.value not in RERUNNABLE]
    found = {}
    for r in instance.get_runs(RunsFilter(tags={"dagster/partition": runs}, statuses=blocking)):  # newest first
        if r.job_name == job.name or asset in (r.asset_selection or ()):
            found.setdefault(r.tags["dagster/partition"], r)
    return found


def _in_dagster(instance, runs: list[str]) -> dict[str, str]:
    return {run: f"in Dagster: run {r.run_id[:8]} {r.status.value}" for run, r in _dagster_runs(instance, runs).items()}


def sweep_schedule(sweep: SweepConfig, cron: str | None = None) -> ScheduleDefinition:
    """The schedule that launches `sweep` (read fresh from its file at each tick when it has one)."""
    name = sweep.name
    job, asset = (rl_job, RL_RUN) if sweep.is_rl else (train_job, TRAINING_RUN)

    @schedule(name=f"sweep_{name}", job=job, cron_schedule=cron or sweep.cron or NIGHTLY,
              default_status=DefaultScheduleStatus.STOPPED,
              description=f"Launch every cell of sweep {name}: {sweep.description or sweep.search + ' search'}")
    def launch(context: ScheduleEvaluationContext, lake: LakeResource, experiments: ExperimentsResource):
        try:
            current = get_sweep(name, experiments.sweeps_path())
        except ValueError:
            current = sweep  # defined in code, not in a file
        if current.is_rl != sweep.is_rl:
            return SkipReason(f"sweep {name}'s base changed kind since the definitions loaded (this schedule runs "
                              f"{job.name}): reload the code location")
        # a schedule's run keys only dedupe within one tick: skip cells that already have a live run
        cells = sweep_runs(lake.lake(), current)
        live = _dagster_runs(context.instance, [r.run for r in cells], job, asset)
        runs = [r for r in cells if r.run not in live]
        if not runs:
            return SkipReason(f"every cell of {name} already has a run (unchanged cells are not rerun)")
        for partitions in sorted({r.partitions for r in runs}):  # training_runs, or rl_runs for RL cells
            context.instance.add_dynamic_partitions(partitions, [r.run for r in runs if r.partitions == partitions])
        context.log.info(f"launching {len(runs)} cells of {name}: {', '.join(r.run for r in runs)}")
        return [_request(r) for r in runs]

    return launch
