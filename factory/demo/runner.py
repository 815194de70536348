"""`python -m factory.demo`: the main job end to end, as `make demo` runs it, reported phase by phase.

The phases are the commands a user could type one by one (the same ones `make demo` ran before):
check the deployment profile, register the smoke experiment's run, `dagster job execute demo_job`
(ingest, refine, tokenizer), then `dagster asset materialize` of the mix, the training run, the
newest checkpoint's export and scores, the synthetic tables and the mix that adds them, then the
`demo` repository set built into environments and its tasks derived (against the local package
mirror `make setup` fills, `REGISTRY`: the demo touches no network). Every
Dagster command gets `configs/demo_run.yaml` (console logs at INFO, so Dagster's DEBUG events do
not bury the progress). Each phase prints a header, the factory's own progress lines and its time;
everything else lands in `FACTORY_HOME/logs/demo-<time>.log` (see `steps.py`). A failing phase
stops the demo with exit 1, its last lines and the log's path. The closing summary reads the lake
(`summary.py`).

Dagster runs as a child process through its CLI (the factory package never imports dagster), in
the checkout, so `-m definitions` loads the project's definitions. The `dagster` commands of all
phases run in one such process, one after another (`jobs/cli_session.py`, `steps.Session`): each
is still its own Dagster run, made exactly as the typed command makes it, but the code location
(Dagster, every asset module, torch, Spark's Python side) is imported once instead of per phase,
and the eval's vLLM engine serves the synthetic phase's model stage.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO

from factory import settings
from factory.demo.steps import INDENT, Session, Step, StepFailed, StepResult, duration, run_step
from factory.home import CHECKOUT, dagster_home, factory_home

RUN_CONFIG = CHECKOUT / "configs" / "demo_run.yaml"
ENVS_CONFIG = CHECKOUT / "configs" / "demo_envs.yaml"  # a few tasks per demo repository
REGISTRY = CHECKOUT / ".cache" / "registry"  # `factory envs mirror --repos demo` (make setup) fills it


def _tool(name: str, module: str) -> list[str]:
    """The console script `name` beside this interpreter (the venv's), else `python -m module`."""
    script = Path(sys.executable).parent / name
    return [str(script)] if script.exists() else [sys.executable, "-m", module]


class Demo:
    """The demo's phases so far: runs each command (`phase`), keeps the times, reports a failure."""

    def __init__(self, home: Path, *, log_path: Path, out: IO[str] = sys.stdout, env: dict[str, str] | None = None):
        self.home, self.log_path, self.out = home, log_path, out
        self.env = dict(settings.environment() if env is None else env)
        self.env |= {settings.HOME: str(home), "PYTHONUNBUFFERED": "1"}
        self.env.setdefault("DAGSTER_HOME", str(dagster_home(home)))
        self.env.setdefault(settings.REGISTRY, (REGISTRY / "simple").as_uri())  # for the repository phase
        self.factory, self.dagster = _tool("factory", "factory.cli"), _tool("dagster", "dagster")
        # the `dagster` commands run in one process, which imports the code location once
        self.session = Session([sys.executable, str(CHECKOUT / "jobs" / "cli_session.py")], prefix=self.dagster)
        self.phases: list[tuple[str, float]] = []
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log_path, "a", encoding="utf-8")

    def close(self) -> None:
        try:
            self.session.close(self.log)
        finally:
            self.log.close()

    def say(self, line: str = "") -> None:
        self.out.write(line + "\n")
        self.out.flush()

    def phase(self, name: str, argv: list[str], outcome: Callable[[StepResult], str] | None = None) -> StepResult:
        """Run one phase: its header, its progress lines, then its time (and `outcome` of its output)."""
        self.say(f"== {name}")
        result = run_step(Step(name, argv), cwd=CHECKOUT, env=self.env, log=self.log, out=self.out,
                          session=self.session)
        self.phases.append((name, result.seconds))
        said = outcome(result) if outcome else ""
        self.say(f"{INDENT}done in {duration(result.seconds)}" + (f": {said}" if said else ""))
        return result

    def materialize(self, name: str, select: str, partition: str | None = None, *, config: Path | None = None) -> StepResult:
        argv = [*self.dagster, "asset", "materialize", "-m", "definitions", "--select", select,
                "-c", str(RUN_CONFIG), *(["-c", str(config)] if config else [])]
        return self.phase(name, argv + (["--partition", partition] if partition else []))

    def report_failure(self, failed: StepFailed) -> None:
        self.say(f"\ndemo stopped: {failed.step.name} failed (exit {failed.code} after {duration(failed.seconds)}): "
                 f"{' '.join(failed.step.argv)}")
        self.say("its last lines:")
        for line in failed.tail:
            self.say(f"{INDENT}| {line}")
        self.say(f"everything it printed: {self.log_path}")


