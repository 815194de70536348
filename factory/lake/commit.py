"""The one commit path: stamped, atomic, retried.

Every write to the lake goes through `commit_with_retry`, which

1. stamps the snapshot summary with where the data came from (asset key, partition, Dagster run
   id, code version, environment lock, config hash, upstream snapshot ids, a content hash — the
   writer's, else one computed from the data — and, when the commit has one, the lineage row it
   owes), so a snapshot explains itself even without the lineage table, and a lineage row lost to
   a crash can be written again from the snapshot alone (`LineageStore.heal`). Only the snapshot
   that holds the new data carries the lineage row: an overwrite is a delete snapshot (base
   stamp) followed by an append (base stamp + row), so no intermediate snapshot claims a row;
2. writes the data files, then commits the metadata in one step — a crash before the metadata
   commit leaves the table at its previous snapshot (the written files are orphans, never data);
3. reloads the table and tries again with jittered backoff when another writer committed first
   (`CommitFailedException`). pyiceberg does not retry by itself, and a sqlite catalog also
   reports "database is locked" under contention, which is retried the same way. The retries are
   bounded by time, not by count: writers that commit back to back can make one writer lose many
   rounds in a row (4 processes x 50 appends made one give up after 12 attempts), and it wins as
   soon as they pause, so what has to be bounded is how long it waits.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
import warnings
from typing import Callable, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.table import Table
from sqlalchemy.exc import OperationalError

from factory.health import metrics as health
from factory.version import code_version, env_lock_hash

log = logging.getLogger(__name__)

PREFIX = "factory."
LINEAGE_KEY = "lineage"  # the summary property holding the lineage row a snapshot owes (lineage.owed_record)
RETRY_FOR_S = 120.0  # give up when conflicts keep a commit out this long
BASE_DELAY_S = 0.05
MAX_DELAY_S = 1.0


class CommitStamp(BaseModel):
    """Where a snapshot came from; written into its Iceberg summary properties."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    asset_key: str = Field(description="Dagster asset key path joined by '/', or the CLI entry point.")
    config_hash: str = Field(description="`factory.version.config_hash` of the producing config.")
    run_id: str = Field("", description="Dagster run id; empty outside Dagster.")
    partition: str = Field("", description="Partition key; empty when unpartitioned.")
    upstream: dict[str, int] = Field(
        default_factory=dict, description="Upstream table name -> snapshot id read."
    )
    content_hash: str = Field("", description="Hash of what was written; computed from the data when empty.")
    lineage: str = Field("", description="The lineage row this snapshot owes, as JSON (`Lake.commit` fills it).")
    code_version: str = Field(default_factory=code_version, description="git SHA (+ '-dirty').")
    env_lock: str = Field(default_factory=env_lock_hash, description="Installed-packages hash.")

    def properties(self) -> dict[str, str]:
        """Summary properties, all strings, under the `factory.` prefix (`lineage` only when set)."""
        lineage = {f"{PREFIX}{LINEAGE_KEY}": self.lineage} if self.lineage else {}
        return lineage | {
            f"{PREFIX}asset-key": self.asset_key,
            f"{PREFIX}partition": self.partition,
            f"{PREFIX}run-id": self.run_id,
            f"{PREFIX}code-version": self.code_version,
            f"{PREFIX}env-lock": self.env_lock,
            f"{PREFIX}config-hash": self.config_hash,
            f"{PREFIX}upstream-snapshots": json.dumps(self.upstream, sort_keys=True),
            f"{PREFIX}content-hash": self.content_hash,
        }


class TableCommit(BaseModel):
    """The outcome of one commit: a reference other assets can pin."""

    model_config = ConfigDict(frozen=True)

    table: str
    snapshot_id: int | None
    previous_snapshot_id: int | None
    rows: int
    attempts: int
    committed: bool = True
    content_hash: str = ""


class ParquetFiles(BaseModel):
    """Parquet files written in a table's schema, to be registered in one commit."""

    model_config = ConfigDict(frozen=True)

    paths: list[str] = Field(description="Absolute URIs of the files.")
    rows: int = Field(description="Rows across the files (for the commit record).")


def stamp_of(table: Table, snapshot_id: int | None = None) -> dict[str, str]:
    """The `factory.*` properties of a snapshot (the current one by default)."""
    snapshot = table.snapshot_by_id(snapshot_id) if snapshot_id else table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return {}
    extra = snapshot.summary.additional_properties  # dict(summary.items()) crashes in 0.11
    return {k[len(PREFIX):]: v for k, v in extra.items() if k.startswith(PREFIX)}


