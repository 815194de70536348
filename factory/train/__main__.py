"""`python -m factory.train`: the training entry point, with or without Dagster.

    python -m factory.train --experiment smoke                  # one process
    torchrun --standalone --nproc-per-node 2 -m factory.train --experiment smoke_ddp

The `training_run` asset launches exactly this through Dagster Pipes, passing the validated
experiment as JSON (`--experiment-json`), so the process trains what the asset planned, and the
Pipes reporter by name (`--reporter`), so this package never imports Dagster.
"""

from __future__ import annotations

import argparse
import os
import sys

from factory.experiments import ExperimentConfig, ExperimentError, plan_experiment
from factory.experiments.sweep import run_name
from factory.lake import Lake
from factory.train.distributed import shutdown
from factory.train.report import open_reporter
from factory.train.trainer import train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m factory.train", description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--experiment", help="a function name in configs/experiments")
    which.add_argument("--experiment-json", help="a validated ExperimentConfig as JSON")
    # not --run: torchrun's parser would take it for an abbreviation of its own --run-path
    parser.add_argument("--run-name", help="run name (default: <experiment>-<hash8>, as Dagster names it)")
    parser.add_argument("--run-id", default="", help="Dagster run id, for lineage")
    parser.add_argument("--home", help="FACTORY_HOME")
    parser.add_argument("--reporter", help="module:function, a context manager yielding a Reporter (default: terminal)")
    args = parser.parse_args(argv)

    try:
        if args.experiment_json:
            experiment = ExperimentConfig.model_validate_json(args.experiment_json)
        else:
            from configs.experiments import experiment as load

            experiment = load(args.experiment)
        lake = Lake.open(home=args.home)
        plan = plan_experiment(lake, experiment)
    except (ExperimentError, ValueError) as e:
        print(f"factory.train: error: {e}", file=sys.stderr)
        return 2

    with open_reporter(int(os.environ.get("RANK", "0")), args.reporter) as reporter:
        try:
            result = train(plan, lake, run=args.run_name or run_name(experiment), run_id=args.run_id, reporter=reporter)
        finally:
            shutdown()
        reporter.log(f"{result.run}: {result.steps} steps, final loss {result.final_loss}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
