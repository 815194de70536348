"""`python -m factory.posttrain.rl`: one RL run, with or without Dagster.

    python -m factory.posttrain.rl --experiment rl_toy            # a function in configs/experiments
    python -m factory.posttrain.rl --config-json '{"name": ...}'  # a validated RLConfig

The `rl_run` asset launches exactly this through Dagster Pipes with the config as JSON and the
deployment profile in FACTORY_DEPLOY_JSON, so the run writes to the lake the asset planned against.
Fault injections for tests (FACTORY_FAULTS: `kill_at_step`, `corrupt_sync`) are read here and handed
down. Run again after a crash or a kill, it resumes from the run's newest checkpoint.

Exit codes: 0 trained to the end; 2 a bad config or lake (nothing started); 3 a weight sync that
did not verify (an incident row says which tensors); anything else is a crash.
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
    parser = argparse.ArgumentParser(prog="python -m factory.posttrain.rl", description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--experiment", help="a function in configs/experiments returning an RLConfig")
    which.add_argument("--config-json", help="a validated RLConfig as JSON")
    parser.add_argument("--run-id", default="", help="Dagster run id, for lineage")
    parser.add_argument("--home", help="FACTORY_HOME")
    parser.add_argument("--deploy", help="deployment profile (default: the one handed down, else embedded)")
    parser.add_argument("--reporter", help="module:function, a context manager yielding a Reporter")
    args = parser.parse_args(argv)

    from factory.posttrain.rl import RLConfig, RLConfigError, check_rl_config

    try:
        if args.config_json:
            config = RLConfig.model_validate_json(args.config_json)
        else:
            from factory.experiments.registry import get_rl_experiment

            config = get_rl_experiment(args.experiment)
        faults = settings.faults()
        lake = open_lake(load_profile(args.deploy), home=args.home)
        check_rl_config(config, lake)
    except ValidationError as e:
        print(f"factory.posttrain.rl: error: {validation_message(e)}", file=sys.stderr)
        return 2
    except (RLConfigError, ExperimentError, LakeError, KeyError, ValueError) as e:
        print(f"factory.posttrain.rl: error: {e}", file=sys.stderr)
        return 2

    from factory.posttrain.rl.loop import run_rl
    from factory.posttrain.rl.sync import SyncError

    with open_reporter(0, args.reporter) as reporter:
        try:
            result = run_rl(config, lake, run_id=args.run_id, reporter=reporter, faults=faults)
        except SyncError as e:
            reporter.warn(str(e))
            return 3
        last = f"{result.rewards[-1]:.3f}" if result.rewards else "n/a"
        reporter.log(f"{result.run}: {result.steps} steps, last reward {last}, sync {100 * result.sync_share:.1f}% "
                     "of the step")
        reporter.done({"run": result.run, "steps": result.steps, "rewards": result.rewards,
                       "checkpoints": result.checkpoints, "sync_share": result.sync_share,
                       "dropped_batches": result.dropped_batches, "resumed_from": result.resumed_from,
                       "seconds": result.seconds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
