"""jobs/queue_runs.py, the no-server way `factory experiment submit|register` and `factory sweep
launch` queue runs (through `factory.experiments.launcher.LocalInstance`).

- fast tier (a `python jobs/queue_runs.py` subprocess, Dagster alone, no code server): partitions
  are added once; existing runs are listed by partition, newest first; a missing DAGSTER_HOME and
  an unknown request fail naming the instance and the cause; the cache key moves with any file the
  code location could read, and only with those.
- slow (code servers): the runs it queues, from a cold cache (it loads the code location once and
  keeps the snapshots) and from the warm cache (Dagster alone), are the runs the webserver's
  `launchRun` mutation makes for the same requests, field by field: job, tags, run config, status,
  job and execution plan snapshots, code origins, planned materializations of the partition — for
  a training run (`train_job`) and an RL run (`rl_job`).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter

from factory.experiments.launcher import PARTITIONS, LaunchError, LocalInstance, submit

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def dagster_home(tmp_path, monkeypatch):
    """A fresh instance with the factory's run queue, in DAGSTER_HOME for the processes started."""
    def make(name: str = "dagster") -> Path:
        home = tmp_path / name
        home.mkdir()
        shutil.copy(ROOT / "configs" / "dagster.yaml", home / "dagster.yaml")
        monkeypatch.setenv("DAGSTER_HOME", str(home))
        return home

    return make


@pytest.mark.slow
def test_partitions_are_added_once_and_runs_are_listed_by_partition(dagster_home):
    home = dagster_home()
    with LocalInstance() as queue:
        queue.add_partitions(PARTITIONS, ["smoke-00000001", "smoke-00000002"])
        queue.add_partitions(PARTITIONS, ["smoke-00000002", "smoke-00000003"])
        assert queue.existing(["smoke-00000001"]) == {"smoke-00000001": []}
    with DagsterInstance.from_config(str(home)) as instance:
        assert sorted(instance.get_dynamic_partitions(PARTITIONS)) == [f"smoke-0000000{i}" for i in (1, 2, 3)]
        for status in (DagsterRunStatus.FAILURE, DagsterRunStatus.SUCCESS):  # the second is the newer
            instance.add_run(_run(instance, "smoke-00000001", status))
    with LocalInstance() as queue:
        listed = queue.existing(["smoke-00000001", "smoke-00000009"])
    assert [r["status"] for r in listed["smoke-00000001"]] == ["SUCCESS", "FAILURE"] and listed["smoke-00000009"] == []


def _run(instance, partition: str, status):
    from dagster._core.storage.dagster_run import DagsterRun
    from dagster._core.utils import make_new_run_id

    return DagsterRun(job_name="train_job", run_id=make_new_run_id(), status=status,
                      tags={"dagster/partition": partition})


def test_a_missing_instance_and_an_unknown_request_fail_naming_the_cause(dagster_home, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    with pytest.raises(LaunchError, match=r"listing runs in the Dagster instance in \(DAGSTER_HOME unset\) failed: "
                                          r"queue_runs\.py exited \(1\): cannot open the Dagster instance: .*DAGSTER_HOME"):
        with LocalInstance() as queue:
            queue.existing(["smoke-00000001"])
    home = dagster_home()
    with LocalInstance() as queue:
        with pytest.raises(LaunchError, match=f"nothing in the Dagster instance in {home} failed: unknown op 'sweep'"):
            queue._ask({"op": "sweep"}, "nothing")
        assert queue.existing([]) == {}  # the process answers on after a refused request


def _script():
    """jobs/queue_runs.py as a module (it runs by path; `jobs` the package would import every asset)."""
    sys.path.insert(0, str(ROOT / "jobs"))
    try:
        import queue_runs
    finally:
        sys.path.remove(str(ROOT / "jobs"))
    return queue_runs


def test_the_cache_key_moves_with_any_file_the_code_location_could_read(tmp_path):
    KEYED, code_key = _script().KEYED, _script().code_key
    for entry in KEYED:
        path = tmp_path / entry if entry.endswith((".py", ".yaml")) else tmp_path / entry / "a" / "m.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n")
    (tmp_path / "factory" / "__pycache__").mkdir()
    key = code_key(tmp_path)
    (tmp_path / "factory" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"bytecode")
    (tmp_path / "README.md").write_text("not read by the code location")
    assert code_key(tmp_path) == key
    for changed in ("configs/a/m.py", "definitions.py", "workspace.yaml"):
        (tmp_path / changed).write_text("x = 2\n")
        assert code_key(tmp_path) != key, changed
        key = code_key(tmp_path)
    (tmp_path / "configs" / "sweeps").mkdir()
    (tmp_path / "configs" / "sweeps" / "new.py").write_text("")  # discovery lists the directory
    assert code_key(tmp_path) != key


