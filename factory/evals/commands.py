"""`factory export | eval | evals | serve`: the inference and eval stages from the shell (no Dagster).

`export` and `eval` are the calls the `checkpoint_export` / `eval_scores` assets make (export,
equivalence check, suite), so a researcher can reproduce a sensor-launched eval by hand; `eval`
refuses to score an export that fails the equivalence check; `--engine openai --endpoint URL` runs
both against a vLLM server (`factory serve`'s, or the cluster's). `serve` starts vLLM's
OpenAI-compatible server on loopback for an export.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.table import Table as RichTable


def _lake(args):
    from factory.cli import open_lake

    return open_lake(args)


def _typed(lake, text: str, *, run: bool = False, also: tuple[str, ...] = ()) -> str:
    """What `text` means: an experiment's name stands for its latest run (said on stderr)."""
    from factory.train.runs import as_typed

    return as_typed(lake, text, run=run, also=also)


def _engine_config(args):
    """`--engine` (and `--endpoint` for openai: a server such as `factory serve`'s)."""
    from pydantic import ValidationError

    from factory.deploy import DeployError
    from factory.infer import EngineConfig

    try:
        return EngineConfig(kind=args.engine, endpoint=getattr(args, "endpoint", None))
    except ValidationError as exc:
        raise DeployError(f"--engine {args.engine}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None


def cmd_export(args, out: Console) -> int:
    from factory.infer import export_checkpoint, find_checkpoint
    from factory.infer.equivalence import verify_export

    engine = _engine_config(args)  # a bad --engine/--endpoint fails before the export
    lake = _lake(args)
    checkpoint = find_checkpoint(lake, _typed(lake, args.checkpoint))
    export = export_checkpoint(lake, checkpoint, asset_key="cli")
    out.print(f"{export.export_id}: {export.path} (sha256 {export.sha256[:12]})")
    if not args.no_check:
        report = verify_export(lake, export, engine, checkpoint=checkpoint)
        out.print(report.summary())
        for problem in report.problems:
            out.print(f"  - {problem}")
        return 0 if report.passed else 2
    return 0


def cmd_eval(args, out: Console) -> int:
    from configs.evals import suite as eval_suite
    from factory.evals.suite import evaluate_checkpoint
    from factory.infer import find_checkpoint

    engine = _engine_config(args)
    lake = _lake(args)
    checkpoint = find_checkpoint(lake, _typed(lake, args.checkpoint))
    suite = eval_suite(args.suite or checkpoint.plan.experiment.eval_suite)
    result = evaluate_checkpoint(lake, checkpoint, suite, engine,
                                 log=lambda m: out.print(m, markup=False))
    out.print(f"\n{result.eval_id}\n")
    out.print(result.table)
    return 0


def cmd_evals(args, out: Console) -> int:
    from factory.evals import results

    lake = _lake(args)
    rows = results(lake)  # one scan: which runs have scores, then the rows asked for
    if args.run_name:  # a run with scores is itself, even without checkpoints left in the lake
        run = _typed(lake, args.run_name, run=True, also=tuple({r["run"] for r in rows}))
        rows = [r for r in rows if r["run"] == run]
    rows = [r for r in rows if args.suite is None or r["suite"] == args.suite]
    if not rows:
        out.print("no eval results yet (they appear when the eval sensor or `factory eval` scores a checkpoint)")
        return 0
    columns = sorted({(r["task"], r["metric"]) for r in rows})
    table = RichTable("run", "step", "tokens", *[f"{t}\n{m}" for t, m in columns])
    by_eval: dict[str, dict] = {}
    for r in rows:
        by_eval.setdefault(r["eval_id"], {"run": r["run"], "step": r["step"], "tokens": r["tokens"]})[
            (r["task"], r["metric"])] = r["value"]
    for e in sorted(by_eval.values(), key=lambda e: (e["run"], e["step"])):
        table.add_row(e["run"], str(e["step"]), f"{e['tokens']:,}",
                      *[f"{e[c]:.4f}" if c in e else "-" for c in columns])
    out.print(table)
    return 0


def cmd_serve(args, out: Console) -> int:
    """Replace this process with vLLM's OpenAI-compatible server for the export."""
    from factory.infer import find_export
    from factory.infer.vllm_engine import server_command, server_environment

    from pathlib import Path

    lake = _lake(args)
    export = find_export(lake, args.export if Path(args.export).is_dir() else _typed(lake, args.export))
    command = server_command(export, host=args.host, port=args.port)
    out.print(f"serving {export.export_id} ({export.path}) at http://{args.host}:{args.port}/v1 as model "
              f"{export.export_id!r}")
    sys.stdout.flush()
    os.execvpe(command[0], command, server_environment())
    return 0  # pragma: no cover - exec does not return
