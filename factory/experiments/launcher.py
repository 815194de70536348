"""Queueing runs in Dagster from outside it: to a webserver, or into $DAGSTER_HOME with no server.

`factory experiment submit` and `factory sweep launch` queue runs one of two ways, chosen by
`queue_for(url)`:
- `GraphQL`: to a running webserver (`--url http://127.0.0.1:3000`, what `make ui` serves), over
  Dagster's GraphQL API, the way the web UI does.
- `LocalInstance`: with no server, into the instance in `$DAGSTER_HOME` (runs wait in the queue
  until a daemon picks them up), through `jobs/queue_runs.py`, one small process that imports
  Dagster alone and keeps what the code server knows about a job in a cache (its docstring says
  how), instead of `dagster-graphql`, which loaded every asset module for each document. It starts
  when the command does, so Dagster imports while the runs are planned against the lake.
Either way this module imports no Dagster.

One launch is two questions, whatever the number of runs: which runs already exist of each run's
partition (its `dagster/partition` tag, whoever launched it: an unchanged experiment is never
rerun; a failed or canceled one may be), then add every run's partition to its definition
(`training_runs`, or `rl_runs` for an RL sweep's cells) and launch every run of its job
(`QueuedRun.job`). Both ways answer in the webserver's GraphQL shapes, and `submit` alone decides
what to skip and checks the answers.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from factory import settings
from factory.experiments.queue import RERUNNABLE, TRAINING_PARTITIONS, QueuedRun
from factory.home import CHECKOUT

LOCATION, REPOSITORY, PARTITIONS = "definitions", "__repository__", TRAINING_PARTITIONS
REPO = f'{{repositoryLocationName: "{LOCATION}", repositoryName: "{REPOSITORY}"}}'
QUEUE_SCRIPT = CHECKOUT / "jobs" / "queue_runs.py"


class LaunchError(RuntimeError):
    """Dagster refused or could not be reached; the message says which and why."""


@dataclass(frozen=True)
class Submitted:
    run: str
    run_id: str | None  # None: skipped
    status: str  # QUEUED / ... for a new run; for a skipped one the existing run's status
    existing: str | None = None


class GraphQL:
    """A Dagster webserver at `url`: each question is one GraphQL document over HTTP."""

    def __init__(self, url: str, timeout: float = 120):
        self.url, self.timeout = url, timeout

    def __enter__(self) -> GraphQL:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def __call__(self, document: str, variables: dict | None = None) -> dict:
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
                              "or leave out --url to queue into $DAGSTER_HOME with no server)") from None
        if body.get("errors"):
            raise LaunchError(f"Dagster GraphQL error: {body['errors'][0].get('message', body['errors'])}")
        return body["data"]

    def existing(self, runs: list[str]) -> dict[str, list[dict]]:
        """run name -> Dagster runs of its partition ({runId, status}), newest first."""
        fields = "\n".join(
            f'h{i}: runsOrError(filter: {{tags: [{{key: "dagster/partition", value: {json.dumps(h)}}}]}}) '
            f'{{ ... on Runs {{ results {{ runId status }} }} ... on PythonError {{ message }} }}'
            for i, h in enumerate(runs))
        data = self(f"query {{ {fields} }}")
        out = {}
        for i, h in enumerate(runs):
            answer = data[f"h{i}"]
            if "message" in answer:
                raise LaunchError(f"Dagster could not list runs: {answer['message']}")
            out[h] = answer["results"]
        return out

    def launch(self, runs: list[QueuedRun]) -> list[tuple[dict, dict]]:
        """(addDynamicPartition answer, launchRun answer) of each run, in one mutation."""
        data = self(_mutation([r.partitions for r in runs]), _variables(runs))
        return [(data[f"p{j}"], data[f"r{j}"]) for j in range(len(runs))]

    def add_partitions(self, partitions: str, keys: list[str]) -> None:
        data = self("mutation { " + "\n".join(_add_partition(f"p{j}", json.dumps(k), partitions)
                                                for j, k in enumerate(keys)) + " }")
        for j, k in enumerate(keys):
            _check_added(data[f"p{j}"], k)


class LocalInstance:
    """The instance in $DAGSTER_HOME, through `jobs/queue_runs.py` (one process for every question,
    started here: Dagster imports while the caller plans its runs). Use it as a context manager."""

    def __init__(self, timeout: float = 600, cache: Path | None = None):
        self.timeout = timeout
        self._stderr = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: its logs never block it
        command = [sys.executable, str(QUEUE_SCRIPT), *(["--cache", str(cache)] if cache else [])]
        self._process = subprocess.Popen(command, cwd=CHECKOUT, env=settings.environment(), text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr)

    def __enter__(self) -> LocalInstance:
        return self

    def __exit__(self, kind, *exc) -> None:
        self.close(kill=kind is not None)

    def close(self, kill: bool = False) -> None:
        """Let the process finish (stdin closed); `kill`: stop it now (nothing asked, or an error)."""
        if self._process.poll() is None:
            if kill:
                self._process.kill()
            else:
                self._process.stdin.close()
            try:
                self._process.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._stderr.close()

    def _ask(self, request: dict, doing: str) -> dict:
        where = f"{doing} in the Dagster instance in {settings.get('DAGSTER_HOME') or '(DAGSTER_HOME unset)'}"
        try:
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            pass  # it has exited: said below
        ready, _, _ = select.select([self._process.stdout], [], [], self.timeout)
        if not ready:
            self._process.kill()
            raise LaunchError(f"{where}: no answer from {QUEUE_SCRIPT.name} in {self.timeout:.0f} s")
        line = self._process.stdout.readline()
        if not line:
            code = self._process.wait()
            self._stderr.seek(0)
            raise LaunchError(f"{where} failed: {QUEUE_SCRIPT.name} exited ({code}): "
                              f"{self._stderr.read().strip()[-2000:]}")
        reply = json.loads(line)
        if "error" in reply:
            raise LaunchError(f"{where} failed: {reply['error']}")
        return reply

    def existing(self, runs: list[str]) -> dict[str, list[dict]]:
        return self._ask({"op": "existing", "runs": runs}, "listing runs")["existing"]

    def launch(self, runs: list[QueuedRun]) -> list[tuple[dict, dict]]:
        request = [{"run": r.run, "job": r.job, "partitions": r.partitions, "run_config": r.run_config,
                    "tags": {**r.tags, "dagster/partition": r.run}} for r in runs]
        return [tuple(x) for x in self._ask({"op": "launch", "runs": request}, "queueing runs")["launched"]]

    def add_partitions(self, partitions: str, keys: list[str]) -> None:
        self._ask({"op": "add_partitions", "partitions": partitions, "keys": keys},
                  f"adding the {partitions} partitions {', '.join(keys)}")


def queue_for(url: str | None) -> GraphQL | LocalInstance:
    """The webserver at `url`, else the instance in $DAGSTER_HOME (its process starts now)."""
    return GraphQL(url) if url else LocalInstance()


def submit(runs: list[QueuedRun], queue: GraphQL | LocalInstance, *, skip_existing: bool = True) -> list[Submitted]:
    """Queue `runs` (see the module docstring); results in input order."""
    seen = queue.existing(sorted({r.run for r in runs})) if skip_existing and runs else {}
    results: dict[int, Submitted] = {}
    todo = []
    for i, r in enumerate(runs):
        live = [x for x in seen.get(r.run, []) if x["status"] not in RERUNNABLE]
        if live:
            results[i] = Submitted(r.run, None, live[0]["status"], live[0]["runId"])
        else:
            todo.append((i, r))
    if todo:
        answers = queue.launch([r for _, r in todo])
        for (i, r), (added, launched) in zip(todo, answers):
            _check_added(added, r.run)
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


def _variables(runs: list[QueuedRun]) -> dict:
    out = {}
    for j, r in enumerate(runs):
        tags = {**r.tags, "dagster/partition": r.run}
        out[f"k{j}"] = r.run
        out[f"e{j}"] = {
            "selector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "jobName": r.job},
            "runConfigData": r.run_config,
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]},
        }
    return out