def commit_with_retry(
    load_table: Callable[[], Table],
    name: str,
    data: pa.Table | ParquetFiles | Callable[[Table], pa.Table | None],
    stamp: CommitStamp,
    *,
    mode: Literal["append", "overwrite"] = "append",
    overwrite_filter: BooleanExpression | None = None,
    on_files_written: Callable[[], None] | None = None,
) -> TableCommit:
    """Commit `data` to the table `load_table()` returns, as one stamped snapshot.

    `data` is an Arrow table (written by pyiceberg), Parquet files already written in the
    table's schema (by Spark executors: registered with `add_files`, never read by the driver), or
    a function of the freshly loaded table that returns the Arrow rows to append (None: nothing to
    commit) — a read-check-write: it is called again on every retry, and the commit only lands if
    nobody committed since the table it read (what makes `LineageStore.heal` write a row once).
    `overwrite` replaces the rows matching `overwrite_filter` (default: all rows).
    """
    where = overwrite_filter if overwrite_filter is not None else AlwaysTrue()
    deadline = time.monotonic() + RETRY_FOR_S
    attempt = 0
    while True:
        attempt += 1
        try:
            table = load_table()  # fresh metadata each attempt: a retry must see the winner's commit
            previous = table.current_snapshot()
            replace = mode == "overwrite" and previous is not None
            rows = data(table) if callable(data) else data
            if rows is None:
                return TableCommit(table=name, snapshot_id=previous.snapshot_id if previous else None,
                                   previous_snapshot_id=previous.snapshot_id if previous else None, rows=0,
                                   attempts=attempt, committed=False)
            if not isinstance(rows, ParquetFiles):
                rows = _conform(rows, table, name)
            content = stamp.content_hash or content_hash(rows, table)
            final = stamp.model_copy(update={"content_hash": content}).properties()
            base = {k: v for k, v in final.items() if k != f"{PREFIX}{LINEAGE_KEY}"}
            with table.transaction() as tx, warnings.catch_warnings():
                # an overwrite of rows that are not there (first write of a slice) is fine
                warnings.filterwarnings("ignore", "Delete operation did not match any records")
                if replace:  # pyiceberg's overwrite is this same delete + append, with one stamp for both
                    tx.delete(where, snapshot_properties=base)
                if isinstance(rows, ParquetFiles):
                    # the files are new by construction (a fresh uuid staging directory per write),
                    # and pyiceberg's duplicate check crashes on a snapshot left with no data files
                    # ("Must pass at least one table": an overwrite that emptied the table in this
                    # same transaction, as a source's exclusions replacing the last ones do)
                    tx.add_files(rows.paths, snapshot_properties=final, check_duplicate_files=False)
                else:
                    tx.append(rows, snapshot_properties=final)
                if on_files_written is not None:
                    on_files_written()
        except (CommitFailedException, OperationalError) as exc:
            delay = min(MAX_DELAY_S, BASE_DELAY_S * 2 ** (attempt - 1)) * (0.5 + random.random())
            gave_up = time.monotonic() + delay > deadline
            health.commit_conflict(name, gave_up=gave_up)  # factory_lake_commit_{conflicts,retries,failures}_total
            if gave_up:
                raise CommitFailedException(
                    f"{name}: gave up after {attempt} concurrent-commit conflicts in {RETRY_FOR_S:.0f}s: {exc}"
                ) from exc
            log.info("%s: commit conflict (attempt %d), retrying in %.2fs", name, attempt, delay)
            time.sleep(delay)
            continue
        current = table.current_snapshot()  # the transaction refreshed `table` with our commit
        health.committed(name, time.monotonic() - (deadline - RETRY_FOR_S))
        return TableCommit(
            table=name,
            snapshot_id=current.snapshot_id if current else None,
            previous_snapshot_id=previous.snapshot_id if previous else None,
            rows=rows.rows if isinstance(rows, ParquetFiles) else rows.num_rows,
            attempts=attempt,
            content_hash=content,
        )


def content_hash(data: pa.Table | ParquetFiles, table: Table) -> str:
    """A hash of what a commit writes, for writers that do not bring their own: the Arrow IPC
    bytes of the conformed rows, or the bytes of the Parquet files (read through the table's
    FileIO — writers of large file sets, like the Spark refiner, pass a hash computed where the
    data is)."""
    h = hashlib.sha256()
    if isinstance(data, ParquetFiles):
        for path in sorted(data.paths):
            with table.io.new_input(path).open() as stream:
                while chunk := stream.read(1 << 20):
                    h.update(chunk)
    else:
        for batch in data.to_batches():
            h.update(batch.serialize())
    return h.hexdigest()[:24]


def _conform(data: pa.Table, table: Table, name: str) -> pa.Table:
    """Cast `data` to the table's declared Arrow schema, naming the table when it does not fit."""
    target = table.schema().as_arrow()
    missing = [f.name for f in target if f.name not in data.column_names]
    extra = [c for c in data.column_names if c not in target.names]
    if missing or extra:
        raise ValueError(f"{name}: data does not match the table schema (missing {missing}, unexpected {extra})")
    try:
        return data.select(target.names).cast(target)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(f"{name}: data does not match the table schema: {exc}") from exc
