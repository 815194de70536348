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

import sys

from factory.posttrain import cli
from factory.train.report import open_reporter

PROG = "python -m factory.posttrain.rl"


def main(argv: list[str] | None = None) -> int:
    args = cli.parser(PROG, __doc__, "RLConfig").parse_args(argv)

    from factory.experiments.registry import get_rl_experiment
    from factory.posttrain.rl import RLConfig, RLConfigError, check_rl_config

    loaded = cli.load(args, PROG, RLConfig, get_rl_experiment, check_rl_config, (RLConfigError,))
    if loaded is None:
        return 2
    config, _, lake, faults = loaded

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
