"""Sweeps through the real run queue.

- `factory sweep launch smoke_lr --url ...` against a running webserver (no daemon, so the runs
  stay queued) queues all four cells (its time is bench/cli_bench.py's, not an assertion's); every run carries the sweep tags, the sweep priority, its partition and its
  experiment; a second launch queues nothing (the cells are unchanged).
- The daemon fires a scheduled sweep: a code location that adds `sweep_schedule` of a two-cell
  sweep with a one-minute cron, started over GraphQL; both cells' training runs are created by
  the schedule and complete, one at a time (the `factory/kind=training` concurrency limit). (That a
  later tick skips cells with live runs is covered by tests/dagster/test_experiment_sensor.py.)
- `factory experiment submit smoke` with no server queues one run into the instance through
  jobs/queue_runs.py; submitting it again queues nothing.

Marked `slow` (~1 min, ~3-4 min and ~1 min on 2 CPU cores).
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture
def lake_env(factory_env, build_training_lake):
    factory_env["OMP_NUM_THREADS"] = "1"
    build_training_lake(factory_env["FACTORY_HOME"])
    return factory_env


def wait_for(url: str, proc, log: Path, timeout: float = 120) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"{url}/server_info", timeout=2).read()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not come up: {log.read_text()[-3000:]}")
            time.sleep(1)


def test_sweep_launch_queues_every_cell_through_the_webserver(lake_env, server, free_port, tmp_path):
    url = f"http://127.0.0.1:{free_port}"
    proc = server("webserver", [str(BIN / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1",
                                "-p", str(free_port)], lake_env)
    wait_for(url, proc, tmp_path / "webserver.log")

    done = subprocess.run([str(BIN / "factory"), "sweep", "launch", "smoke_lr", "--url", url], cwd=ROOT, env=lake_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "queued 4 run(s), 0 unchanged" in done.stdout, done.stdout

    instance = DagsterInstance.from_config(lake_env["DAGSTER_HOME"])
    runs = instance.get_runs(RunsFilter(tags={"factory/sweep": "smoke_lr"}))
    assert len(runs) == 4 and {r.status for r in runs} == {DagsterRunStatus.QUEUED}
    assert {r.tags["dagster/priority"] for r in runs} == {"-10"} and {r.job_name for r in runs} == {"train_job"}
    sources = sorted(r.run_config["ops"]["training_run"]["config"]["source"] for r in runs)
    assert [s.split(":")[0] for s in sources] == [f"configs/sweeps/smoke_lr cell {i}" for i in range(4)]
    for r in runs:
        config = r.run_config["ops"]["training_run"]["config"]
        experiment = json.loads(config["experiment_json"])
        assert r.tags["dagster/partition"].startswith("smoke_lr-")
        assert experiment["optimizer"]["lr"] == json.loads(config["source"].split(": ", 1)[1])["optimizer.lr"]
    assert set(instance.get_dynamic_partitions("training_runs")) == {r.tags["dagster/partition"] for r in runs}

    again = subprocess.run([str(BIN / "factory"), "sweep", "launch", "smoke_lr", "--url", url], cwd=ROOT, env=lake_env,
                           capture_output=True, text=True, timeout=120)
    assert "queued 0 run(s), 4 unchanged" in again.stdout, again.stdout + again.stderr


SWEEP_DEFS = '''
from dagster import Definitions

import definitions
from configs.experiments.smoke import smoke
from factory.experiments.sweep import SweepConfig
from factory.train.config import CheckpointConfig
from sensors.experiments import sweep_schedule

TICK = SweepConfig(
    name="tick", description="two 2-step cells, every minute",
    base=smoke().derive(steps=2, checkpoint=CheckpointConfig(every=2, keep_last=1), eval_every=1000,
                        tracker={"backends": ["iceberg"]}),
    params={"optimizer.lr": [1e-3, 2e-3]}, cron="* * * * *",
)
defs = Definitions.merge(definitions.defs, Definitions(schedules=[sweep_schedule(TICK)]))
'''


def test_the_daemon_fires_a_scheduled_sweep_and_its_runs_complete(lake_env, server, free_port, tmp_path):
    from dagster_graphql import DagsterGraphQLClient

    (tmp_path / "sweep_defs.py").write_text(SWEEP_DEFS)
    (tmp_path / "workspace.yaml").write_text(
        f"load_from:\n  - python_file:\n      relative_path: {tmp_path / 'sweep_defs.py'}\n"
        f"      working_directory: {ROOT}\n      location_name: sweeps\n")
    url = f"http://127.0.0.1:{free_port}"
    proc = server("dagster-dev", [str(BIN / "dagster"), "dev", "-w", str(tmp_path / "workspace.yaml"),
                                  "-h", "127.0.0.1", "-p", str(free_port)], lake_env)
    wait_for(url, proc, tmp_path / "dagster-dev.log")
    client = DagsterGraphQLClient("127.0.0.1", port_number=free_port)
    deadline = time.monotonic() + 120
    while True:  # the code location loads after the webserver answers
        started = client._execute('mutation { startSchedule(scheduleSelector: {repositoryLocationName: "sweeps", '
                                  'repositoryName: "__repository__", scheduleName: "sweep_tick"}) '
                                  '{ __typename ... on PythonError { message } } }')
        if started["startSchedule"]["__typename"] != "ScheduleNotFoundError" or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert started["startSchedule"]["__typename"] == "ScheduleStateResult", (started, (tmp_path / "dagster-dev.log").read_text()[-3000:])

    instance = DagsterInstance.from_config(lake_env["DAGSTER_HOME"])
    deadline = time.monotonic() + 420
    while True:
        runs = instance.get_runs(RunsFilter(tags={"factory/sweep": "tick"}))
        if len(runs) == 2 and all(r.status in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE) for r in runs):
            break
        assert time.monotonic() < deadline, f"runs so far: {[(r.tags.get('dagster/partition'), r.status) for r in runs]}"
        time.sleep(5)
    assert {r.status for r in runs} == {DagsterRunStatus.SUCCESS}
    assert {r.tags["dagster/schedule_name"] for r in runs} == {"sweep_tick"}
    from factory.lake import Lake
    from factory.train.checkpoint import checkpoints

    lake = Lake.open(home=lake_env["FACTORY_HOME"])
    for r in runs:
        assert [c["step"] for c in checkpoints(lake, r.tags["dagster/partition"])] == [2]
    # one training at a time: the second run started after the first ended
    spans = sorted((instance.get_run_record_by_id(r.run_id).start_time, instance.get_run_record_by_id(r.run_id).end_time)
                   for r in runs)
    assert spans[1][0] >= spans[0][1] - 1, spans


def test_experiment_submit_without_a_server_queues_into_the_instance_once(lake_env):
    """No webserver: `factory experiment submit` queues through jobs/queue_runs.py in a local process."""
    def submit():
        return subprocess.run([str(BIN / "factory"), "experiment", "submit", "smoke"], cwd=ROOT, env=lake_env,
                              capture_output=True, text=True, timeout=300)

    first = submit()
    assert first.returncode == 0, first.stderr
    assert "queued 1 run(s), 0 unchanged" in first.stdout, first.stdout
    instance = DagsterInstance.from_config(lake_env["DAGSTER_HOME"])
    from configs.experiments.smoke import smoke
    from factory.experiments.sweep import run_name

    (run,) = instance.get_runs(RunsFilter(tags={"dagster/partition": run_name(smoke())}))
    assert run.status == DagsterRunStatus.QUEUED and run.tags["dagster/priority"] == "0"
    config = run.run_config["ops"]["training_run"]["config"]
    assert json.loads(config["experiment_json"])["name"] == "smoke" and config["source"].endswith("smoke.py:smoke")
    assert (Path(lake_env["FACTORY_HOME"]) / "artifacts" / "runs" / run_name(smoke()) / "card.md").read_text() \
        .startswith("# Experiment `smoke`")
    second = submit()
    assert "queued 0 run(s), 1 unchanged" in second.stdout, second.stdout
    assert len(instance.get_runs(RunsFilter(tags={"dagster/partition": run_name(smoke())}))) == 1
