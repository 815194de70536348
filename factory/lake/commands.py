"""`factory sql`, `factory lineage`, `factory tables` and `factory lake`: the lake from the shell.

A table whose metadata cannot be read is listed by `factory tables` as broken (exit 1) while the
others are listed as usual. `factory lineage` shows exactly the version asked for: a snapshot
without a lineage row is shown from the row its stamp owes (or from its summary), marked as such,
never replaced by another snapshot's row. `factory lake heal` writes the rows stamped snapshots
owe; `factory lake recover` re-registers the tables of a warehouse whose catalog was lost.

Dispatched lazily by `factory.cli` (like the mix, eval and experiment commands), so these imports
never slow down, or break, another command.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text
from rich.tree import Tree

from factory.cli import NULL, human_bytes, open_lake


# -- sql --------------------------------------------------------------------------------------
def cmd_sql(args: argparse.Namespace, out: Console) -> int:
    from factory.lake.sql import query

    result = query(open_lake(args), args.query)
    rows = result.to_pylist()
    if args.format == "json":
        print(json.dumps(rows, default=str, ensure_ascii=False))
    elif args.format == "csv":
        import csv

        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(result.column_names)
        writer.writerows([[_csv_cell(v) for v in row.values()] for row in rows])
    else:
        table = RichTable(*result.column_names, caption=_rows_caption(len(rows), args.max_rows))
        for row in rows[: args.max_rows]:
            table.add_row(*(_cell(v) for v in row.values()))
        out.print(table)
    return 0


def _rows_caption(n: int, shown: int) -> str:
    more = f", first {shown} shown (--max-rows, or --format csv for all)" if n > shown else ""
    return f"{n} row{'s' if n != 1 else ''}{more}"


def _cell(value: Any, width: int = 80) -> str:
    text = (NULL if value is None else _json_or_str(value)).replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 1] + "…"


def _csv_cell(value: Any) -> Any:
    return _json_or_str(value) if isinstance(value, (list, dict)) else value


# -- lineage ----------------------------------------------------------------------------------
def cmd_lineage(args: argparse.Namespace, out: Console) -> int:
    from factory.train.runs import as_typed

    lake, ref = open_lake(args), args.ref
    if ref.startswith(("ckpt/", "export/")):  # their run part may be an experiment's name
        ref = as_typed(lake, ref)
    reports = describe(lake, ref)
    if args.json:
        print(json.dumps(reports, default=str, indent=2))
        return 0
    for report in reports:
        render_lineage(report, out)
    return 0


def describe(lake, ref: str) -> list[dict[str, Any]]:
    """Everything `factory lineage` shows about the versions `ref` resolves to, as plain data."""
    lineage = lake.lineage.pinned()  # one load of factory.lineage for every read below
    records, source = lineage.resolve(ref), "lineage"
    if not records:
        record, source = _unrecorded_snapshot(lake, ref)
        records = [record]
    reports = []
    for record in records:
        reports.append({
            "recorded": source == "lineage",
            "source": source,  # lineage (its row), stamp (the row its snapshot owes), summary
            "version": {**record.model_dump(mode="json", exclude={"config_json", "metadata_json"}),
                        "config": record.config, "metadata": record.metadata},
            "upstream": [_tree(t) for t in lineage.upstream_trees(record.upstream)],
            "downstream": [_brief(r) for r in lineage.downstream_of(record.version_id)],
            **_snapshots(lake, record),
        })
    return reports


def _unrecorded_snapshot(lake, ref: str) -> tuple[Any, str]:
    """A table snapshot without a lineage row (`factory.lineage` itself, a snapshot written before
    rows were stamped, or a commit whose row a crash lost): the row its stamp owes, else one built
    from its summary properties. Always the snapshot asked for (a table name: its current one)."""
    from factory.lake import LakeError, LineageRecord
    from factory.lake.commit import stamp_of
    from factory.lake.lineage import owed_record

    name, _, snap = ref.partition("@")
    table = lake.table(name) if lake.has_table(name) else None
    snapshot = None
    if table is not None and (snap.isdigit() or not snap):
        snapshot = table.snapshot_by_id(int(snap)) if snap else table.current_snapshot()
        if snapshot is None:
            raise LakeError(f"table {name} has no snapshot {snap} (expired or never existed)" if snap
                            else f"table {name} has no snapshot yet (it was never written)")
    if snapshot is None:
        if (owed := _owed_anywhere(lake, ref)) is not None:  # e.g. an eval whose row a crash lost
            return owed, "stamp"
        from factory.suggest import hint

        tables = lake.tables()
        raise LakeError(f"unknown ref {ref}: no table, artifact name, version id, URI or content-hash prefix "
                        f"(8+ chars) matches it ({hint(name, tables)}`factory tables` lists all {len(tables)})")
    owed = owed_record(snapshot)
    if owed is not None:
        return owed, "stamp"
    stamp = stamp_of(table, snapshot.snapshot_id)
    upstream = json.loads(stamp.get("upstream-snapshots") or "{}")
    return LineageRecord(
        version_id=f"{name}@{snapshot.snapshot_id}", kind="table_snapshot", name=name,
        uri=table.location(), content_hash=stamp.get("content-hash") or None,
        upstream=[f"{t}@{s}" for t, s in sorted(upstream.items())], config_hash=stamp.get("config-hash", ""),
        code_version=stamp.get("code-version", ""), env_lock=stamp.get("env-lock", ""),
        asset_key=stamp.get("asset-key", ""), partition=stamp.get("partition", ""), run_id=stamp.get("run-id", ""),
        snapshot_id=snapshot.snapshot_id,
        created_at=_time(snapshot.timestamp_ms),
    ), "summary"


def _owed_anywhere(lake, version_id: str):
    """The row some table's stamped snapshot owes under `version_id` (newest), if any: reads only
    table metadata, and only when nothing else matched the ref."""
    from factory.lake import LakeError

    for name in lake.tables():
        try:
            owed = [r for r in lake.lineage.owed(name) if r.version_id == version_id]
        except LakeError:  # an unreadable table holds nothing we can show
            continue
        if owed:
            return owed[-1]
    return None


def _snapshots(lake, record) -> dict[str, Any]:
    """The Iceberg side of a table snapshot: its summary and the table's snapshot history."""
    if record.kind != "table_snapshot" or record.snapshot_id is None or not lake.has_table(record.name):
        return {"snapshot": None, "history": []}
    table = lake.table(record.name)
    snapshot = table.snapshot_by_id(record.snapshot_id)
    current = table.current_snapshot()
    history = [
        {"snapshot_id": s.snapshot_id, "time": _time(s.timestamp_ms).isoformat(timespec="seconds"),
         "operation": s.summary.operation.value if s.summary else "",
         "rows": int(s.summary.additional_properties.get("total-records", 0)) if s.summary else None,
         "current": current is not None and s.snapshot_id == current.snapshot_id}
        for s in reversed(table.metadata.snapshots)  # commit order; an overwrite's two share a millisecond
    ]
    if snapshot is None:
        return {"snapshot": {"expired": True}, "history": history}
    summary = snapshot.summary
    return {
        "snapshot": {"operation": summary.operation.value if summary else "",
                     "time": _time(snapshot.timestamp_ms).isoformat(timespec="seconds"),
                     "summary": dict(summary.additional_properties) if summary else {}},
        "history": history,
    }