# -- the same runs as the webserver's mutation ------------------------------------------------------------
def _requests():
    """Two training cells of a sweep and one RL run, as `factory sweep launch` builds them (unplanned)."""
    from configs.experiments.rl_toy import rl_toy
    from configs.experiments.smoke import smoke
    from factory.experiments.queue import RL_JOB, RL_PARTITIONS, QueuedRun, _tags
    from factory.experiments.sweep import run_name

    runs = []
    for lr in (1e-3, 2e-3):
        experiment = smoke().derive(optimizer={"lr": lr, "weight_decay": 0.1})
        runs.append(QueuedRun(run=run_name(experiment), experiment=experiment, config_hash="-", card="", card_path="",
                              tokens=0, steps=1, source=f"test cell lr={lr}", tags=_tags("sweep", {"factory/sweep": "t"})))
    rl = rl_toy()
    runs.append(QueuedRun(run=rl.name, experiment=rl, config_hash="-", card="", card_path="", tokens=0, steps=1,
                          source="test", tags=_tags("training", None), job=RL_JOB, partitions=RL_PARTITIONS))
    return runs


def _through_the_webserver_mutation(runs) -> None:
    """What `launchRun` / `addDynamicPartition` do in the webserver (the launcher's own documents),
    in-process against a code server of workspace.yaml, as dagster-graphql ran them."""
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget
    from dagster_graphql.cli import execute_query

    from factory.experiments.launcher import _mutation, _variables

    with DagsterInstance.get() as instance, \
            WorkspaceProcessContext(instance, WorkspaceFileTarget([str(ROOT / "workspace.yaml")])) as context:
        result = execute_query(context, _mutation([r.partitions for r in runs]), _variables(runs))
    assert "errors" not in result, result
    assert {v["__typename"] for k, v in result["data"].items() if k.startswith("r")} == {"LaunchRunSuccess"}


def _queued(home: Path) -> dict[str, dict]:
    """partition -> what a run is, its ids left out."""
    with DagsterInstance.from_config(str(home)) as instance:
        out = {}
        for run in instance.get_runs(RunsFilter()):
            planned = [e.dagster_event for e in instance.all_logs(run.run_id)
                       if e.dagster_event and e.dagster_event.event_type == DagsterEventType.ASSET_MATERIALIZATION_PLANNED]
            out[run.tags["dagster/partition"]] = {
                "job": run.job_name, "tags": run.tags, "run_config": run.run_config, "status": run.status,
                "job_snapshot": run.job_snapshot_id, "plan_snapshot": run.execution_plan_snapshot_id,
                "steps": run.step_keys_to_execute, "remote_origin": run.remote_job_origin,
                "code_origin": run.job_code_origin, "asset_selection": run.asset_selection,
                "planned": [(e.asset_key, e.partition) for e in planned],
                "partitions": sorted(instance.get_dynamic_partitions("training_runs")
                                     + instance.get_dynamic_partitions("rl_runs")),
            }
        return out


@pytest.mark.slow
def test_runs_from_a_cold_and_a_warm_cache_are_the_webservers_runs(dagster_home, tmp_path):
    runs, cache = _requests(), tmp_path / "snapshots.json"
    reference = dagster_home("reference")
    _through_the_webserver_mutation(runs)
    expected = _queued(reference)
    assert len(expected) == 3 and {r["status"] for r in expected.values()} == {DagsterRunStatus.QUEUED}
    assert all(r["planned"] for r in expected.values())

    for name in ("cold", "warm"):
        home = dagster_home(name)
        written, key = (cache.stat().st_mtime_ns if cache.exists() else None), _script().code_key()
        with LocalInstance(cache=cache) as queue:
            submitted = submit(runs, queue)
        assert [s.status for s in submitted] == ["QUEUED"] * 3
        if name == "cold":
            assert cache.stat().st_mtime_ns != written
        elif _script().code_key() == key:  # (unless someone edited the checkout meanwhile: then it captured again)
            assert cache.stat().st_mtime_ns == written  # warm: Dagster alone, nothing captured
        assert _queued(home) == expected, name
        with LocalInstance(cache=cache) as queue:  # unchanged: nothing queued twice
            assert [s.run_id for s in submit(runs, queue)] == [None] * 3
