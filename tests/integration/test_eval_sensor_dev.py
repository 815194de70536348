"""End to end under `dagster dev` with its daemon: a shortened smoke experiment queued over
GraphQL by `factory.experiments.launcher` (as `factory experiment submit` does) trains, and the
daemon's `checkpoint_eval_sensor` requests an eval run for every N-th checkpoint by itself; those
runs export, check and score the checkpoints into `evals.results`.

Marked `slow` (~3-5 min on 2 CPU cores: dagster dev, a training subprocess, two eval runs that
each start vLLM). The experiment sensor reads an empty directory (factory_env), so only this run trains.
"""

import time

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from configs.experiments import smoke
from factory.evals import results
from factory.experiments.launcher import GraphQL, submit
from factory.experiments.queue import queued_run
from factory.lake import Lake
from factory.train.config import CheckpointConfig

pytestmark = pytest.mark.slow
FINISHED = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)


@pytest.fixture
def training_home(factory_env, build_training_lake):
    factory_env["OMP_NUM_THREADS"] = "1"  # two cores shared by training, evals and dagster
    build_training_lake(factory_env["FACTORY_HOME"], heldout_fraction=0.25)
    return factory_env


def test_evals_run_by_themselves_for_every_nth_checkpoint(training_home, dagster_dev):
    lake = Lake.open(home=training_home["FACTORY_HOME"])
    experiment = smoke().derive(steps=8, checkpoint=CheckpointConfig(every=2, keep_last=5), eval_every=4,
                                eval_suite="quick")
    queued = queued_run(lake, experiment, source="test")
    run = queued.run
    (submitted,) = submit([queued], GraphQL(dagster_dev.url))
    assert submitted.run_id and submitted.status == "QUEUED"
    wanted = {f"eval/{run}@4/quick", f"eval/{run}@8/quick"}
    deadline = time.monotonic() + 900
    while not wanted <= {r["eval_id"] for r in results(lake, run)}:
        assert time.monotonic() < deadline, f"evals still missing: {wanted - {r['eval_id'] for r in results(lake, run)}}"
        time.sleep(5)
    assert dagster_dev.get_run_status(submitted.run_id) == DagsterRunStatus.SUCCESS

    instance = DagsterInstance.from_config(training_home["DAGSTER_HOME"])
    # the scores are committed a moment before their run ends
    while not all(r.status in FINISHED for r in instance.get_runs(RunsFilter(job_name="eval_job"))):
        assert time.monotonic() < deadline, "eval runs did not finish"
        time.sleep(1)
    evals = instance.get_runs(RunsFilter(job_name="eval_job"))
    # checkpoints 2 and 6 are not multiples of eval_every: no runs for them
    assert sorted(r.tags["dagster/run_key"] for r in evals) == [f"ckpt/{run}@4", f"ckpt/{run}@8"]
    assert all(r.tags["dagster/sensor_name"] == "checkpoint_eval_sensor" for r in evals)
    assert all(r.status in FINISHED for r in evals) and all(r.status == DagsterRunStatus.SUCCESS for r in evals)
    metrics = {(r["eval_id"], r["task"], r["metric"]) for r in results(lake, run)}
    assert (f"eval/{run}@8/quick", "humaneval", "pass@1") in metrics
    assert (f"eval/{run}@4/quick", "bpb", "all") in metrics
    assert instance.get_runs(RunsFilter(job_name="train_job"))[0].tags["dagster/partition"] == queued.run