def _tree(node: dict[str, Any]) -> dict[str, Any]:
    record = node["record"]
    return {"version_id": node["version_id"], **(_brief(record) if record else {"kind": "unrecorded"}),
            "upstream": [_tree(child) for child in node["upstream"]]}


def _brief(record) -> dict[str, Any]:
    return {"version_id": record.version_id, "kind": record.kind, "name": record.name,
            "created_at": record.created_at.isoformat(timespec="seconds")}


def _time(ms: int):
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc)


def render_lineage(report: dict[str, Any], out: Console) -> None:
    v = report["version"]
    out.rule(f"{v['version_id']}", style="bold")
    if report["source"] == "stamp":
        out.print("(no row in factory.lineage: shown from the row its snapshot's stamp owes; `factory lake heal` "
                  "writes it)")
    elif report["source"] == "summary":
        out.print("(no row in factory.lineage: shown from the snapshot's own summary properties)")
    for label, key in LINEAGE_FIELDS:
        value = v[key] if v[key] not in ("", None) else None
        out.print(Text(f"{label:<15} {NULL if value is None else _json_or_str(value)}"))
    snapshot = report["snapshot"]
    if snapshot and snapshot.get("expired"):
        out.print("\nIceberg snapshot: expired (no longer in the table's metadata)")
    elif snapshot:
        out.print(Text(f"\nIceberg snapshot summary ({snapshot['operation']}, {snapshot['time']}):"))
        for key, value in sorted(snapshot["summary"].items()):
            out.print(Text(f"  {key:<28} {value}"))
    if report["history"]:
        out.print("\nsnapshots of the table (newest first):")
        for h in report["history"][:10]:
            mark = "  <- current" if h["current"] else ""
            out.print(Text(f"  {h['snapshot_id']:>19}  {h['time']}  {h['operation']:<9} {h['rows']} rows{mark}"))
        if len(report["history"]) > 10:
            out.print(f"  ... {len(report['history']) - 10} older")
    tree = Tree(Text(f"upstream of {v['version_id']}"))
    _grow(tree, report["upstream"])
    if not report["upstream"]:
        tree.add("(none recorded: read from outside the lake)")
    out.print()
    out.print(tree)
    out.print("downstream users:" if report["downstream"] else "downstream users: (none yet)")
    for d in report["downstream"]:
        out.print(Text(f"  {d['version_id']}  {d['kind']}  {d['created_at']}"))


