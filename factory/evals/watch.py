"""Which checkpoints are due for evaluation: the eval sensor's logic, without Dagster.

The sensor's cursor is the `train.checkpoints` snapshot it last read. On each tick the new
checkpoints are the rows of the current snapshot that were not in the cursor's snapshot — a set
difference, so any number of checkpoints landing between two ticks (from any number of runs,
committed in any order) are all found, and none twice. A checkpoint is due when its step is a
multiple of its experiment's `eval_every`. If the cursor's snapshot has been expired, every row
counts as new; the run key (the checkpoint id) keeps the requests idempotent anyway.
"""

from __future__ import annotations

import json

from factory.lake import Lake
from factory.train.checkpoint import CHECKPOINTS_TABLE


def due_checkpoints(lake: Lake, cursor: str | None) -> tuple[list[dict], str | None]:
    """(rows of new checkpoints due for evaluation, in commit-independent step order; new cursor)."""
    if not lake.has_table(CHECKPOINTS_TABLE):
        return [], cursor
    table = lake.table(CHECKPOINTS_TABLE)
    current = table.current_snapshot()
    if current is None:
        return [], cursor
    seen_snapshot = json.loads(cursor)["snapshot_id"] if cursor else None
    if seen_snapshot == current.snapshot_id:
        return [], cursor
    seen: set[str] = set()
    if seen_snapshot is not None and table.snapshot_by_id(seen_snapshot) is not None:
        old = table.scan(snapshot_id=seen_snapshot, selected_fields=("checkpoint_id",)).to_arrow()
        seen = set(old.column("checkpoint_id").to_pylist())
    rows = table.scan(snapshot_id=current.snapshot_id).to_arrow().to_pylist()
    new = [r for r in rows if r["checkpoint_id"] not in seen]
    due = [r for r in new if r["eval_every"] > 0 and r["step"] % r["eval_every"] == 0]
    due.sort(key=lambda r: (r["run"], r["step"], r["checkpoint_id"]))
    return due, json.dumps({"snapshot_id": current.snapshot_id})