def run_pipeline(demo: Demo, experiment: str) -> str:
    """Every phase of the demo in order; returns the experiment's run (e.g. `smoke-6adb0d12`)."""
    demo.phase("deploy check", [*demo.factory, "deploy", "check"])
    # the run is <experiment>-<hash8>: its training_run partition must exist before it materializes
    registered = demo.phase(f"register {experiment}", [*demo.factory, "experiment", "register", experiment],
                            lambda result: f"run {_run_name(result, experiment)}")
    run = _run_name(registered, experiment)
    demo.phase("ingest + refine + tokenizer", [*demo.dagster, "job", "execute", "-m", "definitions", "-j",
                                               "demo_job", "-c", str(RUN_CONFIG)])
    demo.materialize("mix default", "mix", "default")
    trained = demo.materialize(f"train {run}", "training_run", run)
    checkpoint = _newest_checkpoint(demo, run)
    if checkpoint is None:
        raise StepFailed(trained.step, 1, trained.seconds, ["the run left no checkpoint in train.checkpoints"])
    demo.materialize(f"export + eval {checkpoint}", "checkpoint_export,eval_scores", checkpoint)
    demo.materialize("synthetic data (porting, rephrase)", "synthetic/porting,synthetic/rephrase")
    demo.materialize("mix default_synthetic", "mix", "default_synthetic")
    demo.materialize("repository environments + tasks (demo set)",
                     "envs/builds,tasks/function_completion,tasks/bug_fixing", "demo", config=ENVS_CONFIG)
    return run


def _run_name(registered: StepResult, experiment: str) -> str:
    """The run `factory experiment register` printed (its last line that names the experiment's run)."""
    run = next((line.strip() for line in reversed(registered.lines) if line.startswith(f"{experiment}-")), None)
    if run is None:
        raise StepFailed(registered.step, 1, registered.seconds, ["printed no run name", *registered.lines[-10:]])
    return run


def _lake(demo: Demo):
    from factory.deploy import open_lake

    return open_lake(home=demo.home)


def _newest_checkpoint(demo: Demo, run: str) -> str | None:
    """`<run>@<step>` of the run's newest checkpoint (the one the demo exports and scores)."""
    from factory.train.checkpoint import checkpoints

    rows = checkpoints(_lake(demo), run)
    return f"{run}@{rows[-1]['step']}" if rows else None


def summarize(demo: Demo, run: str | None, experiment: str, setup_seconds: float | None) -> None:
    from configs.refine import pipelines
    from factory.demo.summary import collect, render

    summary = collect(_lake(demo), run, list(pipelines().values()))
    factory = os.path.relpath(demo.factory[0]) if len(demo.factory) == 1 else "factory"
    for line in render(summary, phases=demo.phases, setup_seconds=setup_seconds, log=str(demo.log_path),
                       factory=factory, experiment=experiment):
        demo.say(line)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m factory.demo", description="The main job end to end, as "
                                     "`make demo` runs it after setup, reported phase by phase.")
    parser.add_argument("--home", help="state directory (default: $FACTORY_HOME, else ./.factory)")
    parser.add_argument("--experiment", default="smoke", help="the experiment to train and score (default smoke)")
    parser.add_argument("--setup-seconds", type=float, help="how long `make setup` took, for the summary")
    return parser


def run_demo(home: str | Path | None = None, experiment: str = "smoke", setup_seconds: float | None = None,
             out: IO[str] = sys.stdout) -> int:
    """Every phase, then the summary; 0, or 1 after the failing phase's report."""
    home = factory_home(home)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    demo = Demo(home, log_path=home / "logs" / f"demo-{stamp}.log", out=out)
    try:
        if setup_seconds is not None:
            demo.say(f"setup (install, instance): {duration(setup_seconds)}")
        demo.say(f"FACTORY_HOME {home}; third-party output (Spark, vLLM, Dagster events) goes to {demo.log_path}")
        try:
            run = run_pipeline(demo, experiment)
        except StepFailed as failed:
            demo.report_failure(failed)
            return 1
        summarize(demo, run, experiment, setup_seconds)
        return 0
    finally:
        demo.close()


def cmd_demo(args: argparse.Namespace, out) -> int:
    """`factory demo` (the CLI's dispatch), should the CLI offer it: the same as `python -m factory.demo`."""
    return run_demo(args.home, args.experiment)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_demo(args.home, args.experiment, args.setup_seconds)
