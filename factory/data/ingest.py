"""Ingest one source into its `raw.<source>` table, with lineage — or commit nothing if unchanged.

The whole read happens before any write: a bad input fails the ingest with nothing committed.
The table then holds the source as it is now (an overwrite snapshot; history stays in Iceberg's
snapshots). The source fingerprint — a hash over every document's id, language and license,
where the id covers path and content — is stamped on the snapshot; an ingest whose fingerprint
equals the current snapshot's commits nothing and says so.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from typing import Callable

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from factory.data.readers import read_source
from factory.data.sources import Progress, ReadReport, SourceConfig, resolve_root
from factory.lake import CommitStamp, Lake, TableCommit
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
) -> IngestResult:
    """Read `source` completely, then commit it to `raw.<name>` unless nothing changed."""
    started = time.perf_counter()
    table = raw_table(source.name)
    docs, report = read_source(source, progress)
    fp, cfg_hash = fingerprint(docs), config_hash(source)
    existing = lake.table(table) if lake.has_table(table) else None
    current = existing.current_snapshot() if existing else None
    previous = current.snapshot_id if current else None
    if previous is not None and stamp_of(existing).get("content-hash") == fp:
        return _result(table, False, previous, previous, docs, report, fp, cfg_hash, started)

    now = dt.datetime.now(dt.timezone.utc)
    data = pa.Table.from_pylist([{**d, "ingested_at": now} for d in docs], schema=RAW_DOCUMENTS.as_arrow())
    stamp = CommitStamp(
        asset_key=asset_key or f"raw/{source.name}", config_hash=cfg_hash, run_id=run_id, content_hash=fp
    )
    commit: TableCommit = lake.commit(
        table, data, stamp, mode="overwrite", schema=RAW_DOCUMENTS, on_files_written=on_files_written
    )
    lake.lineage.record(
        snapshot_record(
            commit, stamp, source, uri=lake.table(table).location(),
            metadata={"documents": len(docs), "bytes": sum(d["bytes"] for d in docs),
                      "skipped": dict(report.skipped), "read_from": source_locations(source)},
        )
    )
    return _result(table, True, commit.snapshot_id, previous, docs, report, fp, cfg_hash, started)


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
