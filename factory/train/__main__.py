"""`python -m factory.train`: the training entry point, with or without Dagster.

    python -m factory.train --experiment smoke                  # one process
    python -m factory.train --experiment smoke --steps 4 --checkpoint-every 2
    torchrun --standalone --nproc-per-node 2 -m factory.train --experiment smoke_ddp

The overrides (`--steps`, `--checkpoint-every`, `--eval-every`, `--eval-suite`) are the ones the
`training_run` asset's run config takes, with the same meaning (`ExperimentConfig.
with_run_overrides`), validated before anything starts: a bad value exits 2 naming the flag. An
overridden experiment is another run (`<experiment>-<hash8>` of what is trained), so a 4-step
try never resumes, or clobbers, the full run's checkpoints.

The `training_run` asset launches exactly this through Dagster Pipes, passing the validated
experiment as JSON (`--experiment-json`), so the process trains what the asset planned, the
deployment profile as JSON (`FACTORY_DEPLOY_JSON`), so checkpoints, metrics and lineage land in the
lake the asset planned against, and the Pipes reporter by name (`--reporter`), so this package
never imports Dagster. Run by hand, it takes `--deploy` or `FACTORY_DEPLOY` like the CLI.
Fault injections for tests (`FACTORY_FAULTS`, see `factory.faults`) are read here and handed to
the trainer, and so is the profile's `training.preemption_grace_s`; `train()` itself never looks
for them.

Exit codes: 0 trained to the end; 2 a bad experiment, override or lake; 75 (`PREEMPTED_EXIT`,
EX_TEMPFAIL) stopped by SIGTERM after checkpointing the step in progress, so run it again to
continue (`factory.train.preempt`); anything else is a crash.
"""

from __future__ import annotations

import argparse
import sys

from factory import settings
from factory.deploy import load_profile, open_lake
from factory.experiments import ExperimentConfig, ExperimentError, plan_experiment
from factory.experiments.spec import OverrideError
from factory.experiments.sweep import run_name
from factory.lake import LakeError
from factory.train.distributed import shutdown
from factory.train.preempt import PREEMPTED_EXIT, Preempted, sigint_as_sigterm
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
    parser.add_argument("--deploy", help="deployment profile (default: the one handed down, else $FACTORY_DEPLOY, else embedded)")
    parser.add_argument("--reporter", help="module:function, a context manager yielding a Reporter (default: terminal)")
    parser.add_argument("--sigint-is-preemption", action="store_true",
                        help="checkpoint and exit 75 on SIGINT as on SIGTERM (Dagster Pipes forwards a run's "
                             "termination as SIGINT)")
    overrides = parser.add_argument_group("overrides", "validated like the experiment; the same as the training_run "
                                                       "asset's run config")
    overrides.add_argument("--steps", type=int, help="train this many optimizer steps (replaces a tokens length)")
    overrides.add_argument("--checkpoint-every", type=int, help="steps between checkpoints (the last step always saves)")
    overrides.add_argument("--eval-every", type=int, help="steps between evaluated checkpoints")
    overrides.add_argument("--eval-suite", help="eval suite of configs/evals.py run on them")
    args = parser.parse_args(argv)

    try:
        if args.experiment_json:
            experiment = ExperimentConfig.model_validate_json(args.experiment_json)
        else:
            from configs.experiments import experiment as load

            experiment = load(args.experiment)
        experiment = experiment.with_run_overrides(steps=args.steps, checkpoint_every=args.checkpoint_every,
                                                   eval_every=args.eval_every, eval_suite=args.eval_suite)
        faults = settings.faults()
        profile = load_profile(args.deploy)
        lake = open_lake(profile, home=args.home)
        plan = plan_experiment(lake, experiment)
    except OverrideError as e:  # before the lake opens; exits 2 with the usage line, naming the flag
        parser.error((f"argument --{e.override.replace('_', '-')}: " if e.override else "") + str(e))
    except (ExperimentError, LakeError, ValueError) as e:
        print(f"factory.train: error: {e}", file=sys.stderr)
        return 2

    if args.sigint_is_preemption:
        sigint_as_sigterm()
    with open_reporter(settings.distributed()[0], args.reporter) as reporter:
        try:
            result = train(plan, lake, run=args.run_name or run_name(experiment), run_id=args.run_id, reporter=reporter,
                           faults=faults, preemption_grace_s=profile.training.preemption_grace_s)
        except Preempted:  # checkpointed and recorded; the trainer's warning says where
            return PREEMPTED_EXIT
        finally:
            shutdown()
        loss = "n/a" if result.final_loss is None else f"{result.final_loss:.4f}"
        reporter.log(f"{result.run}: {result.steps} steps, final loss {loss}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
