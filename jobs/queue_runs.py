"""Queue runs into the Dagster instance in $DAGSTER_HOME with no server, from one small process:
`factory experiment submit|register` and `factory sweep launch` without `--url`.

Run by path (`python jobs/queue_runs.py [--cache FILE]`), not `-m jobs.queue_runs`, so
`jobs/__init__` (the asset jobs, hence every asset module) is not imported. It answers JSON
requests, one per line on stdin, with one JSON line each on stdout, until stdin closes; the caller
(`factory.experiments.launcher.LocalInstance`) starts it first and plans its runs while Dagster
imports here, and keeps the skip rule (which existing runs block a new one) on its side:

    {"op": "existing", "runs": [name, ...]}          -> {"existing": {name: [{"runId", "status"}, ...]}}
    {"op": "add_partitions", "partitions": P, "keys": [...]}  -> {"added": [keys that were new]}
    {"op": "launch", "runs": [{"run", "job", "partitions", "run_config", "tags"}, ...]}
                                                      -> {"launched": [[added, launched], ...]}
    anything that fails                               -> {"error": "what and why"}

`existing` lists every run whose `dagster/partition` tag is the name, newest first. `launch` does,
per run, what the webserver's `addDynamicPartition` and `launchRun` mutations do, and answers in
their GraphQL shapes (`__typename` ...), so the caller checks both paths alike: add the partition
(refused when no asset of the repository uses that dynamic partitions definition), validate the
run config against the job's config schema, create the run with the job's snapshot, its execution
plan's snapshot and its code origins (which also logs the planned materialization of the
partition), and submit it to the instance's run queue (a QueuedRunCoordinator is required: the
daemon of `make ui` starts the runs).

Why not `dagster-graphql -w workspace.yaml`, as before: that starts a code server that imports
every asset module (torch, Spark; ~5 s of CPU) for each document, and a launch was two documents
(~17 s for four sweep cells). Creating a run needs only what the code server reports about the job:
the repository's snapshot and code origins, the job's snapshot and its execution plan. Those are
kept in a cache file (default `.cache/queue_runs.snapshots` in the checkout) under a key that
hashes every file the code location could import or read (`definitions.py`, `workspace.yaml`,
`assets/`, `resources/`, `jobs/`, `sensors/`, `factory/`, `configs/`, `kernels/`), the Python
executable and the Dagster version. On a miss (any edit there, a new job) this process loads the
code location once through `workspace.yaml`, as dagster-graphql did, so the cached pieces are the
very ones the webserver would use, and writes the cache; on a hit it imports Dagster alone. The
execution plan is cached per job, not per run config: for an asset job the plan is its op graph and
executor, which a run's op config does not change (tests/dagster/test_queue_runs.py compares the
runs this makes with the webserver mutation's, field by field).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

CHECKOUT = Path(__file__).resolve().parents[1]
WORKSPACE = CHECKOUT / "workspace.yaml"
LOCATION, REPOSITORY = "definitions", "__repository__"
# What the code location can import or read when it loads (discovery reads configs/ by listing it).
KEYED = ("definitions.py", "workspace.yaml", "assets", "resources", "jobs", "sensors", "factory", "configs", "kernels")


def code_key(root: Path = CHECKOUT) -> str:
    """A hash of every file under KEYED (path and content), the interpreter and Dagster's version."""
    from dagster.version import __version__

    digest = hashlib.sha256(f"{sys.executable}\0{__version__}\0".encode())
    for entry in KEYED:
        top = root / entry
        paths = [top] if top.is_file() else sorted(
            Path(d) / f for d, dirs, files in os.walk(top) if "__pycache__" not in Path(d).parts for f in files)
        for path in paths:
            if path.suffix in (".pyc", ".pyo"):
                continue
            digest.update(f"{path.relative_to(root)}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


class Snapshots:
    """The repository as the code server reports it, plus the execution plans of the jobs launched so far."""

    def __init__(self, cache: Path, instance: DagsterInstance):
        self.cache, self.instance, self.key = cache, instance, code_key()
        self.repo, self.plans = None, {}
        try:
            self._load(json.loads(cache.read_text()))
        except Exception:  # noqa: BLE001 - none yet, or one this Dagster cannot read: captured on first use
            self.repo, self.plans = None, {}

    def _load(self, stored: dict) -> None:
        from dagster._core.remote_representation.external import RemoteRepository
        from dagster._serdes import deserialize_value

        if stored["key"] != self.key:
            return
        jobs = {name: deserialize_value(data) for name, data in stored["jobs"].items()}
        self.repo = RemoteRepository(deserialize_value(stored["repository"]), deserialize_value(stored["handle"]),
                                     auto_materialize_use_sensors=self.instance.auto_materialize_use_sensors,
                                     ref_to_data_fn=lambda ref: jobs[ref.name])
        self.plans = {name: deserialize_value(plan) for name, plan in stored["plans"].items()}

    def prepare(self, configs: dict[str, dict]) -> None:
        """Make sure the jobs of `configs` (job -> a run config of it) are cached: one capture for all."""
        missing = {name: c for name, c in configs.items() if self.repo is None or name not in self.plans}
        if missing:
            self._capture(missing)

    def job(self, name: str):
        """(remote job, execution plan snapshot, repository) of a prepared job."""
        return self.repo.get_full_job(name), self.plans[name], self.repo

    def _capture(self, configs: dict[str, dict]) -> None:
        """Load the code location through workspace.yaml (a code server, as dagster-graphql and the
        webserver do), keep what launching the jobs of `configs` needs, and write the cache."""
        from dagster._core.workspace.context import WorkspaceProcessContext
        from dagster._core.workspace.load_target import WorkspaceFileTarget
        from dagster._serdes import serialize_value

        with WorkspaceProcessContext(self.instance, WorkspaceFileTarget([str(WORKSPACE)])) as process:
            context = process.create_request_context()
            error = context.get_code_location_error(LOCATION)
            if error is not None:
                raise QueueError(f"the code location of {WORKSPACE} does not load: {error.to_string()}")
            location = context.get_code_location(LOCATION)
            repo = location.get_repository(REPOSITORY)
            unknown = sorted(set(configs) - {j.name for j in repo.get_all_jobs()})
            if unknown:
                raise QueueError(f"the code location of {WORKSPACE} has no job {', '.join(unknown)}")
            jobs = {j.name: serialize_value(j.job_data_snap) for j in repo.get_all_jobs()}
            plans = {n: serialize_value(p) for n, p in self.plans.items()}  # the same key: still good
            for name, run_config in configs.items():
                plan = location.get_execution_plan(repo.get_full_job(name), run_config, None, None, self.instance)
                plans[name] = serialize_value(plan.execution_plan_snapshot)
            stored = {"key": self.key, "repository": serialize_value(repo.repository_snap),
                      "handle": serialize_value(repo.handle), "jobs": jobs, "plans": plans}
        self._load(stored)
        try:
            self.cache.parent.mkdir(parents=True, exist_ok=True)
            scratch = self.cache.with_name(f"{self.cache.name}.{os.getpid()}")
            scratch.write_text(json.dumps(stored))
            scratch.replace(self.cache)  # whole or not at all, whoever else writes it
        except OSError:
            pass  # a read-only checkout: every launch captures


class QueueError(Exception):
    """Answered as {"error": ...}: the message names what failed."""


def existing(instance: DagsterInstance, runs: list[str]) -> dict:
    return {"existing": {run: [{"runId": r.run_id, "status": r.status.value}
                               for r in instance.get_runs(RunsFilter(tags={"dagster/partition": run}))]
                         for run in runs}}


def add_partitions(instance: DagsterInstance, partitions: str, keys: list[str]) -> dict:
    new = [k for k in dict.fromkeys(keys) if not instance.has_dynamic_partition(partitions, k)]
    if new:
        instance.add_dynamic_partitions(partitions, new)
    return {"added": new}


def launch(instance: DagsterInstance, snapshots: Snapshots, runs: list[dict]) -> dict:
    from dagster._core.run_coordinator import QueuedRunCoordinator

    if not isinstance(instance.run_coordinator, QueuedRunCoordinator):
        raise QueueError(f"the Dagster instance in {instance.root_directory} does not queue runs (run "
                         f"coordinator {type(instance.run_coordinator).__name__}): write it with `factory deploy "
                         "instance`, or launch through a webserver with --url")
    snapshots.prepare({r["job"]: r["run_config"] for r in runs})
    return {"launched": [[_add_partition(instance, snapshots, r), _launch_run(instance, snapshots, r)] for r in runs]}


def _add_partition(instance: DagsterInstance, snapshots: Snapshots, r: dict) -> dict:
    from dagster._core.definitions.partitions.snap import DynamicPartitionsSnap, MultiPartitionsSnap

    _, _, repo = snapshots.job(r["job"])

    def uses(snap) -> bool:
        if isinstance(snap, MultiPartitionsSnap):
            return any(uses(d.partitions) for d in snap.partition_dimensions)
        return isinstance(snap, DynamicPartitionsSnap) and snap.name == r["partitions"]

    if not any(uses(node.partitions) for node in repo.repository_snap.asset_nodes if node.partitions):
        return {"__typename": "UnauthorizedError",
                "message": "The repository does not contain a dynamic partitions definition with the given name."}
    if instance.has_dynamic_partition(r["partitions"], r["run"]):
        return {"__typename": "DuplicateDynamicPartitionError"}
    instance.add_dynamic_partitions(r["partitions"], [r["run"]])
    return {"__typename": "AddDynamicPartitionSuccess"}


def _launch_run(instance: DagsterInstance, snapshots: Snapshots, r: dict) -> dict:
    """What the launchRun mutation does for a whole job (dagster_graphql's create_valid_pipeline_run)."""
    from dagster._config import validate_config_from_snap
    from dagster._utils.merger import merge_dicts

    job, plan, repo = snapshots.job(r["job"])
    valid = validate_config_from_snap(job.config_schema_snapshot, job.root_config_key, r["run_config"])
    if not valid.success:
        return {"__typename": "RunConfigValidationInvalid", "errors": [{"message": e.message} for e in valid.errors]}
    run = instance.create_run(
        job_name=job.name, run_id=None, run_config=r["run_config"], status=DagsterRunStatus.NOT_STARTED,
        tags=merge_dicts(job.tags, r["tags"]), root_run_id=None, parent_run_id=None,
        step_keys_to_execute=plan.step_keys_to_execute, execution_plan_snapshot=plan,
        job_snapshot=job.job_snapshot, parent_job_snapshot=job.parent_job_snapshot, asset_selection=None,
        asset_check_selection=None, resolved_op_selection=None, op_selection=None,
        remote_job_origin=job.get_remote_origin(), job_code_origin=job.get_python_origin(),
        asset_graph=repo.asset_graph)
    run = instance.submit_run(run.run_id, workspace=None)
    return {"__typename": "LaunchRunSuccess", "run": {"runId": run.run_id, "status": run.status.value}}


def answer(instance: DagsterInstance, snapshots: Snapshots, request: dict) -> dict:
    op = request.get("op")
    if op == "existing":
        return existing(instance, request["runs"])
    if op == "add_partitions":
        return add_partitions(instance, request["partitions"], request["keys"])
    if op == "launch":
        return launch(instance, snapshots, request["runs"])
    raise QueueError(f"unknown op {op!r} (existing, add_partitions, launch)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=CHECKOUT / ".cache" / "queue_runs.snapshots")
    args = parser.parse_args(argv)
    # The answers own stdout; anything else written there (this process's or the code server's
    # logs, which inherit the descriptor) goes to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        instance = DagsterInstance.get()
    except Exception as e:  # noqa: BLE001 - DAGSTER_HOME unset or its dagster.yaml broken: said on stderr
        print(f"cannot open the Dagster instance: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    with instance:
        snapshots = None
        for line in sys.stdin:
            try:
                request = json.loads(line)
                if request.get("op") == "launch" and snapshots is None:
                    snapshots = Snapshots(args.cache, instance)
                reply = answer(instance, snapshots, request)
            except QueueError as e:
                reply = {"error": str(e)}
            except Exception as e:  # noqa: BLE001 - the caller shows it, naming this process
                reply = {"error": f"{type(e).__name__}: {e}"}
            print(json.dumps(reply), file=replies, flush=True)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # Every answer is written and the instance disposed (its sqlite connections closed): skip the
    # interpreter's teardown of Dagster's thousands of modules and the snapshots, which took 1-3 s
    # here while the caller waited for the process to end.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
