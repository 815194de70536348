"""Preemption end to end under `dagster dev` with its daemon: a shortened smoke run queued over
GraphQL (as `factory experiment submit` does), its trainer process (`python -m factory.train`, the
Pipes child of the run worker) sent SIGTERM mid-run, as Kubernetes does to a preempted pod.

The first run must end FAILED with the preemption as its reason (never left STARTED or its step
IN_PROGRESS, dagster#33755 / #3705); the daemon's run-retry (`dagster/max_retries` on training runs,
`run_retries` in configs/dagster.yaml) launches a retry by itself; the retry resumes from the
preemption checkpoint (`resumed_from` on its materialization; the `preempted` incident names the
first run) and SUCCEEDS; its final parameters equal, tensor for tensor (`torch.equal`), an
uninterrupted run of the same experiment trained in this process on the same lake.

Marked `slow` (~3-4 min on 2 CPU cores: dagster dev, two training subprocesses, one in-process run).
The experiment sensor reads an empty directory (factory_env), so only this run trains.
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter

from configs.experiments import smoke
from factory.experiments import plan_experiment
from factory.experiments.launcher import GraphQL, submit
from factory.experiments.queue import queued_run
from factory.lake import Lake
from factory.train.checkpoint import checkpoint_dir, latest_valid, load_checkpoint, validate
from factory.train.config import CheckpointConfig
from factory.train.preempt import preemption_of
from factory.train.trainer import train

pytestmark = pytest.mark.slow
STEPS, EVERY = 8, 2


@pytest.fixture
def training_home(factory_env, build_training_lake):
    factory_env["OMP_NUM_THREADS"] = "1"  # two cores shared by training and dagster; and bit-identical runs
    build_training_lake(factory_env["FACTORY_HOME"])
    return factory_env


def trainer_pid(home: str) -> int | None:
    """The `python -m factory.train` process started for this home (the Pipes child), if running."""
    needle = f"FACTORY_HOME={home}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            if b"factory.train" in cmd and b"-m" in cmd and needle in (entry / "environ").read_bytes().split(b"\0"):
                return int(entry.name)
        except OSError:
            continue
    return None


def until(predicate, what: str, deadline: float, poll: float = 0.5):
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll)
    return found


def test_preempted_training_run_is_retried_and_resumes_bit_identically(training_home, dagster_dev):
    home = training_home["FACTORY_HOME"]
    lake = Lake.open(home=home)
    experiment = smoke().derive(steps=STEPS, checkpoint=CheckpointConfig(every=EVERY, keep_last=10),
                                tracker={"backends": ["iceberg"]})
    queued = queued_run(lake, experiment, source="test")
    run, directory = queued.run, checkpoint_dir(Path(home), queued.run)
    assert queued.tags["dagster/max_retries"] == "3"
    (submitted,) = submit([queued], GraphQL(dagster_dev.url))
    deadline = time.monotonic() + 900

    first = directory / f"step-{EVERY:08d}.pt"
    until(lambda: first.with_suffix(".json").exists() and validate(first) is None, "the first checkpoint", deadline)
    pid = until(lambda: trainer_pid(home), "the trainer process", deadline)
    os.kill(pid, signal.SIGTERM)  # what the kubelet sends a preempted pod

    instance = DagsterInstance.from_config(training_home["DAGSTER_HOME"])
    status = lambda run_id: instance.get_run_by_id(run_id).status  # noqa: E731
    ended = (DagsterRunStatus.FAILURE, DagsterRunStatus.SUCCESS, DagsterRunStatus.CANCELED)
    until(lambda: status(submitted.run_id) in ended, "the first run to end", deadline)
    assert status(submitted.run_id) == DagsterRunStatus.FAILURE
    (step,) = instance.get_run_step_stats(submitted.run_id)
    assert step.status.value == "FAILURE", step  # the step ended too: not left IN_PROGRESS
    failures = [e for e in instance.all_logs(submitted.run_id, of_type=DagsterEventType.STEP_FAILURE)]
    message = failures[0].dagster_event.step_failure_data.error.message
    incident = preemption_of(lake, run, submitted.run_id)
    stop = incident["step"]
    assert EVERY < stop < STEPS and incident["within_grace"]
    assert f"preempted at step {stop}, checkpoint ckpt/{run}@{stop}" in message and "the retry resumes" in message

    retries = lambda: instance.get_runs(RunsFilter(tags={"dagster/parent_run_id": submitted.run_id}))  # noqa: E731
    (retry,) = until(retries, "the daemon's retry run", deadline)
    assert retry.tags["dagster/partition"] == run and retry.tags["dagster/retry_number"] == "1"
    until(lambda: status(retry.run_id) in ended, "the retry to end", deadline, poll=2)
    assert status(retry.run_id) == DagsterRunStatus.SUCCESS
    (materialized,) = instance.all_logs(retry.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
    metadata = materialized.dagster_event.materialization.metadata
    assert metadata["resumed_from"].value == stop

    # the same experiment, uninterrupted, in this process on one thread like the trainer processes
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        straight = train(plan_experiment(lake, experiment), lake, run="straight")
    finally:
        torch.set_num_threads(threads)
    assert straight.steps == STEPS
    a = load_checkpoint(latest_valid(checkpoint_dir(Path(home), "straight"), print))
    b = load_checkpoint(latest_valid(directory, print))
    assert a["step"] == b["step"] == STEPS
    differ = [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])]
    assert differ == [], f"the retried run's parameters differ from an uninterrupted run's: {differ}"
    assert json.loads(b["plan"])["experiment"]["name"] == experiment.name
