"""Stream a pinned table snapshot as Arrow record batches, file by file.

Training and tokenizer sampling must never hold a whole table in memory, and a resumable reader
needs positions that mean the same thing after a restart. So the unit here is the snapshot's
data file list (sorted by path: the order is part of a position's meaning) and, inside a file,
record batches of a fixed row count. Files are opened through the table's FileIO, so the same
code reads `file://` and object storage.

The factory's tables are copy-on-write (pyiceberg writes no delete files); a snapshot that has
delete files is refused rather than read wrongly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from factory.lake.catalog import Lake


@dataclass(frozen=True)
class DataFile:
    """One Parquet data file of a snapshot."""

    path: str
    rows: int
    bytes: int


@dataclass(frozen=True)
class PinnedSnapshot:
    """A table at one snapshot, with its data files in a fixed order."""

    table: str
    snapshot_id: int
    files: tuple[DataFile, ...]

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)


def pin_snapshot(lake: "Lake", table: str, snapshot_id: int | None = None) -> PinnedSnapshot:
    """The data files of `table` at `snapshot_id` (default: current); errors name the table."""
    from factory.lake.catalog import LakeError

    t = lake.table(table)
    if snapshot_id is None:
        current = t.current_snapshot()
        if current is None:
            raise LakeError(f"table {table} has no snapshot yet (it was never written)")
        snapshot_id = current.snapshot_id
    elif t.snapshot_by_id(snapshot_id) is None:
        raise LakeError(f"table {table} has no snapshot {snapshot_id} (expired or never existed)")
    files = []
    for task in t.scan(snapshot_id=snapshot_id).plan_files():
        if task.delete_files:
            raise LakeError(f"table {table}@{snapshot_id} has delete files; the streaming reader "
                            "only reads copy-on-write snapshots")
        files.append(DataFile(task.file.file_path, task.file.record_count, task.file.file_size_in_bytes))
    return PinnedSnapshot(table, snapshot_id, tuple(sorted(files, key=lambda f: f.path)))


def file_batches(table: "Table", file: DataFile, columns: list[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Record batches of at most `batch_rows` rows of one data file, in file order."""
    with table.io.new_input(file.path).open() as stream:
        yield from pq.ParquetFile(stream).iter_batches(batch_size=batch_rows, columns=columns)


def stream_snapshot(lake: "Lake", pinned: PinnedSnapshot, columns: list[str], batch_rows: int = 1024) -> Iterator[pa.RecordBatch]:
    """Every record batch of a pinned snapshot, file by file."""
    table = lake.table(pinned.table)
    for file in pinned.files:
        yield from file_batches(table, file, columns, batch_rows)
