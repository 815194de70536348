"""`python -m factory.posttrain.sft`: one supervised fine-tuning run, with or without Dagster.

    python -m factory.posttrain.sft --experiment sft_porting      # a function in configs/experiments
    python -m factory.posttrain.sft --config-json '{"name": ...}' # a validated SFTConfig

The `sft_run` asset launches exactly this through Dagster Pipes with the config as JSON and the
deployment profile handed down. Run again after a crash, a kill or a preemption, it resumes from the
run's newest checkpoint (the trainer's resume: weights, optimizer, RNG and the packed loader's place).

Exit codes: 0 trained to the end; 2 a bad config or lake (nothing started); 75 stopped by SIGTERM after
checkpointing (run it again to continue); anything else is a crash.
"""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from factory import settings
from factory.deploy import load_profile, open_lake
from factory.experiments.spec import ExperimentError
from factory.lake import LakeError
from factory.overrides import validation_message
from factory.train.report import open_reporter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m factory.posttrain.sft", description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--experiment", help="a function in configs/experiments returning an SFTConfig")
    which.add_argument("--config-json", help="a validated SFTConfig as JSON")
    parser.add_argument("--run-id", default="", help="Dagster run id, for lineage")
    parser.add_argument("--home", help="FACTORY_HOME")
    parser.add_argument("--deploy", help="deployment profile (default: the one handed down, else embedded)")
    parser.add_argument("--reporter", help="module:function, a context manager yielding a Reporter")
    args = parser.parse_args(argv)

    from factory.posttrain.sft import SFTConfig, SFTConfigError, check_sft_config

    try:
        if args.config_json:
            config = SFTConfig.model_validate_json(args.config_json)
        else:
            from factory.experiments.registry import get_sft_experiment

            config = get_sft_experiment(args.experiment)
        faults = settings.faults()
        profile = load_profile(args.deploy)
        lake = open_lake(profile, home=args.home)
        check_sft_config(config, lake)
    except ValidationError as e:
        print(f"factory.posttrain.sft: error: {validation_message(e)}", file=sys.stderr)
        return 2
    except (SFTConfigError, ExperimentError, LakeError, KeyError, ValueError) as e:
        print(f"factory.posttrain.sft: error: {e}", file=sys.stderr)
        return 2

    from factory.posttrain.sft.run import run_sft
    from factory.train.preempt import PREEMPTED_EXIT, Preempted

    with open_reporter(0, args.reporter) as reporter:
        try:
            result = run_sft(config, lake, run_id=args.run_id, reporter=reporter, faults=faults,
                             preemption_grace_s=profile.training.preemption_grace_s)
        except Preempted:
            return PREEMPTED_EXIT
        reporter.log(f"{result.run}: {result.steps} steps, held-out loss {result.heldout_loss_before:.4f} -> "
                     f"{result.heldout_loss_after:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
