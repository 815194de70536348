"""The `factory` command: look into the lake and run the embedded stages without Dagster.

    factory sql "select source, count(*) from raw.python_stdlib group by 1"   # DuckDB over Iceberg
    factory lineage raw.site_packages       # a version: where it came from, what used it
    factory tables                          # every table: rows, bytes, snapshot, asset key
    factory drops                           # per refinement step: rows kept, dropped by reason
    factory ingest python_stdlib [--full]   # the raw ingest, same entry point as the asset
    factory doctor                          # is this machine ready, and how to fix it if not
    factory mix show default                # versions of a mix: pinned snapshots, weights, tokens
    factory mix peek default                # decode one batch exactly as training streams it
    factory export smoke@120                # HF Llama export of a checkpoint + equivalence check
    factory eval smoke@120 [--suite quick]  # export, check and evaluate a checkpoint
    factory evals [--run smoke]             # every eval score, one row per checkpoint
    factory serve export/smoke@120          # vLLM's OpenAI-compatible server on loopback

`--home PATH` (before or after the command) picks the factory's state directory, else
$FACTORY_HOME, else `<checkout>/.factory`. The catalog is the embedded one unless
FACTORY_CATALOG_URI / FACTORY_WAREHOUSE say otherwise (read when a command runs, never at
import). Output is rich tables for people; `--json` / `--format` give machine-readable output.
Every failure a user can cause (bad SQL, an unknown table or ref, a missing source) exits 1 with
one message naming it, on stderr. The lake and data modules are imported inside the commands so
that `factory doctor` still runs, and says why, when one of their dependencies is broken.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table as RichTable
from rich.text import Text
from rich.tree import Tree

from factory.home import factory_home

NULL = "∅"


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich exits 1 here; let main() treat it like any other write to a closed pipe.
        raise BrokenPipeError


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Not a terminal (a pipe, a log, a test): no colour, and wide enough that ids are not wrapped.
    wide = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200
    out = _Console(file=sys.stdout, width=wide, highlight=False)
    try:
        code = args.run(args, out)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader stopped reading (`factory lineage X | head`): that is its choice, not our failure.
        # Point stdout at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        if not _user_error(exc):
            raise
        print(f"factory {args.command}: error: {exc}", file=sys.stderr)
        return 1


def _user_error(exc: Exception) -> bool:
    """Errors a user can cause get one line on stderr; anything else is a bug and keeps its traceback."""
    from factory.data.sources import SourceError
    from factory.experiments import ExperimentError
    from factory.experiments.automix import AutomixError
    from factory.experiments.launcher import LaunchError
    from factory.infer.export import ExportError
    from factory.lake import LakeError
    from factory.mix import MixError
    from factory.tokenize import TokenizerError

    return isinstance(exc, (LakeError, SourceError, MixError, TokenizerError, ExportError, ExperimentError, LaunchError,
                            AutomixError))


def build_parser() -> argparse.ArgumentParser:
    help_home = "state directory (default: $FACTORY_HOME, else ./.factory)"
    parser = argparse.ArgumentParser(prog="factory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", default=None, help=help_home)
    # Each command accepts --home too; SUPPRESS keeps it from overwriting one given before the command.
    home = argparse.ArgumentParser(add_help=False)
    home.add_argument("--home", default=argparse.SUPPRESS, help=help_home)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sql = commands.add_parser("sql", parents=[home], help="run SQL (DuckDB) over the lake's tables, as namespace.table")
    sql.add_argument("query")
    sql.add_argument("--format", choices=["table", "csv", "json"], default="table")
    sql.add_argument("--max-rows", type=int, default=100, help="rows shown by --format table (default 100)")
    sql.set_defaults(run=cmd_sql)

    lineage = commands.add_parser("lineage", parents=[home], help="where a version came from and what used it")
    lineage.add_argument("ref", help="table name, version id (table@snapshot), artifact URI or content-hash prefix")
    lineage.add_argument("--json", action="store_true", help="a JSON list, one report per version the ref resolves to")
    lineage.set_defaults(run=cmd_lineage)

    tables = commands.add_parser("tables", parents=[home], help="every table: rows, bytes, snapshot, asset key")
    tables.add_argument("--json", action="store_true")
    tables.set_defaults(run=cmd_tables)

    ingest = commands.add_parser("ingest", parents=[home], help="ingest embedded sources into raw.* (no Dagster)")
    ingest.add_argument("sources", nargs="*", metavar="SOURCE", help="embedded sources (default: all)")
    ingest.add_argument("--full", action="store_true", help="lift the demo caps (the whole corpus)")
    ingest.set_defaults(run=cmd_ingest)

    drops = commands.add_parser("drops", parents=[home], help="per-step refinement table: rows kept and dropped by reason")
    drops.add_argument("--source", action="append", help="only these sources (repeatable)")
    drops.add_argument("--json", action="store_true")
    drops.set_defaults(run=cmd_drops)

    doctor = commands.add_parser("doctor", parents=[home], help="check this machine and say how to fix it")
    doctor.add_argument("--json", action="store_true")
    doctor.set_defaults(run=cmd_doctor)

    mix = commands.add_parser("mix", parents=[home], help="mix specs and versions: list, show, register, peek")
    actions = mix.add_subparsers(dest="mix_command", required=True, metavar="ACTION")
    actions.add_parser("list", parents=[home], help="every spec in configs/mixes and its newest version") \
        .set_defaults(run=_lazy("factory.mix.commands", "list"))
    show = actions.add_parser("show", parents=[home], help="every version of a mix: pins, weights, token estimates")
    show.add_argument("name")
    show.add_argument("--json", action="store_true")
    show.set_defaults(run=_lazy("factory.mix.commands", "show"))
    register = actions.add_parser("register", parents=[home], help="pin configs/mixes/NAME.yaml to current snapshots")
    register.add_argument("name")
    register.set_defaults(run=_lazy("factory.mix.commands", "register"))
    peek = actions.add_parser("peek", parents=[home], help="stream one batch of a version and decode it")
    peek.add_argument("ref", help="mix name (newest version) or mix/<name>@v<N>")
    peek.add_argument("--rows", type=int, default=2, help="rows to decode (default 2)")
    peek.add_argument("--seed", type=int, default=0)
    peek.set_defaults(run=_lazy("factory.mix.commands", "peek"))

    engines = ("vllm", "transformers")
    export = commands.add_parser("export", parents=[home], help="export a checkpoint (HF Llama) and check equivalence")
    export.add_argument("checkpoint", help="checkpoint id: <run>@<step> or ckpt/<run>@<step>")
    export.add_argument("--engine", choices=engines, default="vllm", help="engine checked against ours")
    export.add_argument("--no-check", action="store_true", help="skip the equivalence check")
    export.set_defaults(run=_lazy("factory.evals.commands", "export"))
    evaluate = commands.add_parser("eval", parents=[home], help="export, check and evaluate a checkpoint")
    evaluate.add_argument("checkpoint", help="checkpoint id: <run>@<step> or ckpt/<run>@<step>")
    evaluate.add_argument("--suite", help="eval suite of configs/evals.py (default: the experiment's)")
    evaluate.add_argument("--engine", choices=engines, default="vllm")
    evaluate.set_defaults(run=_lazy("factory.evals.commands", "eval"))
    scores = commands.add_parser("evals", parents=[home], help="eval scores, one row per evaluated checkpoint")
    scores.add_argument("--run", dest="run_name", help="only this run")
    scores.add_argument("--suite", help="only this suite")
    scores.set_defaults(run=_lazy("factory.evals.commands", "evals"))
    serve = commands.add_parser("serve", parents=[home], help="vLLM's OpenAI-compatible server for an export")
    serve.add_argument("export", help="export/<run>@<step>, a checkpoint id, or an export directory")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.set_defaults(run=_lazy("factory.evals.commands", "serve"))
    _experiment_commands(commands, home)
    return parser


def _experiment_commands(commands, home) -> None:
    module = "factory.experiments.commands"
    url = argparse.ArgumentParser(add_help=False)
    url.add_argument("--url", help="Dagster webserver, e.g. http://127.0.0.1:3000 (default: queue through "
                                   "dagster-graphql into $DAGSTER_HOME, no server needed)")
    experiment = commands.add_parser("experiment", parents=[home], help="experiments as code: list, show, submit")
    actions = experiment.add_subparsers(dest="experiment_command", required=True, metavar="ACTION")
    actions.add_parser("list", parents=[home], help="every experiment in configs/experiments and its run name") \
        .set_defaults(run=_lazy(module, "experiment_list"))
    show = actions.add_parser("show", parents=[home], help="plan an experiment and print its card")
    show.add_argument("name")
    show.set_defaults(run=_lazy(module, "experiment_show"))
    for action, text in (("submit", "queue runs of experiments (unchanged ones are skipped)"),
                         ("register", "add the runs' training_run partitions only; print their run names")):
        p = actions.add_parser(action, parents=[home, url], help=text)
        p.add_argument("names", nargs="*", metavar="NAME")
        p.add_argument("--all", action="store_true", help="every experiment")
        if action == "submit":
            p.add_argument("--force", action="store_true", help="queue even when a run of the same config exists")
        p.set_defaults(run=_lazy(module, f"experiment_{action}"))

    sweep = commands.add_parser("sweep", parents=[home], help="sweeps: list, show, launch, run, results")
    actions = sweep.add_subparsers(dest="sweep_command", required=True, metavar="ACTION")
    actions.add_parser("list", parents=[home], help="every sweep in configs/sweeps").set_defaults(
        run=_lazy(module, "sweep_list"))
    for action, text in (("show", "a sweep's cells and their run names"),
                         ("launch", "queue one tagged run per cell in Dagster"),
                         ("run", "train and evaluate every cell here, one after another (no Dagster)"),
                         ("results", "write sweeps.results, rank the cells, plot them")):
        p = actions.add_parser(action, parents=[home] + ([url] if action == "launch" else []), help=text)
        p.add_argument("name")
        if action == "launch":
            p.add_argument("--force", action="store_true", help="queue cells that already have runs too")
        if action == "run":
            p.add_argument("--no-eval", action="store_true", help="train only")
        p.set_defaults(run=_lazy(module, f"sweep_{action}"))

    automix = commands.add_parser("automix", parents=[home], help="RegMix: propose a mix from a proxy sweep")
    automix.add_argument("sweep", help="a sweep over mix_weights whose cells are evaluated (e.g. automix)")
    automix.add_argument("--name", default="automix", help="mix name to register the proposal under")
    automix.set_defaults(run=_lazy(module, "automix"))


def _lazy(module: str, action: str):
    """The callback `cmd_<action>` of `module`, imported only when that command runs (the heavy
    imports of one command never slow down another)."""
    def run(args: argparse.Namespace, out: Console) -> int:
        import importlib

        return getattr(importlib.import_module(module), f"cmd_{action}")(args, out)

    return run


def open_lake(args: argparse.Namespace):
    from factory.lake import Lake

    return Lake.open(catalog_config(), home=args.home)


def catalog_config():
    """The embedded catalog, unless FACTORY_CATALOG_URI / FACTORY_WAREHOUSE point elsewhere."""
    from factory.lake import CatalogConfig

    uri, warehouse = os.environ.get("FACTORY_CATALOG_URI"), os.environ.get("FACTORY_WAREHOUSE")
    kind = "rest" if uri and uri.startswith(("http://", "https://")) else "sql"
    return CatalogConfig(kind=kind, uri=uri or None, warehouse=warehouse or None)


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
    reports = describe(open_lake(args), args.ref)
    if args.json:
        print(json.dumps(reports, default=str, indent=2))
        return 0
    for report in reports:
        render_lineage(report, out)
    return 0


def describe(lake, ref: str) -> list[dict[str, Any]]:
    """Everything `factory lineage` shows about the versions `ref` resolves to, as plain data."""
    records = lake.lineage.resolve(ref)
    recorded = bool(records)
    reports = []
    for record in records or [_unrecorded_snapshot(lake, ref)]:
        tree = lake.lineage.upstream_of(record.version_id)
        reports.append({
            "recorded": recorded,
            "version": {**record.model_dump(mode="json", exclude={"config_json", "metadata_json"}),
                        "config": record.config, "metadata": record.metadata},
            "upstream": [_tree(child) for child in tree["upstream"]],
            "downstream": [_brief(r) for r in lake.lineage.downstream_of(record.version_id)],
            **_snapshots(lake, record),
        })
    return reports


def _unrecorded_snapshot(lake, ref: str):
    """A table snapshot without a lineage row (e.g. `factory.lineage` itself, or a commit whose
    row was never written): still explained by its own summary properties."""
    from factory.lake import LakeError, LineageRecord
    from factory.lake.commit import stamp_of

    name, _, snap = ref.partition("@")
    table = lake.table(name) if lake.has_table(name) else None
    snapshot = None
    if table is not None and (snap.isdigit() or not snap):
        snapshot = table.snapshot_by_id(int(snap)) if snap else table.current_snapshot()
    if snapshot is None:
        known = ", ".join(lake.tables()) or "none yet"
        raise LakeError(f"unknown ref {ref}: no table, artifact name, version id, URI or content-hash prefix "
                        f"(8+ chars) matches it (tables in the lake: {known})")
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
    )


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
    if not report["recorded"]:
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
    from factory.lake.commit import stamp_of

    lake = open_lake(args)
    rows = []
    for name in lake.tables():
        table = lake.table(name)
        snapshot = table.current_snapshot()
        summary = snapshot.summary.additional_properties if snapshot and snapshot.summary else {}
        rows.append({
            "table": name,
            "rows": int(summary.get("total-records", 0)),
            "bytes": int(summary.get("total-files-size", 0)),
            "snapshot_id": snapshot.snapshot_id if snapshot else None,
            "snapshots": len(table.metadata.snapshots),
            "asset_key": stamp_of(table).get("asset-key", ""),
        })
    if args.json:
        print(json.dumps(rows))
        return 0
    table = RichTable("table", "rows", "data", "snapshot", "snapshots", "asset key",
                      caption=f"{len(rows)} tables in {lake.home}")
    for r in rows:
        table.add_row(r["table"], f"{r['rows']:,}", human_bytes(r["bytes"]), str(r["snapshot_id"] or NULL),
                      str(r["snapshots"]), r["asset_key"] or NULL)
    out.print(table)
    return 0


# -- drops ------------------------------------------------------------------------------------
def cmd_drops(args: argparse.Namespace, out: Console) -> int:
    from configs.refine import pipelines
    from factory.data.refine.report import drop_table

    chosen = [p for name, p in pipelines().items() if not args.source or name in args.source]
    rows = drop_table(open_lake(args), chosen)
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        out.print("no refinement step has been materialized yet (make demo, or the refine_* groups in the UI)")
        return 0
    table = RichTable("source", "step", "rows in", "rows out", "MB out", "dropped by reason", "redacted",
                      caption="drops are in refined.exclusions (factory sql ... where step = '<step>')")
    for r in rows:
        dropped = ", ".join(f"{k} {v:,}" for k, v in r["dropped"].items()) or "-"
        redacted = ", ".join(f"{k} {v:,}" for k, v in r["redactions"].items()) or "-"
        table.add_row(r["source"], r["step"], f"{r['rows_in']:,}", f"{r['rows_out']:,}",
                      f"{r['bytes_out'] / 1e6:.1f}", dropped, redacted)
    out.print(table)
    return 0


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


# -- ingest -----------------------------------------------------------------------------------
def cmd_ingest(args: argparse.Namespace, out: Console) -> int:
    from configs.sources import EMBEDDED, embedded_source
    from factory.data.ingest import ingest_source

    names = args.sources or list(EMBEDDED)
    unknown = [n for n in names if n not in EMBEDDED]
    if unknown:
        print(f"factory ingest: error: unknown source {', '.join(unknown)}; embedded sources: {', '.join(EMBEDDED)}",
              file=sys.stderr)
        return 1
    lake = open_lake(args)
    summary = RichTable("table", "result", "documents", "text", "snapshot", "skipped", "seconds")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=out) as progress:
        for name in names:
            task = progress.add_task(f"ingest {name}", total=None)
            result = ingest_source(
                lake, embedded_source(name, full=args.full), asset_key=f"raw/{name}",
                progress=lambda done, total, task=task: progress.update(task, completed=done, total=total),
            )
            skipped = ", ".join(f"{k}={v}" for k, v in result.skipped.items()) or "-"
            summary.add_row(result.table, "new snapshot" if result.committed else "unchanged",
                            f"{result.documents:,}", human_bytes(result.bytes), str(result.snapshot_id),
                            skipped, f"{result.seconds:.1f}")
    out.print(summary)
    return 0


# -- doctor -----------------------------------------------------------------------------------
def cmd_doctor(args: argparse.Namespace, out: Console) -> int:
    from factory.doctor import run_checks

    checks = run_checks(factory_home(args.home), catalog_config())
    failed = sum(c.status == "fail" for c in checks)
    if args.json:
        print(json.dumps([c.as_dict() for c in checks], indent=2))
        return 1 if failed else 0
    style = {"ok": "[green]OK[/]", "warn": "[yellow]WARN[/]", "fail": "[bold red]FAIL[/]"}
    table = RichTable("", "check", "detail", "fix")
    for c in checks:
        table.add_row(style[c.status], c.name, Text(c.detail), Text(c.fix))  # fixes hold '[cpu]'
    out.print(table)
    warned = sum(c.status == "warn" for c in checks)
    out.print(f"{len(checks) - failed - warned} ok, {warned} warn, {failed} fail", markup=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
