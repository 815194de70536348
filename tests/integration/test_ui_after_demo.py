"""Opening the UI right after `make demo` queues nothing already done (issue 16's acceptance).

`dagster dev -w workspace.yaml` with its daemon, on a free loopback port, over the FACTORY_HOME a
real `make demo` left (the `demo_home` session fixture) and the real `configs/experiments`. Once
each of the three sensors has ticked, what they queued is exactly what the README says `make ui`
queues after the demo:
- training of `smoke_ddp` and `smoke_uniform` (the demo trains only `smoke`); `smoke_automix`
  waits for its mix (`factory automix automix`), the sweeps' schedules are stopped;
- no run of the smoke run's partition (`make demo` trained it with `dagster asset materialize`);
- no eval run: smoke evaluates only its final checkpoint, which the demo scored (the eval
  sensor's skip names it); `smoke_ddp@120` and `smoke_uniform@120` come once they are trained;
- no `mix_job` run: `default_synthetic`'s newest version pins the demo's synthetic snapshot.

The instance is the demo's runs and event log with sensor state of its own and a run queue that
starts nothing (max_concurrent_runs: 0): what the sensors queue is the question, and training and
vLLM runs would only take the machine's cores (and leave the shared home with runs killed
half-way). The runs and partitions the sensors added are deleted at the end. Marked `slow` (the fixture's `make demo`, then about a minute here).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, RunsFilter
from dagster._core.definitions.run_request import InstigatorType
from dagster._core.scheduler.instigation import TickStatus
from dagster_graphql import DagsterGraphQLClient

from configs.experiments.automix import smoke_uniform
from configs.experiments.smoke import smoke, smoke_ddp
from factory.experiments.sweep import run_name

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).parent / "dagster"
SENSORS = ("experiment_sensor", "checkpoint_eval_sensor", "synthetic_mix_sensor")


def held_instance(demo_dagster_home: Path, directory: Path) -> Path:
    """A DAGSTER_HOME with the demo's runs and event log (its materializations and partitions), a
    schedule storage of its own (sensor cursors and ticks start empty, as after `make demo`, and
    stay out of the shared home) and a run queue that launches nothing."""
    config = yaml.safe_load((demo_dagster_home / "dagster.yaml").read_text())
    assert "storage" not in config, "the demo home is expected on sqlite under DAGSTER_HOME"
    history = demo_dagster_home / "history"
    config |= {
        "run_storage": {"module": "dagster._core.storage.runs", "class": "SqliteRunStorage",
                        "config": {"base_dir": f"{history}/"}},
        "event_log_storage": {"module": "dagster._core.storage.event_log", "class": "SqliteEventLogStorage",
                              "config": {"base_dir": f"{history}/runs/"}},
        "schedule_storage": {"module": "dagster._core.storage.schedules", "class": "SqliteScheduleStorage",
                             "config": {"base_dir": str(directory / "schedules")}},
    }
    config["run_coordinator"]["config"]["max_concurrent_runs"] = 0
    directory.mkdir()
    (directory / "dagster.yaml").write_text(yaml.safe_dump(config))
    return directory


def first_ticks(instance: DagsterInstance, since: float) -> dict:
    """sensor name -> its first finished tick after `since` (those that have one)."""
    out = {}
    for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
        if state.instigator_name not in SENSORS:
            continue
        ticks = [t for t in instance.get_ticks(state.instigator_origin_id, state.selector_id, after=since)
                 if t.status != TickStatus.STARTED]
        if ticks:
            out[state.instigator_name] = min(ticks, key=lambda t: t.timestamp)
    return out


def test_the_ui_after_the_demo_queues_only_what_the_demo_left_undone(demo_home, free_port, tmp_path, leftovers):
    demo_dagster = Path(demo_home["DAGSTER_HOME"])
    env = {**demo_home, "DAGSTER_HOME": str(held_instance(demo_dagster, tmp_path / "dagster")),
           "SPARK_LOCAL_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1"}
    instance = DagsterInstance.from_config(env["DAGSTER_HOME"])
    before = {r.run_id for r in instance.get_runs()}
    partitions = {name: set(instance.get_dynamic_partitions(name)) for name in ("training_runs", "checkpoints")}
    start = time.time()
    with open(tmp_path / "dagster-dev.log", "w") as log:
        dev = subprocess.Popen([str(DAGSTER), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(free_port)],
                               cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        client = DagsterGraphQLClient("127.0.0.1", port_number=free_port)
        deadline = time.monotonic() + 600
        while len(ticks := first_ticks(instance, start)) < len(SENSORS):
            assert dev.poll() is None and time.monotonic() < deadline, \
                f"sensors ticked: {sorted(ticks)}; {(tmp_path / 'dagster-dev.log').read_text()[-3000:]}"
            time.sleep(2)
        client._execute("{ version }")  # the webserver answers too
    finally:
        os.killpg(dev.pid, signal.SIGINT)  # as Ctrl-C would; dagster dev stops its daemon and code server
        try:
            dev.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(dev.pid, signal.SIGKILL)
            dev.wait()
    failed = {name: t.error.message for name, t in ticks.items() if t.status == TickStatus.FAILURE}
    assert not failed, failed

    queued = [r for r in instance.get_runs(RunsFilter(created_after=_utc(start))) if r.run_id not in before]
    try:
        by_job = {}
        for r in queued:
            by_job.setdefault(r.job_name, set()).add(r.tags.get("dagster/partition"))
        assert by_job == {"train_job": {run_name(smoke_ddp()), run_name(smoke_uniform())}}, by_job
        assert all(r.tags["dagster/sensor_name"] == "experiment_sensor" for r in queued)
        assert run_name(smoke()) not in by_job["train_job"]

        evals = ticks["checkpoint_eval_sensor"]
        assert evals.status == TickStatus.SKIPPED and evals.skip_reason == (
            f"every checkpoint due is already evaluated or being evaluated: {run_name(smoke())}@120")
        mixes = ticks["synthetic_mix_sensor"]
        assert mixes.status == TickStatus.SKIPPED
        assert "already current: default_synthetic <- synthetic.porting@" in mixes.skip_reason
        assert ticks["experiment_sensor"].status == TickStatus.SUCCESS
        assert len(ticks["experiment_sensor"].run_ids) == 2
    finally:  # the shared demo home keeps only what the demo made
        for r in queued:
            instance.delete_run(r.run_id)
        for name in ("training_runs", "checkpoints"):
            for key in set(instance.get_dynamic_partitions(name)) - partitions[name]:
                instance.delete_dynamic_partition(name, key)
    left = leftovers(env, var="DAGSTER_HOME")  # this test's own instance directory
    assert not left, "still running after dagster dev was stopped:\n" + "\n".join(left)


def _utc(timestamp: float):
    import datetime as dt

    return dt.datetime.fromtimestamp(timestamp, dt.timezone.utc)
