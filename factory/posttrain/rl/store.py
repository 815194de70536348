"""`rl.rollouts`: every rollout sample of an RL run with its reward, verdict and lineage.

A step's rows are one append, committed after the update that used them and before its checkpoint,
stamped with the run's upstream (the start checkpoint or the newest RL checkpoint), so each row
leads to the policy version that sampled it, the task (`task_id`, `attempt_key` -> `tasks.attempts`)
and the environment (`env_digest`). A relaunched run drops the rows of steps after the checkpoint it
resumes from (they are regenerated, identically, from the same weights and seeds) in one overwrite
commit, so no rollout is counted twice.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from pyiceberg.expressions import And, EqualTo, GreaterThan

from factory.lake import Lake
from factory.lake.commit import CommitStamp
from factory.lake.schemas import RL_ROLLOUTS

ROLLOUTS_TABLE = "rl.rollouts"


def write_rollouts(lake: Lake, run: str, step: int, rows: list[dict], stamp: CommitStamp) -> None:
    now = dt.datetime.now(dt.timezone.utc)
    data = pa.Table.from_pylist([{"run": run, "step": step, "created_at": now, **r} for r in rows],
                                schema=RL_ROLLOUTS.as_arrow())
    lake.commit(ROLLOUTS_TABLE, data, stamp, schema=RL_ROLLOUTS)


def forget_after(lake: Lake, run: str, step: int, stamp: CommitStamp) -> int:
    """Drop `run`'s rows of steps after `step` (a resumed run regenerates them); how many there were."""
    if not lake.has_table(ROLLOUTS_TABLE):
        return 0
    later = And(EqualTo("run", run), GreaterThan("step", step))
    stale = lake.table(ROLLOUTS_TABLE).scan(row_filter=later, selected_fields=("step",)).to_arrow().num_rows
    if stale:
        empty = pa.Table.from_pylist([], schema=RL_ROLLOUTS.as_arrow())
        lake.commit(ROLLOUTS_TABLE, empty, stamp, mode="overwrite", overwrite_filter=later, schema=RL_ROLLOUTS)
    return stale


def rollouts(lake: Lake, run: str) -> list[dict]:
    """`run`'s rows, by step, group and sample."""
    if not lake.has_table(ROLLOUTS_TABLE):
        return []
    rows = lake.table(ROLLOUTS_TABLE).scan(row_filter=EqualTo("run", run)).to_arrow().to_pylist()
    return sorted(rows, key=lambda r: (r["step"], r["group"], r["sample"]))
