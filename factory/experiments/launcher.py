"""Submitting queued runs to Dagster from outside it, over Dagster's GraphQL API.

`factory experiment submit` and `factory sweep launch` talk to the factory the way the web UI
does: to a running webserver (`--url http://127.0.0.1:3000`, what `make ui` serves), or, with no
server up, through `dagster-graphql -w workspace.yaml`, which executes the same document in a
local process against the instance in `$DAGSTER_HOME` (runs wait in the queue until a daemon
picks them up). Either way this module speaks plain GraphQL over JSON, so the core still never
imports Dagster.

One launch is two documents, whatever the number of runs: a query for the runs that already
exist of each run's partition (its `dagster/partition` tag, whoever launched it: an unchanged
experiment is never rerun; a failed or canceled one may be), then one mutation that adds every
run's partition to its definition (`training_runs`, or `rl_runs` for an RL sweep's cells) and
launches every run of its job (`QueuedRun.job`), each under an alias. That is what makes a sweep
queue in about a second.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from factory.experiments.queue import RERUNNABLE, TRAINING_PARTITIONS, QueuedRun
from factory.home import CHECKOUT

LOCATION, REPOSITORY, PARTITIONS = "definitions", "__repository__", TRAINING_PARTITIONS
REPO = f'{{repositoryLocationName: "{LOCATION}", repositoryName: "{REPOSITORY}"}}'


class LaunchError(RuntimeError):
    """Dagster refused or could not be reached; the message says which and why."""


@dataclass(frozen=True)
class Submitted:
    run: str
    run_id: str | None  # None: skipped
    status: str  # QUEUED / ... for a new run; for a skipped one the existing run's status
    existing: str | None = None


class GraphQL:
    """Executes a document against `url`, or in-process with `dagster-graphql` when url is None."""

    def __init__(self, url: str | None = None, workspace: Path = CHECKOUT / "workspace.yaml", timeout: float = 120):
        self.url, self.workspace, self.timeout = url, workspace, timeout

    def __call__(self, document: str, variables: dict | None = None) -> dict:
        if self.url:
            request = urllib.request.Request(self.url.rstrip("/") + "/graphql", method="POST",
                                             data=json.dumps({"query": document, "variables": variables or {}}).encode(),
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    body = json.loads(response.read())
            except urllib.error.HTTPError as e:  # GraphQL errors come back as 400 with a JSON body
                try:
                    body = json.loads(e.read())
                except ValueError:
                    raise LaunchError(f"Dagster webserver at {self.url} answered {e.code}: {e.reason}") from None
            except (urllib.error.URLError, OSError) as e:
                raise LaunchError(f"cannot reach the Dagster webserver at {self.url}: {e} (start it with `make ui`, "
                                  "or leave out --url to queue through dagster-graphql)") from None
        else:
            body = self._local(document, variables)
        if body.get("errors"):
            raise LaunchError(f"Dagster GraphQL error: {body['errors'][0].get('message', body['errors'])}")
        return body["data"]

    def _local(self, document: str, variables: dict | None) -> dict:
        import tempfile

        exe = shutil.which("dagster-graphql", path=str(Path(sys.executable).parent)) or shutil.which("dagster-graphql")
        if not exe:
            raise LaunchError("dagster-graphql is not installed in this environment (pip install dagster-graphql)")
        with tempfile.TemporaryDirectory() as tmp:
            answer = Path(tmp) / "answer.json"  # stdout also carries the code location's logs
            done = subprocess.run([exe, "-w", str(self.workspace), "-t", document, "-v", json.dumps(variables or {}),
                                   "-o", str(answer)], cwd=self.workspace.parent, capture_output=True, text=True,
                                  timeout=self.timeout)
            if done.returncode or not answer.exists():
                raise LaunchError(f"dagster-graphql failed (exit {done.returncode}): "
                                  f"{(done.stderr or done.stdout)[-2000:]}")
            return json.loads(answer.read_text())


def existing_runs(gql: GraphQL, runs: list[str]) -> dict[str, list[dict]]:
    """run name -> Dagster runs of its `training_run` partition ({runId, status}), newest first."""
    if not runs:
        return {}
    fields = "\n".join(
        f'h{i}: runsOrError(filter: {{tags: [{{key: "dagster/partition", value: {json.dumps(h)}}}]}}) '
        f'{{ ... on Runs {{ results {{ runId status }} }} ... on PythonError {{ message }} }}'
        for i, h in enumerate(runs))
    data = gql(f"query {{ {fields} }}")
    out = {}
    for i, h in enumerate(runs):
        answer = data[f"h{i}"]
        if "message" in answer:
            raise LaunchError(f"Dagster could not list runs: {answer['message']}")
        out[h] = answer["results"]
    return out


def submit(runs: list[QueuedRun], gql: GraphQL, *, skip_existing: bool = True) -> list[Submitted]:
    """Queue `runs` (see the module docstring); results in input order."""
    seen = existing_runs(gql, sorted({r.run for r in runs})) if skip_existing else {}
    results: dict[int, Submitted] = {}
    todo = []
    for i, r in enumerate(runs):
        live = [x for x in seen.get(r.run, []) if x["status"] not in RERUNNABLE]
        if live:
            results[i] = Submitted(r.run, None, live[0]["status"], live[0]["runId"])
        else:
            todo.append((i, r))
    if todo:
        data = gql(_mutation([r.partitions for _, r in todo]), _variables(todo))
        for j, (i, r) in enumerate(todo):
            _check_added(data[f"p{j}"], r.run)
            launched = data[f"r{j}"]
            if launched["__typename"] != "LaunchRunSuccess":
                problem = launched.get("message") or "; ".join(e["message"] for e in launched.get("errors", []))
                raise LaunchError(f"{r.run}: launch refused ({launched['__typename']}): {problem}")
            results[i] = Submitted(r.run, launched["run"]["runId"], launched["run"]["status"])
    return [results[i] for i in range(len(runs))]


def _add_partition(alias: str, key: str, partitions: str = PARTITIONS) -> str:
    """A field adding the partition `key` (a GraphQL variable or string literal) to `partitions`."""
    return (f'{alias}: addDynamicPartition(partitionsDefName: {json.dumps(partitions)}, partitionKey: {key}, '
            f'repositorySelector: {REPO}) {{ __typename ... on Error {{ message }} }}')


def _check_added(answer: dict, run: str) -> None:
    if answer["__typename"] not in ("AddDynamicPartitionSuccess", "DuplicateDynamicPartitionError"):
        raise LaunchError(f"{run}: adding its partition failed: {answer.get('message', answer['__typename'])}")


def _mutation(partitions: list[str]) -> str:
    """Add run j's partition to `partitions[j]` and launch it, for every run."""
    params = ", ".join(f"$k{j}: String!, $e{j}: ExecutionParams!" for j in range(len(partitions)))
    body = "\n".join(
        _add_partition(f"p{j}", f"$k{j}", p) + "\n"
        f'r{j}: launchRun(executionParams: $e{j}) {{ __typename ... on LaunchRunSuccess {{ run {{ runId status }} }} '
        f'... on Error {{ message }} ... on RunConfigValidationInvalid {{ errors {{ message }} }} }}'
        for j, p in enumerate(partitions))
    return f"mutation Launch({params}) {{\n{body}\n}}"


def _variables(todo: list[tuple[int, QueuedRun]]) -> dict:
    out = {}
    for j, (_, r) in enumerate(todo):
        tags = {**r.tags, "dagster/partition": r.run}
        out[f"k{j}"] = r.run
        out[f"e{j}"] = {
            "selector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "jobName": r.job},
            "runConfigData": r.run_config,
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]},
        }
    return out


def add_partitions(runs: list[str], gql: GraphQL) -> None:
    """Add the runs' `training_run` partitions without launching anything (to materialize by hand:
    `dagster asset materialize --select training_run --partition <run>`)."""
    data = gql("mutation { " + "\n".join(_add_partition(f"p{j}", json.dumps(r)) for j, r in enumerate(runs)) + " }")
    for j, r in enumerate(runs):
        _check_added(data[f"p{j}"], r)
