"""A sweep without Dagster: train every cell, then export, check and evaluate its final checkpoint.

`factory sweep run NAME` is the laptop path of what a launched sweep does through the queue
(training runs, then the eval sensor's export -> equivalence check -> suite): the same trainer
entry point (`python -m factory.train`, one process per cell, so each cell starts from a clean
interpreter and seed) and the same `evaluate` call, one cell after another. vLLM is imported once
for all cells. Re-running is cheap: a finished cell resumes at its last step and exits, and a
cell whose final checkpoint is already evaluated with its suite is not evaluated again.

The eval suites come from the caller (`suites`: name -> SuiteConfig, the CLI passes
`configs.evals.suite`): core code never imports the `configs` package, so the same sweep runs with
any suite registry (a test's, a project's own).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from factory import settings
from factory.deploy import DeployConfig, load_profile, profile_env
from factory.experiments.spec import ExperimentError, plan_experiment
from factory.experiments.sweep import SweepConfig, check_token_budget, expand
from factory.home import CHECKOUT

if TYPE_CHECKING:  # the evals package imports torch; a sweep that only trains never loads it
    from factory.evals.suite import SuiteConfig
    from factory.infer import EngineConfig


def run_sweep(lake, sweep: SweepConfig, *, suites: Callable[[str], SuiteConfig] | None = None,
              profile: DeployConfig | None = None, evaluate: bool = True, engine: EngineConfig | None = None,
              log: Callable[[str], None] = print) -> list[str]:
    """Train (and evaluate) every cell; the eval ids of the cells evaluated, in cell order. Each cell's
    trainer gets `profile` (default: the active one) explicitly, so it writes to the same lake;
    evaluating needs `suites` (a suite's name -> its SuiteConfig), checked before any cell trains.
    `engine` scores the exports (default `EngineConfig()`, vLLM; `transformers` does not start vLLM
    for every cell, which suits proxies that train in seconds)."""
    if sweep.is_rl:  # RL cells need the vLLM actor and the task engine per run: the rl_run asset's job
        raise ExperimentError(f"sweep {sweep.name}: its cells are RL runs, which `factory sweep run` does not train; "
                              f"queue them with `factory sweep launch {sweep.name}` (rl_job)")
    if evaluate and suites is None:
        raise ExperimentError(f"sweep {sweep.name}: evaluating the cells needs `suites` (name -> SuiteConfig, "
                              "e.g. configs.evals.suite), or evaluate=False")
    profile = profile or load_profile()
    from factory.train.checkpoint import checkpoints
    from factory.train.launch import launch_command

    cells = expand(sweep)
    plans = [plan_experiment(lake, c.experiment) for c in cells]
    check_token_budget(sweep, [p.tokens for p in plans])
    suite_of = {p.experiment.eval_suite: suites(p.experiment.eval_suite) for p in plans} if evaluate else {}
    evals = []
    for cell, plan in zip(cells, plans):
        started = time.perf_counter()
        log(f"[{cell.index + 1}/{len(cells)}] {cell.run}: {cell.params}")
        command = launch_command(plan, home=str(lake.home), run=cell.run, training=profile.training)
        env = {**settings.environment(), **profile_env(profile), "FACTORY_HOME": str(lake.home)}
        done = subprocess.run(command, cwd=CHECKOUT, env=env, capture_output=True, text=True)
        if done.returncode:
            raise ExperimentError(f"sweep {sweep.name}: cell {cell.index} ({cell.run}) failed to train "
                                  f"(exit {done.returncode}): {done.stderr[-1500:]}")
        last = checkpoints(lake, cell.run)[-1]
        log(f"    trained {last['step']} steps in {time.perf_counter() - started:.1f} s, loss {last['loss']:.4f}")
        if evaluate:
            evals.append(_evaluate(lake, last["checkpoint_id"], suite_of[plan.experiment.eval_suite], engine, log))
    return evals


def _evaluate(lake, checkpoint_id: str, suite: SuiteConfig, engine, log) -> str:
    from factory.evals.results import eval_id_of, results
    from factory.evals.suite import evaluate_checkpoint
    from factory.infer import find_checkpoint

    eval_id = eval_id_of(checkpoint_id, suite.name)
    checkpoint = find_checkpoint(lake, checkpoint_id)
    if any(r["eval_id"] == eval_id for r in results(lake, checkpoint.ref.run, suite.name)):
        log(f"    {eval_id}: already evaluated")
        return eval_id
    started = time.perf_counter()
    result = evaluate_checkpoint(lake, checkpoint, suite, engine, asset_key="sweep", log=lambda m: None)
    main = ", ".join(f"{r['task']}/{r['metric']} {r['value']:.4f}" for r in result.rows if r["metric"] == "all")
    log(f"    {eval_id}: {main} ({time.perf_counter() - started:.1f} s)")
    return result.eval_id
