"""`tasks.function_completion` and `tasks.bug_fixing`: where derived tasks live, with lineage.

One derivation (one environment, one kind) is one commit: an overwrite filtered on the environment's
digest, so re-deriving an environment replaces its tasks (task ids are content hashes: the same
derivation writes the same rows) and never doubles them, and a derivation that kept nothing still
clears the environment's old rows. The commit carries its lineage row, kind `task_set`, whose
upstream is the environment build's version id (`env_build/<repo>@<revision>/<digest[:12]>`, the
envs store's convention) and whose content hash is the sha256 of the sorted task ids.

Only decontaminated tasks are stored: `decontam` names what each row was checked against, and the
lineage row's metadata lists what was dropped as contaminated, and the rejection counts.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json

import pyarrow as pa
from pyiceberg.expressions import EqualTo

from factory.lake import CommitStamp, Lake, LineageRecord
from factory.lake.schemas import TASKS
from factory.tasks.model import KINDS, DeriveConfig, Difficulty, Task, TaskSet
from factory.version import canonical_json, config_hash, env_lock_hash


def table_name(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"task kind {kind!r}: expected one of {', '.join(KINDS)}")
    return f"tasks.{kind}"


def env_build_version(repo: str, revision: str, digest: str) -> str:
    """The lineage version id of an environment build (the envs store writes the same)."""
    return f"env_build/{repo}@{revision}/{digest[:12]}"


def task_set_version(task_set: TaskSet) -> str:
    return f"task_set/{task_set.kind}/{task_set.repo}@{task_set.revision}/{task_set.env_digest[:12]}"


def content_hash(task_ids) -> str:
    return hashlib.sha256("\n".join(sorted(task_ids)).encode()).hexdigest()


def write_task_set(lake: Lake, task_set: TaskSet, *, config: DeriveConfig, run_id: str = "",
                   asset_key: str = "tasks", partition: str = "") -> int | None:
    """Commit `task_set`'s tasks (replacing its environment's rows) and its lineage row; the snapshot id."""
    name = table_name(task_set.kind)
    version = task_set_version(task_set)
    upstream = [env_build_version(task_set.repo, task_set.revision, task_set.env_digest)]
    ids = [t.task_id for t in task_set.tasks]
    now = dt.datetime.now(dt.timezone.utc)
    rows = [_row(t, task_set.decontam, version, now) for t in task_set.tasks]
    data = pa.Table.from_pylist(rows, schema=TASKS.as_arrow())
    digest = config_hash(config)
    stamp = CommitStamp(asset_key=asset_key, config_hash=digest, run_id=run_id, partition=partition,
                        content_hash=content_hash(ids))
    lineage = LineageRecord(
        version_id=version, kind="task_set", name=name, uri=f"iceberg://{name}", content_hash=content_hash(ids),
        upstream=upstream, config_json=canonical_json(config), config_hash=digest, code_version=stamp.code_version,
        env_lock=env_lock_hash(), asset_key=asset_key, partition=partition, run_id=run_id,
        metadata_json=canonical_json({"tasks": len(ids), "candidates": task_set.candidates,
                                      "rejected": task_set.rejected, "contaminated": task_set.contaminated,
                                      "decontam": task_set.decontam, "baseline_passed": task_set.baseline_passed}),
    )
    commit = lake.commit(name, data, stamp, mode="overwrite", overwrite_filter=EqualTo("env_digest", task_set.env_digest),
                         schema=TASKS, lineage=lineage)
    return commit.snapshot_id


def load_tasks(lake: Lake, kind: str, env_digest: str | None = None) -> list[Task]:
    """The stored tasks of `kind` (of one environment when `env_digest` is given), by task id."""
    name = table_name(kind)
    if not lake.has_table(name):
        return []
    table = lake.table(name)
    scan = table.scan(row_filter=EqualTo("env_digest", env_digest)) if env_digest else table.scan()
    return sorted((_task(r) for r in scan.to_arrow().to_pylist()), key=lambda t: t.task_id)


def _row(task: Task, decontam: str, version: str, now: dt.datetime) -> dict:
    d = task.difficulty
    return {"task_id": task.task_id, "kind": task.kind, "repo": task.repo, "revision": task.revision,
            "env_digest": task.env_digest, "env_root": task.env_root, "file": task.file, "target": task.target,
            "mutation": task.mutation, "prompt": task.prompt, "broken_overlay": canonical_json(task.broken_overlay),
            "reference": task.reference, "fail_to_pass": list(task.fail_to_pass),
            "pass_to_pass": list(task.pass_to_pass), "lines_removed": d.lines_removed,
            "tests_covering": d.tests_covering, "test_files": d.test_files, "complexity": d.complexity,
            "operator": d.operator, "seed": task.seed, "decontam": decontam, "task_set": version, "created_at": now,
            "reference_s": task.reference_s}


def _task(row: dict) -> Task:
    return Task(task_id=row["task_id"], kind=row["kind"], repo=row["repo"], revision=row["revision"],
                env_digest=row["env_digest"], env_root=row["env_root"], file=row["file"], target=row["target"],
                mutation=row["mutation"], prompt=row["prompt"], broken_overlay=json.loads(row["broken_overlay"]),
                reference=row["reference"], fail_to_pass=tuple(row["fail_to_pass"]),
                pass_to_pass=tuple(row["pass_to_pass"]), seed=row["seed"], reference_s=row["reference_s"],
                difficulty=Difficulty(lines_removed=row["lines_removed"], tests_covering=row["tests_covering"],
                                      test_files=row["test_files"], complexity=row["complexity"],
                                      operator=row["operator"]))
