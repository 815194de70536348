"""Ingest one source into its `raw.<source>` table, with lineage — or commit nothing if unchanged.

The whole read happens before any write: a bad input fails the ingest with nothing committed.
The table then holds the source as it is now (an overwrite snapshot; history stays in Iceberg's
snapshots). The source fingerprint — a hash over every document's id, language and license,
where the id covers path and content — is stamped on the snapshot; an ingest whose fingerprint
equals the current snapshot's commits nothing and says so — after writing the lineage row of the
current snapshot if a crash lost it (`LineageStore.heal`). `force` rewrites the table from the
source whatever the fingerprint says: the repair for deleted or corrupt data files, and, for a
table whose metadata or manifests are unreadable, a drop and re-create (its history is lost).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from typing import Callable

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from factory.data.readers import read_source
from factory.data.sources import Progress, ReadReport, SourceConfig, SourceError, resolve_root
from factory.lake import CommitStamp, Lake, LakeError, TableCommit
from factory.lake.commit import stamp_of
from factory.lake.lineage import snapshot_record
from factory.lake.schemas import RAW_DOCUMENTS
from factory.version import config_hash


class IngestResult(BaseModel):
    """What an ingest did, in the terms a researcher checks in the UI."""

    model_config = ConfigDict(frozen=True)

    table: str
    committed: bool
    snapshot_id: int | None
    previous_snapshot_id: int | None
    documents: int
    bytes: int
    candidates: int
    skipped: dict[str, int]
    skipped_examples: dict[str, list[str]]
    fingerprint: str
    config_hash: str
    languages: dict[str, int]
    sample: list[dict]
    seconds: float


def raw_table(source_name: str) -> str:
    return f"raw.{source_name}"


def fingerprint(docs: list[dict]) -> str:
    h = hashlib.sha256()
    for d in docs:
        h.update(f"{d['doc_id']}\0{d['language']}\0{d['license']}\n".encode())
    return h.hexdigest()[:24]


def source_locations(source: SourceConfig) -> list[str]:
    """Where the source was read from, placeholders resolved (the config keeps `{purelib}`)."""
    if hasattr(source, "root"):
        return [resolve_root(source.root)]
    return list(source.paths)


def ingest_source(
    lake: Lake,
    source: SourceConfig,
    *,
    asset_key: str | None = None,
    run_id: str = "",
    progress: Progress | None = None,
    on_files_written: Callable[[], None] | None = None,
    allow_shrink: bool = False,
    force: bool = False,
) -> IngestResult:
    """Read `source` completely, then commit it to `raw.<name>` unless nothing changed.
    `allow_shrink` lifts the source's `max_shrink` guard for this ingest. `force` commits even
    when nothing changed, and first drops a table whose metadata is unreadable (`repair_table`):
    the way to rewrite a damaged raw table from its source."""
    started = time.perf_counter()
    table = raw_table(source.name)
    docs, report = read_source(source, progress)
    if not allow_shrink:
        check_shrink(lake, table, source, len(docs))
    fp, cfg_hash = fingerprint(docs), config_hash(source)
    if force:
        repair_table(lake, table)
    existing = lake.table(table) if lake.has_table(table) else None
    current = existing.current_snapshot() if existing else None
    previous = current.snapshot_id if current else None
    if not force and previous is not None and stamp_of(existing).get("content-hash") == fp:
        lake.lineage.heal(table)  # unchanged, but a crash may have lost the last commit's row
        return _result(table, False, previous, previous, docs, report, fp, cfg_hash, started)

    now = dt.datetime.now(dt.timezone.utc)
    data = pa.Table.from_pylist([{**d, "ingested_at": now} for d in docs], schema=RAW_DOCUMENTS.as_arrow())
    stamp = CommitStamp(
        asset_key=asset_key or f"raw/{source.name}", config_hash=cfg_hash, run_id=run_id, content_hash=fp
    )
    lake.ensure_table(table, RAW_DOCUMENTS)
    row = snapshot_record(
        table, stamp, source, uri=lake.table(table).location(),
        metadata={"documents": len(docs), "bytes": sum(d["bytes"] for d in docs),
                  "skipped": dict(report.skipped), "read_from": source_locations(source)},
    )
    commit: TableCommit = lake.commit(
        table, data, stamp, mode="overwrite", on_files_written=on_files_written, lineage=row
    )
    return _result(table, True, commit.snapshot_id, previous, docs, report, fp, cfg_hash, started)


def check_shrink(lake: Lake, table: str, source: SourceConfig, documents: int) -> None:
    """A `SourceError` when `documents` would drop more than `source.max_shrink` of the rows the
    table holds now: a source that lost most of its files (a typo'd glob, an unmounted disk) must
    not silently replace a populated table. A table that cannot be opened is left to the commit
    path, which reports it (or repairs it)."""
    if source.max_shrink >= 1 or not lake.has_table(table):
        return
    try:
        current = lake.table(table).current_snapshot()
    except LakeError:
        return
    rows = int((current.summary["total-records"] or 0) if current and current.summary else 0)
    if rows and (rows - documents) / rows > source.max_shrink:
        raise SourceError(
            f"source {source.name}: {table} holds {rows:,} documents; this read has {documents:,} "
            f"({(rows - documents) / rows:.0%} fewer, more than max_shrink {source.max_shrink:.0%}); nothing committed. "
            "Check the source, or raise max_shrink (factory ingest --allow-shrink for one ingest)"
        )


def repair_table(lake: Lake, table: str) -> bool:
    """Drop `table` from the catalog when its metadata, manifest list or manifests are unreadable,
    so the next commit creates it afresh; True when it was dropped. Its snapshot history goes with
    it (the files stay on disk, unreferenced); damaged data files alone need no drop — the forced
    overwrite replaces them and the history is kept."""
    from factory.lake.health import table_damage

    if not lake.has_table(table) or not table_damage(lake, table, full=True).structural:
        return False
    lake.drop_unreadable(table)
    return True


def _result(table, committed, snapshot_id, previous, docs, report: ReadReport, fp, cfg_hash, started) -> IngestResult:
    languages: dict[str, int] = {}
    for d in docs:
        languages[d["language"]] = languages.get(d["language"], 0) + 1
    return IngestResult(
        table=table, committed=committed, snapshot_id=snapshot_id, previous_snapshot_id=previous,
        documents=len(docs), bytes=sum(d["bytes"] for d in docs), candidates=report.candidates,
        skipped=dict(report.skipped), skipped_examples=report.examples, fingerprint=fp,
        config_hash=cfg_hash, languages=dict(sorted(languages.items(), key=lambda kv: -kv[1])),
        sample=[{"path": d["path"], "language": d["language"], "head": d["text"][:300]} for d in docs[:3]],
        seconds=round(time.perf_counter() - started, 2),
    )
