"""Which checkpoints are due for evaluation: the eval sensor's logic, without Dagster.

The sensor's cursor is the `train.checkpoints` snapshot it last read. On each tick the new
checkpoints are the rows of the current snapshot that were not in the cursor's snapshot — a set
difference, so any number of checkpoints landing between two ticks (from any number of runs,
committed in any order) are all found, and none twice. A checkpoint is due when its step is a
multiple of its experiment's `eval_every`. If the cursor's snapshot has been expired, every row
counts as new; the run key (the checkpoint id) keeps the requests idempotent anyway.

A tick must cost what landed since the last one, not what the table holds (100k checkpoints
after 1,000 runs, each its own commit): when every snapshot after the cursor's is an append, the
new rows are exactly the rows of the data files those appends added, found through the manifests
they wrote — the table's other manifests and files are never opened. Anything else between the
two snapshots (an overwrite, a delete, a compaction) takes the full set difference. One case
differs from the full difference: a checkpoint id appended a second time (a run restarted from
scratch under the same name) is reported again; its run key is the checkpoint id, so Dagster
still starts no second eval. Asking the cursor's snapshot about the new ids would plan a scan
over every manifest, one per commit — 90% of a tick after 256 commits, minutes after 100k.

A due checkpoint that already has scores is not evaluated again, whoever scored it (`make demo`'s
`dagster asset materialize`, `factory eval`, an instance since wiped): `scored` asks
`evals.results` about the due ids only, so a tick with nothing due never opens that table, and a
first tick (no cursor: every checkpoint of the lake is new) skips what the demo already scored.
"""

from __future__ import annotations

import json

from pyiceberg.expressions import AlwaysTrue, In
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import ManifestContent, ManifestEntryStatus
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.snapshots import Operation

from factory.evals.results import RESULTS_TABLE
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
    new = _new_rows(table, seen_snapshot, current.snapshot_id)
    due = [r for r in new if r["eval_every"] > 0 and r["step"] % r["eval_every"] == 0]
    due.sort(key=lambda r: (r["run"], r["step"], r["checkpoint_id"]))
    return due, json.dumps({"snapshot_id": current.snapshot_id})


def scored(lake: Lake, checkpoint_ids: list[str]) -> set[str]:
    """The ids among `checkpoint_ids` that have rows in `evals.results` (any suite)."""
    if not checkpoint_ids or not lake.has_table(RESULTS_TABLE):
        return set()
    scan = lake.table(RESULTS_TABLE).scan(row_filter=In("checkpoint_id", checkpoint_ids),
                                          selected_fields=("checkpoint_id",))
    return set(scan.to_arrow().column("checkpoint_id").to_pylist())


def _new_rows(table: Table, seen: int | None, current: int) -> list[dict]:
    """Rows of snapshot `current` whose checkpoint id is not in snapshot `seen`."""
    if seen is None or table.snapshot_by_id(seen) is None:
        return table.scan(snapshot_id=current).to_arrow().to_pylist()
    added = _appended_files(table, seen, current)
    if added is None:
        old = table.scan(snapshot_id=seen, selected_fields=("checkpoint_id",)).to_arrow()
        known = set(old.column("checkpoint_id").to_pylist())
        return [r for r in table.scan(snapshot_id=current).to_arrow().to_pylist() if r["checkpoint_id"] not in known]
    if not added:
        return []
    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    return scan.to_table([FileScanTask(f) for f in added]).to_pylist()


def _appended_files(table: Table, seen: int, current: int) -> list | None:
    """The data files the snapshots after `seen` up to `current` appended, when those snapshots
    are all appends descending from `seen`; None otherwise (the caller diffs in full)."""
    snapshots = {s.snapshot_id: s for s in table.metadata.snapshots}
    between: set[int] = set()
    sid: int | None = current
    while sid != seen:
        snapshot = snapshots.get(sid) if sid is not None else None
        if snapshot is None or snapshot.summary is None or snapshot.summary.operation != Operation.APPEND:
            return None
        between.add(snapshot.snapshot_id)
        sid = snapshot.parent_snapshot_id
    files = []
    for manifest in snapshots[current].manifests(table.io):
        if manifest.added_snapshot_id not in between:
            continue
        if manifest.content != ManifestContent.DATA:
            return None
        files += [e.data_file for e in manifest.fetch_manifest_entry(table.io)
                  if e.status == ManifestEntryStatus.ADDED and e.snapshot_id in between]
    return files
