"""`factory experiment ...` and `factory sweep ...`: experiments as code from the shell.

`experiment list | show | submit | register` and `sweep list | show | launch` read the config
files as they are now, plan against the lake (errors name the experiment and the field) and, for
`submit` / `launch`, queue runs in Dagster (`factory.experiments.launcher`): to the webserver
with `--url`, else into `$DAGSTER_HOME` through one small process that imports Dagster alone
(jobs/queue_runs.py), which `register` also uses to add the partitions. `sweep run` trains and
evaluates the cells one after another without Dagster (the same trainer and eval calls), and
`sweep results` ranks the cells as the lake stands, read only; with `--write` it also commits
`sweeps.results` and draws the plot (what the `sweeps/results` asset does). An RL sweep's
cells launch as `rl_job` runs (`rl_run` partitions) and rank by their final reward; `sweep run`
trains pre-training cells only.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table as RichTable


def _lake(args):
    from factory.cli import open_lake

    return open_lake(args)


def cmd_experiment_list(args, out: Console) -> int:
    from factory.experiments.registry import discover_experiments
    from factory.experiments.sweep import run_name

    found = discover_experiments()
    table = RichTable("experiment", "run", "file", "description")
    for name, f in sorted(found.found.items()):
        table.add_row(name, run_name(f.config), f.source, f.config.description)
    out.print(table)
    for error in found.errors:
        out.print(f"[red]cannot load[/red] {error}")
    return 1 if found.errors else 0


def cmd_experiment_show(args, out: Console) -> int:
    from factory.experiments import plan_experiment
    from factory.experiments.card import render_card
    from factory.experiments.registry import get_experiment

    out.print(render_card(plan_experiment(_lake(args), get_experiment(args.name))), markup=False)
    return 0


def _runs(args):
    from factory.experiments.queue import experiment_runs

    runs, errors = experiment_runs(_lake(args), names=None if args.all else args.names)
    if errors:
        from factory.experiments import ExperimentError

        raise ExperimentError("; ".join(errors))
    return runs


def cmd_experiment_register(args, out: Console) -> int:
    """Partitions only: no plan, so it works before the mix exists (`make demo` calls it first)."""
    from factory.experiments.launcher import PARTITIONS, queue_for
    from factory.experiments.registry import discover_experiments
    from factory.experiments.sweep import run_name

    found = discover_experiments()
    names = sorted(found.found) if args.all else args.names
    runs = [run_name(found.get(n, "experiment", "configs/experiments")) for n in names]
    with queue_for(args.url) as queue:
        queue.add_partitions(PARTITIONS, runs)
    for r in runs:
        out.print(r)
    return 0


def cmd_experiment_train(args, out: Console) -> int:
    """The trainer of one experiment on this node, with the profile handed down explicitly: on a
    multi-node run every node runs this same command (under srun, or a pod per node)."""
    import shlex
    import subprocess

    from factory import settings
    from factory.cli import profile
    from factory.deploy import profile_env
    from factory.experiments import plan_experiment
    from factory.experiments.registry import get_experiment
    from factory.home import CHECKOUT
    from factory.train.launch import launch_command

    deploy, lake = profile(args), _lake(args)
    plan = plan_experiment(lake, get_experiment(args.name))
    command = launch_command(plan, home=str(lake.home), training=deploy.training, node_rank=args.node_rank)
    if args.print_only:
        print(shlex.join(command))
        return 0
    env = {**settings.environment(), **profile_env(deploy), "FACTORY_HOME": str(lake.home)}
    return subprocess.run(command, cwd=CHECKOUT, env=env).returncode


def cmd_experiment_submit(args, out: Console) -> int:
    from factory.experiments.launcher import queue_for, submit

    started = time.perf_counter()
    with queue_for(args.url) as queue:  # without --url its process starts now, beside the planning
        runs = _runs(args)
        submitted = submit(runs, queue, skip_existing=not args.force)
    return _report(out, runs, submitted, started)


def _report(out: Console, runs, submitted, started: float) -> int:
    table = RichTable("run", "queued as", "status", "card")
    for r, s in zip(runs, submitted):
        table.add_row(r.run, s.run_id or f"(unchanged: {s.existing})", s.status, r.card_path)
    out.print(table)
    new = sum(1 for s in submitted if s.run_id)
    out.print(f"queued {new} run(s), {len(runs) - new} unchanged, in {time.perf_counter() - started:.2f} s")
    return 0


def cmd_sweep_list(args, out: Console) -> int:
    from factory.experiments.registry import discover_sweeps
    from factory.experiments.sweep import expand

    found = discover_sweeps()
    table = RichTable("sweep", "search", "cells", "metric", "cron", "file")
    for name, f in sorted(found.found.items()):
        s = f.config
        table.add_row(name, s.search, str(len(expand(s))), s.metric, s.cron or "-", f.source)
    out.print(table)
    for error in found.errors:
        out.print(f"[red]cannot load[/red] {error}")
    return 1 if found.errors else 0


def cmd_sweep_show(args, out: Console) -> int:
    from factory.experiments.registry import get_sweep
    from factory.experiments.sweep import expand

    sweep = get_sweep(args.name)
    out.print(f"sweep {sweep.name}: {sweep.description}")
    table = RichTable("cell", "run", "params")
    for c in expand(sweep):
        table.add_row(str(c.index), c.run, ", ".join(f"{k}={v}" for k, v in c.params.items()))
    out.print(table)
    return 0


def cmd_sweep_launch(args, out: Console) -> int:
    from factory.experiments.launcher import queue_for, submit
    from factory.experiments.queue import sweep_runs
    from factory.experiments.registry import get_sweep

    started = time.perf_counter()
    with queue_for(args.url) as queue:  # without --url its process starts now, beside the planning
        runs = sweep_runs(_lake(args), get_sweep(args.name))
        submitted = submit(runs, queue, skip_existing=not args.force)
    return _report(out, runs, submitted, started)


def cmd_sweep_run(args, out: Console) -> int:
    from configs.evals import suite
    from factory.cli import profile
    from factory.experiments.local import run_sweep
    from factory.experiments.registry import get_sweep

    started = time.perf_counter()
    sweep = get_sweep(args.name)
    run_sweep(_lake(args), sweep, suites=suite, profile=profile(args), evaluate=not args.no_eval, log=out.print)
    out.print(f"sweep {sweep.name}: done in {time.perf_counter() - started:.0f} s; "
              f"`factory sweep results {sweep.name}` ranks the cells")
    return 0


def cmd_sweep_results(args, out: Console) -> int:
    """Read only unless --write: the cells as the lake stands now, ranked where scored."""
    from factory.experiments.registry import get_sweep
    from factory.experiments.results import counts_line, display_rows, plot, preview, write_sweep_results
    from factory.home import artifacts_dir

    lake = _lake(args)
    sweep = get_sweep(args.name)
    report = write_sweep_results(lake, sweep, asset_key="cli") if args.write else preview(lake, sweep)
    table = RichTable("rank", "run", "params", f"{sweep.metric} ({sweep.better} is better)", "train loss", "status",
                      title=f"sweep {sweep.name}")
    for row in display_rows(report.ranking):
        table.add_row(*row)
    out.print(table)
    out.print(f"{len(report.ranking)} cells: {counts_line(report.counts)}", markup=False)
    if args.write:
        path = plot(report, sweep, artifacts_dir(lake.home) / "sweeps" / sweep.name / "summary.png")
        out.print(f"wrote sweeps.results snapshot {report.snapshot_id} and the plot {path}", markup=False)
    else:
        out.print(f"read only: `factory sweep results {sweep.name} --write` (or the sweeps/results asset) "
                  "commits sweeps.results and draws the plot", markup=False)
    return 0


def cmd_automix(args, out: Console) -> int:
    from factory.experiments.automix import propose_from_sweep
    from factory.experiments.registry import get_sweep

    proposal, version = propose_from_sweep(_lake(args), get_sweep(args.sweep), name=args.name, log=out.print)
    out.print(proposal.summary(), markup=False)
    out.print(f"\nregistered {version.version_id}: train on it with an experiment whose mix is {args.name!r}")
    return 0