LINEAGE_FIELDS = [
    ("kind", "kind"), ("name", "name"), ("snapshot id", "snapshot_id"), ("asset key", "asset_key"),
    ("partition", "partition"), ("dagster run id", "run_id"), ("code version", "code_version"),
    ("env lock", "env_lock"), ("config hash", "config_hash"), ("content hash", "content_hash"),
    ("uri", "uri"), ("created at", "created_at"), ("metadata", "metadata"), ("config", "config"),
]


def _json_or_str(value: Any) -> str:
    return json.dumps(value, default=str) if isinstance(value, (list, dict)) else str(value)


def _grow(tree, nodes: list[dict[str, Any]], shown: set[str] | None = None) -> None:
    """Add `nodes` and their upstream; a version already drawn (lineage is a DAG: checkpoints share
    a mix, tables share a tokenizer) is drawn once more without its subtree."""
    shown = set() if shown is None else shown
    for node in nodes:
        label = f"{node['version_id']}  {node['kind']}  {node.get('created_at', '')}".rstrip()
        if node["version_id"] in shown and node["upstream"]:
            tree.add(Text(f"{label}  (upstream shown above)"))
            continue
        shown.add(node["version_id"])
        _grow(tree.add(Text(label)), node["upstream"], shown)


# -- tables -----------------------------------------------------------------------------------
def cmd_tables(args: argparse.Namespace, out: Console) -> int:
    from factory.lake import LakeError
    from factory.lake.commit import stamp_of

    lake = open_lake(args)
    rows = []
    for name in lake.tables():
        try:
            table = lake.table(name)
        except LakeError as e:  # one broken table must not hide the others
            rows.append({"table": name, "rows": None, "bytes": None, "snapshot_id": None, "snapshots": None,
                         "asset_key": "", "error": str(e)})
            continue
        snapshot = table.current_snapshot()
        summary = snapshot.summary.additional_properties if snapshot and snapshot.summary else {}
        rows.append({
            "table": name,
            "rows": int(summary.get("total-records", 0)),
            "bytes": int(summary.get("total-files-size", 0)),
            "snapshot_id": snapshot.snapshot_id if snapshot else None,
            "snapshots": len(table.metadata.snapshots),
            "asset_key": stamp_of(table).get("asset-key", ""),
            "error": None,
        })
    broken = [r for r in rows if r["error"]]
    if args.json:
        print(json.dumps(rows))
    else:
        table = RichTable("table", "rows", "data", "snapshot", "snapshots", "asset key",
                          caption=f"{len(rows)} tables in {lake.home}" + (f", {len(broken)} unreadable" if broken else ""))
        for r in rows:
            if r["error"]:
                table.add_row(r["table"], Text("UNREADABLE", style="bold red"), NULL, NULL, NULL, NULL)
                continue
            table.add_row(r["table"], f"{r['rows']:,}", human_bytes(r["bytes"]), str(r["snapshot_id"] or NULL),
                          str(r["snapshots"]), r["asset_key"] or NULL)
        out.print(table)
    for r in broken:
        print(f"factory tables: error: {r['error']}", file=sys.stderr)
    return 1 if broken else 0


# -- lake -------------------------------------------------------------------------------------
def cmd_lake_heal(args: argparse.Namespace, out: Console) -> int:
    from factory.lake import LakeError
    from factory.lake.lineage import LINEAGE_TABLE

    lake = open_lake(args)
    names = args.tables or [t for t in lake.tables() if t != LINEAGE_TABLE]
    healed, failed = 0, []
    for name in names:
        try:
            written = lake.lineage.heal(name)
        except LakeError as e:  # a broken table is reported; the others are still healed
            failed.append(str(e))
            continue
        healed += len(written)
        for record in written:
            out.print(Text(f"{name}: wrote the lineage row of {record.version_id} (snapshot {record.snapshot_id})"))
    out.print(f"{healed} lineage row{'s' if healed != 1 else ''} written over {len(names) - len(failed)} tables")
    for message in failed:
        print(f"factory lake heal: error: {message}", file=sys.stderr)
    return 1 if failed else 0


def cmd_lake_recover(args: argparse.Namespace, out: Console) -> int:
    from factory.cli import profile
    from factory.deploy import catalog_config
    from factory.lake import Lake
    from factory.lake.health import recover_catalog

    lake = Lake.open(catalog_config(profile(args)), home=args.home, recovering=True)
    registered = recover_catalog(lake)
    for name, metadata in registered.items():
        out.print(Text(f"registered {name} from {metadata}"))
    out.print(f"{len(registered)} table{'s' if len(registered) != 1 else ''} re-registered; "
              f"{len(lake.tables())} in the catalog")
    return 0
