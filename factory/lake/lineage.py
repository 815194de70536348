"""The `factory.lineage` table: one row per produced version of anything.

A version is a table snapshot, a tokenizer, a mix version, a training run, a checkpoint, an export,
an eval result set or a synthetic batch. Each row names its upstream versions, so the lineage graph
is the rows themselves: `upstream_of` walks towards the sources, `downstream_of` towards every
eval that used a thing.

The table is not small at scale: ~10 rows per checkpoint (the checkpoint, its export, its evals)
make a million rows at 100k checkpoints. So nothing here turns the whole table into records: a
lookup pushes its filter into the scan (`records(kind=..., name=...)`), and a walk reads only the
two graph columns (`version_id`, `upstream`) into adjacency dicts — kept for the table's current
snapshot, so the several walks of one `factory lineage` read them once — and then fetches full
records for the versions it reached. Each walk is linear in the table, not in table x depth (the
first version read the table whole and, going downstream, rescanned every record per hop: a run's
checkpoint chain is a hundred hops deep).

Every scan plans over all of the table's manifests (one per commit until they are merged), so a
command that reads several times takes a `pinned()` view: the table loaded once, read as it was
then, and its files planned once — each read keeps the files whose column bounds can match its
filter (the test a scan makes of each manifest entry) and reads only those. `factory lineage`
makes four reads of it — the ref (ids, URIs and names in one filter), the graph, the records
reached upstream (of all the ref's upstream versions at once) and downstream — however many
upstream versions the ref has. Writers use the store itself, which loads the table afresh on
every read.

A data commit and its lineage row are two Iceberg commits: the data goes first, so a crash in
between leaves a snapshot without a row, never a row pointing at data that does not exist. The gap
is not permanent: the row is stamped into the snapshot's own summary (`factory.lineage`, with
`{snapshot}` standing for the id it will get), and `heal` writes the row of every stamped snapshot
that has none — `Lake.commit` heals the table's recent snapshots after each commit, the ingest's
"unchanged" path heals its table, `factory lake heal` heals every table. `heal` reads which rows
exist and appends the missing ones in one read-check-write commit (it lands only if the lineage
table did not move since it was read), so two healers never write a row twice.

`upstream_snapshots` turns a row's upstream version ids into the table snapshots behind them (a
checkpoint lives in `train.checkpoints`, a mix version in `mixes.versions`, a tokenizer or an export
in nothing, so it stands for its own upstream): what every commit stamps as
`factory.upstream-snapshots`, so a snapshot names what it was made from without the lineage table.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, EqualTo, In, Or, StartsWith
from pydantic import BaseModel, ConfigDict, Field

from factory.lake.commit import LINEAGE_KEY, PREFIX, CommitStamp, TableCommit
from factory.lake.schemas import LINEAGE
from factory.version import canonical_json, config_hash

if TYPE_CHECKING:
    from factory.lake.catalog import Lake

LINEAGE_TABLE = "factory.lineage"
SNAPSHOT = "{snapshot}"  # in a stamped row's version_id: the id the snapshot gets when it commits
HEAL_WINDOW = 20  # stamped snapshots of a table each commit checks for a missing row
TABLE_VERSION = re.compile(r"^(?P<table>[A-Za-z_][\w]*\.[A-Za-z_][\w]*)@(?P<snapshot>\d+)$")
# kinds whose row is kept in a table its `uri` does not name (mix versions, evals and sweeps have
# `iceberg://<table>` URIs; table snapshots and synthetic batches are named after their table)
RECORDED_IN = {"checkpoint": "train.checkpoints"}


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


def table_version_id(table: str, snapshot_id: int | str | None) -> str:
    return f"{table}@{snapshot_id}"


def snapshot_record(
    commit: TableCommit | str,
    stamp: CommitStamp,
    config: Any,
    *,
    uri: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> LineageRecord:
    """The lineage row for a table snapshot written by `commit` under `stamp` — or, given the
    table's name before the commit, the row to hand to `Lake.commit(lineage=...)` (its version id
    holds `{snapshot}` until the snapshot exists)."""
    table, snapshot = (commit, None) if isinstance(commit, str) else (commit.table, commit.snapshot_id)
    return LineageRecord(
        version_id=table_version_id(table, SNAPSHOT if snapshot is None else snapshot),
        kind="table_snapshot",
        name=table,
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
        snapshot_id=snapshot,
        metadata_json=canonical_json(metadata or {}),
    )


def stamped_row(record: LineageRecord) -> str:
    """`record` as the `factory.lineage` summary property (its snapshot id is the snapshot's own)."""
    return canonical_json(record.model_dump(mode="json", exclude={"snapshot_id"}))


def owed_record(snapshot) -> LineageRecord | None:
    """The lineage row a snapshot was stamped with (None: it owes none, e.g. a delete snapshot,
    a metrics append, or a snapshot written before rows were stamped)."""
    extra = snapshot.summary.additional_properties if snapshot.summary else {}
    stamped = extra.get(f"{PREFIX}{LINEAGE_KEY}")
    if not stamped:
        return None
    fields = json.loads(stamped)
    fields["version_id"] = fields["version_id"].replace(SNAPSHOT, str(snapshot.snapshot_id))
    fields["snapshot_id"] = snapshot.snapshot_id
    if not fields.get("content_hash"):  # the commit computed one when the writer had none
        fields["content_hash"] = extra.get(f"{PREFIX}content-hash") or None
    return LineageRecord(**fields)


def owed_rows(table, window: int | None = None) -> list[LineageRecord]:
    """The rows a loaded table's stamped snapshots owe, in commit order (newest `window`, or all)."""
    owed = []
    for snapshot in reversed(table.metadata.snapshots):  # newest first: a commit reads few
        record = owed_record(snapshot)
        if record is not None:
            owed.append(record)
            if window and len(owed) == window:
                break
    return owed[::-1]


def recorded_in(record: LineageRecord) -> str | None:
    """The table whose snapshot `record.snapshot_id` is (None for artifacts outside tables)."""
    if record.kind in ("table_snapshot", "synthetic_batch"):
        return record.name
    if record.uri and record.uri.startswith("iceberg://"):
        return record.uri.removeprefix("iceberg://").split("?")[0]
    return RECORDED_IN.get(record.kind)


_UNPINNED = object()


class LineageStore:
    """Reads and writes `factory.lineage` in one lake."""

    def __init__(self, lake: "Lake", table=_UNPINNED):
        self.lake, self._pinned = lake, table

    def pinned(self) -> "LineageStore":
        """A read-only view: every read uses the lineage table as loaded now (see the module docstring)."""
        return LineageStore(self.lake, self._load())

    def _scan(self, table, row_filter: BooleanExpression = AlwaysTrue(), selected_fields: tuple[str, ...] = ("*",)) -> pa.Table:
        """`table.scan(...).to_arrow()`; in a pinned view, over the files planned once for the view."""
        scan = table.scan(row_filter=row_filter, selected_fields=selected_fields)
        if self._pinned is _UNPINNED:
            return scan.to_arrow()
        from pyiceberg.expressions.visitors import _InclusiveMetricsEvaluator
        from pyiceberg.io.pyarrow import ArrowScan

        if getattr(self, "_planned", None) is None:
            self._planned = list(table.scan().plan_files())
        tasks = self._planned
        if row_filter != AlwaysTrue():  # the test plan_files makes of each entry (it builds one per entry)
            matches = _InclusiveMetricsEvaluator(table.schema(), scan.row_filter, scan.case_sensitive, False).eval
            tasks = [task for task in tasks if matches(task.file)]
        return ArrowScan(table.metadata, table.io, scan.projection(), scan.row_filter, scan.case_sensitive).to_table(tasks)

    def _load(self):
        """The lineage table, loaded (the pinned one in a view), or None when there is none yet."""
        from factory.lake.catalog import LakeError, TableUnreadable

        if self._pinned is not _UNPINNED:
            return self._pinned
        try:
            return self.lake.table(LINEAGE_TABLE)  # one load (has_table would load it too)
        except TableUnreadable:
            raise
        except LakeError:  # not created yet
            return None

    def record(self, *records: LineageRecord) -> TableCommit:
        """Append lineage rows (one commit, stamped like any other)."""
        if self._pinned is not _UNPINNED:
            raise TypeError("a pinned lineage view is read only: write through lake.lineage")
        rows = [r.model_dump() for r in records]
        data = pa.Table.from_pylist(rows, schema=LINEAGE.as_arrow())
        stamp = CommitStamp(
            asset_key="factory/lineage",
            config_hash="",
            run_id=records[0].run_id if records else "",
        )
        return self.lake.commit(LINEAGE_TABLE, data, stamp, schema=LINEAGE)

    def heal(self, table: str, *, window: int | None = None) -> list[LineageRecord]:
        """Write the rows owed by `table`'s stamped snapshots (the newest `window` of them, or all)
        that `factory.lineage` lacks; returns the rows written (see the module docstring)."""
        owed = self.owed(table, window=window)
        if not owed:
            return []
        written: list[LineageRecord] = []

        def missing(lineage) -> pa.Table | None:
            present = self._present(lineage, [r.snapshot_id for r in owed])
            written[:] = [r for r in owed if (r.version_id, r.snapshot_id) not in present]
            if not written:
                return None
            return pa.Table.from_pylist([r.model_dump() for r in written], schema=LINEAGE.as_arrow())

        stamp = CommitStamp(asset_key="factory/lineage", config_hash="", run_id=owed[-1].run_id)
        self.lake.commit(LINEAGE_TABLE, missing, stamp, schema=LINEAGE)
        return written

    def owed(self, table: str, *, window: int | None = None) -> list[LineageRecord]:
        """The rows `table`'s stamped snapshots owe, in commit order (newest `window`, or all)."""
        return owed_rows(self.lake.table(table), window=window)

    def missing(self, owed: list[LineageRecord]) -> list[LineageRecord]:
        """The rows of `owed` (of any tables) that `factory.lineage` lacks, what `heal` would write:
        one filtered scan for all of them."""
        if not owed:
            return []
        lineage = self._load()
        present = self._present(lineage, [r.snapshot_id for r in owed]) if lineage is not None else set()
        return [r for r in owed if (r.version_id, r.snapshot_id) not in present]

    @staticmethod
    def _present(lineage, snapshot_ids: list[int]) -> set[tuple[str, int]]:
        """(version_id, snapshot_id) of the rows of `lineage` (a loaded table) for those snapshots."""
        if lineage.current_snapshot() is None:
            return set()
        rows = lineage.scan(row_filter=In("snapshot_id", snapshot_ids),
                            selected_fields=("version_id", "snapshot_id")).to_arrow()
        return set(zip(rows.column("version_id").to_pylist(), rows.column("snapshot_id").to_pylist()))

    def upstream_snapshots(self, version_ids: list[str]) -> dict[str, int]:
        """The table snapshots behind upstream version ids: a `table@snapshot` id is itself; a row
        kept in a table (a checkpoint, a mix version, an eval) is that table's snapshot; an artifact
        outside tables (a tokenizer, an export) stands for its own upstream. When one table is
        reached at two snapshots, the nearer one is kept."""
        found: dict[str, int] = {}
        frontier, seen = list(version_ids), set()
        while frontier:
            frontier = [v for v in dict.fromkeys(frontier) if v not in seen]
            seen.update(frontier)
            lookup = []
            for vid in frontier:
                if match := TABLE_VERSION.match(vid):
                    found.setdefault(match["table"], int(match["snapshot"]))
                else:
                    lookup.append(vid)
            by_id = self._by_id(set(lookup))
            frontier = []
            for vid in lookup:
                record = by_id.get(vid)
                if record is None:
                    continue
                table = recorded_in(record)
                if table and record.snapshot_id is not None:
                    found.setdefault(table, record.snapshot_id)
                else:
                    frontier += record.upstream
        return dict(sorted(found.items()))

    def records(self, where: BooleanExpression | None = None, **equal: str) -> list[LineageRecord]:
        """Lineage rows, oldest first: every row, or those matching `where` and `column=value`
        equalities (e.g. `kind="tokenizer"`), filtered inside the scan."""
        table = self._load()
        if table is None:
            return []
        row_filter = where if where is not None else AlwaysTrue()
        for column, value in equal.items():
            row_filter = And(row_filter, EqualTo(column, value))
        rows = self._scan(table, row_filter).to_pylist()
        return sorted((LineageRecord(**r) for r in rows), key=lambda r: r.created_at)

    def resolve(self, ref: str) -> list[LineageRecord]:
        """Versions a user may mean by `ref`: a version id, a table or artifact name (its newest
        version), a URI, or a content-hash prefix of at least 8 characters. A table name means the
        table's current snapshot and nothing else: when that snapshot has no row, nothing (the
        caller shows the snapshot itself), never an older snapshot's row."""
        found = self.records(Or(Or(EqualTo("version_id", ref), EqualTo("uri", ref)), EqualTo("name", ref)))
        exact = [r for r in found if r.version_id == ref or r.uri == ref]
        if exact:
            return exact
        named = [r for r in found if r.name == ref]
        if named and self.lake.has_table(ref):
            current = self.lake.current_snapshot_id(ref)
            return [r for r in named if current is not None and r.snapshot_id == current]
        if named:
            return named[-1:]
        if len(ref) >= 8:
            return self.records(StartsWith("content_hash", ref))
        return []

    def _by_id(self, version_ids: set[str]) -> dict[str, LineageRecord]:
        """The record of each id (the newest row of an id written twice), fetched by filter."""
        if not version_ids:
            return {}
        return {r.version_id: r for r in self.records(In("version_id", sorted(version_ids)))}

    def _graph(self) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """(upstream, downstream) adjacency of the current snapshot: id -> ids, over every row."""
        table = self._load()
        snapshot = table.current_snapshot()
        key = snapshot.snapshot_id if snapshot else None
        cached = getattr(self, "_graph_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        edges = self._scan(table, selected_fields=("version_id", "upstream"))
        up: dict[str, list[str]] = {}
        down: dict[str, list[str]] = {}
        for vid, upstream in zip(edges.column("version_id").to_pylist(), edges.column("upstream").to_pylist()):
            up.setdefault(vid, []).extend(upstream)
            for u in upstream:
                down.setdefault(u, []).append(vid)
        self._graph_cache = (key, (up, down))
        return up, down

    def upstream_of(self, version_id: str) -> dict[str, Any]:
        """`{record, upstream: [tree, ...]}` towards the sources (unknown ids become leaves)."""
        return self.upstream_trees([version_id])[0]

    def upstream_trees(self, version_ids: list[str]) -> list[dict[str, Any]]:
        """`upstream_of` each of `version_ids`, with one fetch of the records they reach."""
        if self._load() is None:
            return [{"version_id": v, "record": None, "upstream": []} for v in version_ids]
        up, _ = self._graph()
        reached, frontier = set(version_ids), list(version_ids)
        while frontier:
            frontier = [u for vid in frontier for u in up.get(vid, ()) if u not in reached]
            reached.update(frontier)
        by_id = self._by_id({v for v in reached if v in up})

        def walk(vid: str, seen: frozenset[str]) -> dict[str, Any]:
            record = by_id.get(vid)
            if record is None or vid in seen:
                return {"version_id": vid, "record": record, "upstream": []}
            children = [walk(u, seen | {vid}) for u in record.upstream]
            return {"version_id": vid, "record": record, "upstream": children}

        return [walk(v, frozenset()) for v in version_ids]

    def downstream_of(self, version_id: str) -> list[LineageRecord]:
        """Every version produced (transitively) from `version_id`, in creation order."""
        if self._load() is None:
            return []
        _, down = self._graph()
        level: dict[str, int] = {}  # found id -> the hop it was found at
        frontier, hop = {version_id}, 0
        while frontier:
            frontier = {c for vid in frontier for c in down.get(vid, ()) if c not in level}
            level.update((c, hop) for c in frontier)
            hop += 1
        records = self.records(In("version_id", sorted(level))) if level else []
        first: dict[str, int] = {}
        found: dict[str, LineageRecord] = {}
        for i, r in enumerate(records):
            first.setdefault(r.version_id, i)
            found[r.version_id] = r  # the newest row of an id written twice
        # ties in creation time keep the order of discovery: by hop, then by row
        ordered = sorted(found, key=lambda vid: (level[vid], first[vid]))
        return sorted((found[vid] for vid in ordered), key=lambda r: r.created_at)
