"""End to end under `dagster dev` with its daemon: a smoke training run launched over GraphQL
writes checkpoints, and the daemon's `checkpoint_eval_sensor` requests an eval run for every N-th
one by itself; those runs export, check and score the checkpoints into `evals.results`.

Marked `slow` (~3-5 min on 2 CPU cores: dagster dev, a training subprocess, two eval runs that
each start vLLM).
"""

import time

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from factory.evals import results
from factory.lake import Lake

pytestmark = pytest.mark.slow
FINISHED = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)


@pytest.fixture
def training_home(factory_env, build_training_lake):
    factory_env["OMP_NUM_THREADS"] = "1"  # two cores shared by training, evals and dagster
    build_training_lake(factory_env["FACTORY_HOME"], heldout_fraction=0.25)
    return factory_env


def test_evals_run_by_themselves_for_every_nth_checkpoint(training_home, dagster_dev):
    run_config = {"ops": {"training_run": {"config": {"steps": 8, "checkpoint_every": 2, "eval_every": 4,
                                                      "eval_suite": "quick"}}}}
    train_run = dagster_dev.submit_job_execution("train_job", run_config=run_config, tags={"dagster/partition": "smoke"})
    lake = Lake.open(home=training_home["FACTORY_HOME"])
    wanted = {"eval/smoke@4/quick", "eval/smoke@8/quick"}
    deadline = time.monotonic() + 900
    while not wanted <= {r["eval_id"] for r in results(lake, "smoke")}:
        assert time.monotonic() < deadline, f"evals still missing: {wanted - {r['eval_id'] for r in results(lake, 'smoke')}}"
        time.sleep(5)
    assert dagster_dev.get_run_status(train_run) == DagsterRunStatus.SUCCESS

    instance = DagsterInstance.from_config(training_home["DAGSTER_HOME"])
    evals = instance.get_runs(RunsFilter(job_name="eval_job"))
    # checkpoints 2 and 6 are not multiples of eval_every: no runs for them
    assert sorted(r.tags["dagster/run_key"] for r in evals) == ["ckpt/smoke@4", "ckpt/smoke@8"]
    assert all(r.tags["dagster/sensor_name"] == "checkpoint_eval_sensor" for r in evals)
    assert all(r.status in FINISHED for r in evals) and all(r.status == DagsterRunStatus.SUCCESS for r in evals)
    metrics = {(r["eval_id"], r["task"], r["metric"]) for r in results(lake, "smoke")}
    assert ("eval/smoke@8/quick", "humaneval", "pass@1") in metrics
    assert ("eval/smoke@4/quick", "bpb", "all") in metrics
