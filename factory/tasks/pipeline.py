"""Tasks for a whole repository set: every environment the set's latest builds produced, derived
into tasks of one kind and stored (`derive_repo_set`). What the `tasks/<kind>` assets and
`factory tasks derive` call.

Design: the builds are read from `envs.builds` (the newest row per repository of the set), so
derivation never rebuilds anything and always names the exact environment (digest) it used; a
repository whose latest build did not pass, or whose environment directory is gone, is reported
as skipped with the reason, never silently. Each environment's tasks are one commit (store.py:
an overwrite of that environment's rows with a lineage row whose upstream is the build), so a
failure in the fifth repository keeps the first four's tasks and says which one failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from factory.envs.environment import Environment
from factory.envs.store import TESTS_TABLE, builds
from factory.lake import Lake
from factory.tasks.derive import derive_sandbox, derive_task_set
from factory.tasks.model import DeriveConfig, TaskSet
from factory.tasks.store import task_set_version, write_task_set


@dataclass
class RepoSetTasks:
    """What deriving one kind over one repository set came to."""

    kind: str
    repo_set: str
    task_sets: list[TaskSet] = field(default_factory=list)
    version_ids: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # repo -> why no tasks were derived from it
    seconds: float = 0.0

    @property
    def tasks(self) -> int:
        return sum(len(s.tasks) for s in self.task_sets)


def latest_builds(lake: Lake, repo_set: str) -> dict[str, dict]:
    """The newest envs.builds row of each repository of `repo_set` (by build time)."""
    latest: dict[str, dict] = {}
    for row in builds(lake, repo_set):  # oldest first: later rows replace earlier ones
        latest[row["repo"]] = row
    return latest


def derive_repo_set(lake: Lake, repo_set: str, kind: str, config: DeriveConfig, *, run_id: str = "",
                    asset_key: str = "tasks", log: Callable[[str], None] = print, parallel: int = 1) -> RepoSetTasks:
    """Derive and store tasks of `kind` from every passing environment of `repo_set`'s latest builds.

    `parallel` environments are derived at once (threads that each wait on sandboxed test runs),
    each with a sandbox of its own that runs one test run at a time, exactly as when it is derived
    alone: the same candidates are tried and the same tasks kept, whatever `parallel` is. Their
    commits keep the set's order, each as soon as its environment and those before it are done."""
    started = time.monotonic()
    latest = latest_builds(lake, repo_set)
    if not latest:
        raise LookupError(f"repository set {repo_set!r} has no builds in envs.builds; build it first "
                          f"(`factory envs build --repos {repo_set}` or materialize envs/builds, partition {repo_set})")
    result = RepoSetTasks(kind=kind, repo_set=repo_set)
    ready: list[tuple[str, Environment, tuple[str, ...]]] = []
    for repo, row in sorted(latest.items()):
        if row["failure_class"] != "passed":
            result.skipped[repo] = f"latest build {row['build_id'][:12]} is {row['failure_class']}"
            continue
        root = Path(row["env_uri"].removeprefix("file://"))
        if not (root / "env.json").exists():
            result.skipped[repo] = f"environment {row['env_digest'][:12]} is not at {root} (rebuild it)"
            continue
        ready.append((repo, Environment.load(root), _flaky(lake, row["build_id"])))

    def derive(env: Environment, flaky: tuple[str, ...]) -> TaskSet:
        log(f"{kind}: deriving from {env.repo}@{env.revision} ({env.digest[:12]}, {len(flaky)} flaky tests excluded)")
        return derive_task_set(env, kind, config, derive_sandbox(config), flaky=flaky)

    with ThreadPoolExecutor(max(parallel, 1), thread_name_prefix="derive") as pool:
        futures = [pool.submit(derive, env, flaky) for _, env, flaky in ready]
        try:
            for (repo, _, _), future in zip(ready, futures):
                task_set = future.result()
                write_task_set(lake, task_set, config=config, run_id=run_id, asset_key=asset_key, partition=repo_set)
                result.task_sets.append(task_set)
                result.version_ids.append(task_set_version(task_set))
                log(f"{kind}: {repo}: {len(task_set.tasks)} tasks from {task_set.candidates} candidates"
                    + (f"; rejected {dict(task_set.rejected)}" if task_set.rejected else ""))
        except BaseException:  # the environments not started yet are not derived (those before are stored)
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    result.seconds = time.monotonic() - started
    return result


def _flaky(lake: Lake, build_id: str) -> tuple[str, ...]:
    if not lake.has_table(TESTS_TABLE):
        return ()
    from pyiceberg.expressions import EqualTo

    rows = lake.table(TESTS_TABLE).scan(row_filter=EqualTo("build_id", build_id), selected_fields=("test_id", "flaky"))
    return tuple(sorted(r["test_id"] for r in rows.to_arrow().to_pylist() if r["flaky"]))
