"""The `factory.lineage` table: one row per produced version of anything.

A version is a table snapshot, a tokenizer, a mix version, a training run, a checkpoint, an export,
an eval result set or a synthetic batch. Each row names its upstream versions, so the lineage graph
is the rows themselves: `upstream_of` walks towards the sources, `downstream_of` towards every
eval that used a thing. The table is small (one row per materialization), so walks read it whole.

A data commit and its lineage row are two Iceberg commits: the data goes first, so a crash in
between leaves a snapshot without a row — still explained by its own summary properties — never a
row pointing at data that does not exist.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from factory.lake.commit import CommitStamp, TableCommit
from factory.lake.schemas import LINEAGE
from factory.version import canonical_json, config_hash

if TYPE_CHECKING:
    from factory.lake.catalog import Lake

LINEAGE_TABLE = "factory.lineage"


class LineageRecord(BaseModel):
    """One produced version and where it came from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version_id: str
    kind: str
    name: str
    uri: str | None = None
    content_hash: str | None = None
    upstream: list[str] = Field(default_factory=list)
    config_json: str = "{}"
    config_hash: str = ""
    code_version: str = ""
    env_lock: str = ""
    asset_key: str = ""
    partition: str = ""
    run_id: str = ""
    snapshot_id: int | None = None
    metadata_json: str = "{}"
    created_at: dt.datetime = Field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))

    @property
    def config(self) -> dict[str, Any]:
        return json.loads(self.config_json)

    @property
    def metadata(self) -> dict[str, Any]:
        return json.loads(self.metadata_json)


def table_version_id(table: str, snapshot_id: int | None) -> str:
    return f"{table}@{snapshot_id}"


def snapshot_record(
    commit: TableCommit,
    stamp: CommitStamp,
    config: Any,
    *,
    uri: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> LineageRecord:
    """The lineage row for a table snapshot written by `commit` under `stamp`."""
    return LineageRecord(
        version_id=table_version_id(commit.table, commit.snapshot_id),
        kind="table_snapshot",
        name=commit.table,
        uri=uri,
        content_hash=stamp.content_hash or None,
        upstream=[table_version_id(t, s) for t, s in sorted(stamp.upstream.items())],
        config_json=canonical_json(config),
        config_hash=config_hash(config),
        code_version=stamp.code_version,
        env_lock=stamp.env_lock,
        asset_key=stamp.asset_key,
        partition=stamp.partition,
        run_id=stamp.run_id,
        snapshot_id=commit.snapshot_id,
        metadata_json=canonical_json(metadata or {}),
    )


class LineageStore:
    """Reads and writes `factory.lineage` in one lake."""

    def __init__(self, lake: "Lake"):
        self.lake = lake

    def record(self, *records: LineageRecord) -> TableCommit:
        """Append lineage rows (one commit, stamped like any other)."""
        rows = [r.model_dump() for r in records]
        data = pa.Table.from_pylist(rows, schema=LINEAGE.as_arrow())
        stamp = CommitStamp(
            asset_key="factory/lineage",
            config_hash="",
            run_id=records[0].run_id if records else "",
        )
        return self.lake.commit(LINEAGE_TABLE, data, stamp, schema=LINEAGE)

    def records(self) -> list[LineageRecord]:
        """Every lineage row, oldest first."""
        if not self.lake.has_table(LINEAGE_TABLE):
            return []
        rows = self.lake.table(LINEAGE_TABLE).scan().to_arrow().to_pylist()
        return sorted((LineageRecord(**r) for r in rows), key=lambda r: r.created_at)

    def resolve(self, ref: str) -> list[LineageRecord]:
        """Versions a user may mean by `ref`: a version id, a table or artifact name (its newest
        version), a URI, or a content-hash prefix of at least 8 characters."""
        records = self.records()
        exact = [r for r in records if r.version_id == ref or r.uri == ref]
        if exact:
            return exact
        named = [r for r in records if r.name == ref]
        if named:
            current = self.lake.current_snapshot_id(ref) if self.lake.has_table(ref) else None
            pinned = [r for r in named if current is not None and r.snapshot_id == current]
            return pinned or named[-1:]
        if len(ref) >= 8:
            return [r for r in records if r.content_hash and r.content_hash.startswith(ref)]
        return []

    def upstream_of(self, version_id: str) -> dict[str, Any]:
        """`{record, upstream: [tree, ...]}` towards the sources (unknown ids become leaves)."""
        by_id = {r.version_id: r for r in self.records()}

        def walk(vid: str, seen: frozenset[str]) -> dict[str, Any]:
            record = by_id.get(vid)
            if record is None or vid in seen:
                return {"version_id": vid, "record": record, "upstream": []}
            children = [walk(u, seen | {vid}) for u in record.upstream]
            return {"version_id": vid, "record": record, "upstream": children}

        return walk(version_id, frozenset())

    def downstream_of(self, version_id: str) -> list[LineageRecord]:
        """Every version produced (transitively) from `version_id`, in creation order."""
        records = self.records()
        found: dict[str, LineageRecord] = {}
        frontier = {version_id}
        while frontier:
            nxt = {r.version_id for r in records if frontier & set(r.upstream) and r.version_id not in found}
            for r in records:
                if r.version_id in nxt:
                    found[r.version_id] = r
            frontier = nxt
        return sorted(found.values(), key=lambda r: r.created_at)
