"""The `factory` command: look into the lake and run the embedded stages without Dagster.

    factory sql "select source, count(*) from raw.python_stdlib group by 1"   # DuckDB over Iceberg
    factory lineage raw.site_packages       # a version: where it came from, what used it
    factory tables                          # every table: rows, bytes, snapshot, asset key
    factory drops                           # per refinement step: rows kept, dropped by reason
    factory ingest python_stdlib [--full]   # the raw ingest, same entry point as the asset
    factory ingest --sources my.yaml notes  # ... of a source declared in a YAML file
    factory doctor                          # is this machine ready, is the lake whole, how to fix it if not
    factory doctor --full                   # ... reading every manifest and data file of the lake too
    factory lake heal                       # write lineage rows a crash lost (from the snapshots' stamps)
    factory mix show default                # versions of a mix: pinned snapshots, weights, tokens
    factory mix peek default                # decode one batch exactly as training streams it
    factory export smoke@120                # HF Llama export of a checkpoint + equivalence check
    factory eval smoke@120 [--suite quick]  # export, check and evaluate a checkpoint
    factory evals [--run smoke]             # every eval score, one row per checkpoint
    factory serve export/smoke@120          # vLLM's OpenAI-compatible server on loopback
    factory experiment submit smoke         # queue an experiment's run in Dagster (unchanged: skipped)
    factory sweep launch smoke_lr           # queue one tagged run per cell of a sweep

`--home PATH` (before or after the command) picks the factory's state directory, else
$FACTORY_HOME, else `<checkout>/.factory`. `--deploy NAME` picks the deployment profile (every
engine: catalog, Spark, launcher, ...), else $FACTORY_DEPLOY, else `embedded` (read when a command
runs, never at import); `factory deploy check` asks each engine of a profile whether it answers. Output is rich tables for people; `--json` / `--format` give machine-readable output.
Every failure a user can cause (bad SQL, an unknown table or ref, a missing source) exits 1 with
one message naming it, on stderr. The lake and data modules are imported inside the commands so
that `factory doctor` still runs, and says why, when one of their dependencies is broken; the
commands of each area live beside it (`factory/{lake,mix,evals,experiments}/commands.py`) and are
imported only when they run. That is also what keeps a read command under 2 s: this module imports
rich's console and the settings only, and no read command imports torch, Spark, vLLM, transformers,
MLflow or Dagster (tests/test_read_only.py checks; bench/cli_bench.py times them). Read commands
(tables, sql, lineage, drops, mix list/show, evals, experiment/sweep list/show, sweep results,
doctor) write nothing to the home; `sweep results --write` is the explicit way to commit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from rich.console import Console

from factory import settings

NULL = "∅"


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich exits 1 here; let main() treat it like any other write to a closed pipe.
        raise BrokenPipeError


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Not a terminal (a pipe, a log, a test): no colour, and wide enough that ids are not wrapped.
    wide = None if sys.stdout.isatty() or settings.get("COLUMNS") else 200
    out = _Console(file=sys.stdout, width=wide, highlight=False)
    try:
        if getattr(args, "deploy", None):
            # processes this command starts (cells' trainers, jobs/queue_runs.py and its runs) get it too
            from factory.deploy import profile_env

            settings.export(profile_env(profile(args)))
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


# The errors a user can cause, by (module, class). Looked up in sys.modules, never imported: an
# exception's class is loaded by definition, and importing them all here would pull torch into
# every failing command (`factory.infer.export`).
_USER_ERRORS = (
    ("factory.data.sources", "SourceError"), ("factory.deploy", "DeployError"), ("factory.envs.sources", "SourceError"),
    ("factory.experiments", "ExperimentError"), ("factory.experiments.automix", "AutomixError"),
    ("factory.experiments.launcher", "LaunchError"), ("factory.infer.export", "ExportError"),
    ("factory.infer.openai_engine", "EndpointError"), ("factory.lake", "LakeError"), ("factory.mix", "MixError"), ("factory.tokenize", "TokenizerError"),
    ("factory.train.runs", "UnknownRun"),
)


def _user_error(exc: Exception) -> bool:
    """Errors a user can cause get one line on stderr; anything else is a bug and keeps its traceback."""
    kinds = [getattr(sys.modules.get(module), name, None) for module, name in _USER_ERRORS]
    return isinstance(exc, tuple(k for k in kinds if isinstance(k, type)))


def build_parser() -> argparse.ArgumentParser:
    help_home = "state directory (default: $FACTORY_HOME, else ./.factory)"
    help_deploy = "deployment profile: a name in configs/deploy or a .yaml/.json file (default: $FACTORY_DEPLOY, else embedded)"
    parser = argparse.ArgumentParser(prog="factory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", default=None, help=help_home)
    parser.add_argument("--deploy", default=None, help=help_deploy)
    # Each command accepts --home / --deploy too; SUPPRESS keeps them from overwriting ones given before it.
    home = argparse.ArgumentParser(add_help=False)
    home.add_argument("--home", default=argparse.SUPPRESS, help=help_home)
    home.add_argument("--deploy", default=argparse.SUPPRESS, help=help_deploy)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sql = commands.add_parser("sql", parents=[home], help="run SQL (DuckDB) over the lake's tables, as namespace.table")
    sql.add_argument("query")
    sql.add_argument("--format", choices=["table", "csv", "json"], default="table")
    sql.add_argument("--max-rows", type=int, default=100, help="rows shown by --format table (default 100)")
    sql.set_defaults(run=_lazy("factory.lake.commands", "sql"))

    lineage = commands.add_parser("lineage", parents=[home], help="where a version came from and what used it")
    lineage.add_argument("ref", help="table name, version id (table@snapshot), artifact URI or content-hash prefix")
    lineage.add_argument("--json", action="store_true", help="a JSON list, one report per version the ref resolves to")
    lineage.set_defaults(run=_lazy("factory.lake.commands", "lineage"))

    tables = commands.add_parser("tables", parents=[home], help="every table: rows, bytes, snapshot, asset key")
    tables.add_argument("--json", action="store_true")
    tables.set_defaults(run=_lazy("factory.lake.commands", "tables"))

    ingest = commands.add_parser("ingest", parents=[home], help="ingest sources into raw.* (no Dagster)")
    ingest.add_argument("sources", nargs="*", metavar="SOURCE",
                        help="sources by name (default: all embedded ones, or all of --sources)")
    ingest.add_argument("--sources", dest="sources_file", metavar="FILE",
                        help="a YAML file of source configs (name: {kind: directory, root: ...}) to pick from "
                             "instead of the embedded sources")
    ingest.add_argument("--full", action="store_true", help="lift the embedded sources' demo caps (the whole corpus)")
    ingest.add_argument("--allow-shrink", action="store_true",
                        help="commit even when a source drops more than its max_shrink of the table's rows")
    ingest.add_argument("--force", action="store_true",
                        help="rewrite the table from the source even when unchanged (repairs deleted or corrupt data "
                             "files; a table with unreadable metadata is dropped and re-created, losing its history)")
    ingest.set_defaults(run=cmd_ingest)

    drops = commands.add_parser("drops", parents=[home], help="per-step refinement table: rows kept and dropped by reason")
    drops.add_argument("--source", action="append", help="only these sources (repeatable)")
    drops.add_argument("--json", action="store_true")
    drops.set_defaults(run=cmd_drops)

    lake = commands.add_parser("lake", parents=[home], help="lake upkeep: heal lineage gaps, recover a lost catalog")
    actions = lake.add_subparsers(dest="lake_command", required=True, metavar="ACTION")
    heal = actions.add_parser("heal", parents=[home], help="write the lineage rows that stamped snapshots owe")
    heal.add_argument("tables", nargs="*", metavar="TABLE", help="tables to heal (default: every table)")
    heal.set_defaults(run=_lazy("factory.lake.commands", "lake_heal"))
    actions.add_parser("recover", parents=[home], help="re-register warehouse tables a lost or emptied catalog "
                                                       "no longer lists").set_defaults(
        run=_lazy("factory.lake.commands", "lake_recover"))

    doctor = commands.add_parser("doctor", parents=[home], help="check this machine and say how to fix it")
    doctor.add_argument("--json", action="store_true")
    doctor.add_argument("--full", action="store_true", help="also read every manifest and data file (size, Parquet "
                                                            "footer) of every table: slower on a long history")
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

    engines = ("vllm", "transformers", "openai")
    help_endpoint = "--engine openai: the vLLM server's base URL (`factory serve`: http://127.0.0.1:8000/v1)"
    export = commands.add_parser("export", parents=[home], help="export a checkpoint (HF Llama) and check equivalence")
    export.add_argument("checkpoint", help="checkpoint id: <run>@<step> or ckpt/<run>@<step>")
    export.add_argument("--engine", choices=engines, default="vllm", help="engine checked against ours")
    export.add_argument("--endpoint", help=help_endpoint)
    export.add_argument("--no-check", action="store_true", help="skip the equivalence check")
    export.set_defaults(run=_lazy("factory.evals.commands", "export"))
    evaluate = commands.add_parser("eval", parents=[home], help="export, check and evaluate a checkpoint")
    evaluate.add_argument("checkpoint", help="checkpoint id: <run>@<step> or ckpt/<run>@<step>")
    evaluate.add_argument("--suite", help="eval suite of configs/evals.py (default: the experiment's)")
    evaluate.add_argument("--engine", choices=engines, default="vllm")
    evaluate.add_argument("--endpoint", help=help_endpoint)
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
    podium = commands.add_parser("podium", parents=[home], help="the Podium web app: chat with exports, battles, "
                                                               "votes, leaderboard, dataset browser")
    podium.add_argument("--host", help="address to bind (default 127.0.0.1)")
    podium.add_argument("--port", type=int, help="port (default 8100)")
    podium.add_argument("--auth", choices=("tokens", "header"), help="users from a token list (default) or a proxy header")
    podium.add_argument("--user-header", help="--auth header: the header naming the user (default X-Forwarded-User)")
    podium.add_argument("--tokens-file", help="JSON {token: user} (default FACTORY_HOME/podium/tokens.json)")
    podium.add_argument("--backend", choices=("profile", "local", "openai"), help="inference: in-process or the "
                                                                              "profile's vLLM endpoint")
    podium.add_argument("--pairing", choices=("random", "leader"), help="battle pairs (default random)")
    podium.set_defaults(run=_lazy("factory.podium.commands", "podium"))
    _experiment_commands(commands, home)
    _deploy_commands(commands, home)
    metrics = commands.add_parser("metrics", parents=[home], help="factory-health metrics for Prometheus: serve")
    serve_metrics = metrics.add_subparsers(dest="metrics_command", required=True, metavar="ACTION").add_parser(
        "serve", parents=[home], help="serve /metrics on 127.0.0.1 from every process's series (factory.health)")
    from factory.health.exporter import add_arguments  # light: argparse and paths only

    add_arguments(serve_metrics).add_argument("--dagster-home", help="also export the Dagster run queue of this instance")
    serve_metrics.set_defaults(run=_lazy("factory.health.exporter", "serve"))
    return parser


def _deploy_commands(commands, home) -> None:
    module = "factory.deploy.commands"
    deploy = commands.add_parser("deploy", parents=[home], help="deployment profiles: list, show, check, instance, up, down, render")
    actions = deploy.add_subparsers(dest="deploy_command", required=True, metavar="ACTION")
    for action, text in (("list", "every profile in configs/deploy"),
                         ("show", "the active profile (or --deploy), secrets as the variables that hold them"),
                         ("check", "validate the profile and ask every engine it names whether it answers"),
                         ("instance", "write the Dagster instance YAML of the profile to $DAGSTER_HOME/dagster.yaml"),
                         ("up", "start the loopback servers the profile names (SeaweedFS, Spark, PostgreSQL)"),
                         ("down", "stop the servers `deploy up` started, by PID"),
                         ("status", "which servers `deploy up` started are still running"),
                         ("render", "write the profile's Helm values and Kubernetes manifests, validated, to --out")):
        p = actions.add_parser(action, parents=[home], help=text)
        if action == "render":
            p.add_argument("--out", required=True, help="output directory (replaced only when everything validates)")
        if action == "instance":
            p.add_argument("--dagster-home", help="default: $DAGSTER_HOME, else FACTORY_HOME/dagster")
        if action in ("show", "check", "status"):
            p.add_argument("--json", action="store_true")
        p.set_defaults(run=_lazy(module, action))


def _experiment_commands(commands, home) -> None:
    module = "factory.experiments.commands"
    url = argparse.ArgumentParser(add_help=False)
    url.add_argument("--url", help="Dagster webserver, e.g. http://127.0.0.1:3000 (default: queue into "
                                   "$DAGSTER_HOME from a local process, no server needed)")
    experiment = commands.add_parser("experiment", parents=[home], help="experiments as code: list, show, submit")
    actions = experiment.add_subparsers(dest="experiment_command", required=True, metavar="ACTION")
    actions.add_parser("list", parents=[home], help="every experiment in configs/experiments and its run name") \
        .set_defaults(run=_lazy(module, "experiment_list"))
    show = actions.add_parser("show", parents=[home], help="plan an experiment and print its card")
    show.add_argument("name")
    show.set_defaults(run=_lazy(module, "experiment_show"))
    train = actions.add_parser("train", parents=[home], help="train an experiment here (this node's torchrun agent "
                                                            "for a multi-node run), no Dagster")
    train.add_argument("name")
    train.add_argument("--node-rank", type=int, help="this node (default: the profile's, else NODE_RANK / "
                                                     "JOB_COMPLETION_INDEX / SLURM_NODEID, else 0)")
    train.add_argument("--print", dest="print_only", action="store_true", help="print the command, do not run it")
    train.set_defaults(run=_lazy(module, "experiment_train"))
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
                         ("results", "rank the cells as the lake stands (read only; --write commits "
                                     "sweeps.results and the plot)")):
        p = actions.add_parser(action, parents=[home] + ([url] if action == "launch" else []), help=text)
        p.add_argument("name")
        if action == "launch":
            p.add_argument("--force", action="store_true", help="queue cells that already have runs too")
        if action == "run":
            p.add_argument("--no-eval", action="store_true", help="train only")
        if action == "results":
            p.add_argument("--write", action="store_true",
                           help="also commit sweeps.results and draw artifacts/sweeps/NAME/summary.png")
        p.set_defaults(run=_lazy(module, f"sweep_{action}"))

    automix = commands.add_parser("automix", parents=[home], help="RegMix: propose a mix from a proxy sweep")
    automix.add_argument("sweep", help="a sweep over mix_weights whose cells are evaluated (e.g. automix)")
    automix.add_argument("--name", default="automix", help="mix name to register the proposal under")
    automix.set_defaults(run=_lazy(module, "automix"))

    envs = commands.add_parser("envs", parents=[home], help="repository environments: mirror, build, builds, image")
    actions = envs.add_subparsers(dest="envs_command", required=True, metavar="ACTION")
    p = actions.add_parser("mirror", parents=[home], help="a local package index with a repository set's sdists and wheels")
    p.add_argument("--repos", required=True, help="repository set (configs/envs), e.g. demo")
    p.add_argument("--dest", required=True, help="directory of the mirror (its index is DEST/simple)")
    p.add_argument("--registry", default=None, help="index to mirror from (default: pip's configured index)")
    p.set_defaults(run=_lazy("factory.envs.commands", "mirror"))
    p = actions.add_parser("build", parents=[home], help="build and test every repository of a set; commit envs.builds")
    p.add_argument("--repos", required=True, help="repository set (configs/envs), e.g. demo")
    p.add_argument("--registry", default=None,
                   help="index URL or mirror directory (default: $FACTORY_REGISTRY, else pip's configured index)")
    p.add_argument("--parallel", type=int, default=1, help="repositories built at once (default 1)")
    p.add_argument("--json", action="store_true", help="one JSON object per build")
    p.set_defaults(run=_lazy("factory.envs.commands", "build"))
    p = actions.add_parser("builds", parents=[home], help="the builds the lake holds, oldest first")
    p.add_argument("--repos", default=None, help="only this repository set")
    p.add_argument("--json", action="store_true", help="rows as JSON")
    p.set_defaults(run=_lazy("factory.envs.commands", "builds"))
    p = actions.add_parser("image", parents=[home], help="an OCI image per environment of a set's latest passing builds "
                           "(buildah; base per Python version)")
    p.add_argument("--repos", required=True, help="repository set (configs/envs), e.g. demo")
    p.set_defaults(run=_lazy("factory.envs.commands", "image"))


def _lazy(module: str, action: str):
    """The callback `cmd_<action>` of `module`, imported only when that command runs (the heavy
    imports of one command never slow down another)."""
    def run(args: argparse.Namespace, out: Console) -> int:
        import importlib

        return getattr(importlib.import_module(module), f"cmd_{action}")(args, out)

    return run


def profile(args: argparse.Namespace):
    """The deployment profile of this command: --deploy, else $FACTORY_DEPLOY, else embedded."""
    from factory.deploy import load_profile

    return load_profile(getattr(args, "deploy", None))


def open_lake(args: argparse.Namespace):
    from factory.deploy import open_lake as open_profile_lake

    return open_profile_lake(profile(args), home=args.home)


# -- drops ------------------------------------------------------------------------------------
def cmd_drops(args: argparse.Namespace, out: Console) -> int:
    from rich.table import Table as RichTable

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
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table as RichTable

    from factory.data.ingest import ingest_source

    if args.sources_file:
        from factory.data.source_files import load_sources

        if args.full:
            print("factory ingest: error: --full lifts the embedded sources' demo caps; a sources file sets its own",
                  file=sys.stderr)
            return 1
        declared = load_sources(args.sources_file)  # the whole file validates before anything is ingested
        known, config = f"sources in {args.sources_file}", declared.__getitem__
    else:
        from configs.sources import EMBEDDED, embedded_source

        declared, known = EMBEDDED, "embedded sources"
        config = lambda name: embedded_source(name, full=args.full)  # noqa: E731
    names = args.sources or list(declared)
    unknown = [n for n in names if n not in declared]
    if unknown:
        print(f"factory ingest: error: unknown source {', '.join(unknown)}; {known}: {', '.join(declared)}",
              file=sys.stderr)
        return 1
    lake = open_lake(args)
    summary = RichTable("table", "result", "documents", "text", "snapshot", "skipped", "seconds")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=out) as progress:
        for name in names:
            task = progress.add_task(f"ingest {name}", total=None)
            result = ingest_source(
                lake, config(name), asset_key=f"raw/{name}", allow_shrink=args.allow_shrink, force=args.force,
                progress=lambda done, total, task=task: progress.update(task, completed=done, total=total),
            )
            skipped = ", ".join(f"{k}={v}" for k, v in result.skipped.items()) or "-"
            summary.add_row(result.table, ("rewritten" if args.force else "new snapshot") if result.committed else "unchanged",
                            f"{result.documents:,}", human_bytes(result.bytes), str(result.snapshot_id),
                            skipped, f"{result.seconds:.1f}")
    out.print(summary)
    return 0


# -- doctor -----------------------------------------------------------------------------------
def cmd_doctor(args: argparse.Namespace, out: Console) -> int:
    from rich.table import Table as RichTable
    from rich.text import Text

    from factory.deploy import catalog_config
    from factory.doctor import run_checks
    from factory.home import factory_home

    checks = run_checks(factory_home(args.home), catalog_config(profile(args)), full=args.full)
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
