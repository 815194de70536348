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

import sys

from factory.posttrain import cli
from factory.train.report import open_reporter

PROG = "python -m factory.posttrain.sft"


def main(argv: list[str] | None = None) -> int:
    args = cli.parser(PROG, __doc__, "SFTConfig").parse_args(argv)

    from factory.experiments.registry import get_sft_experiment
    from factory.posttrain.sft import SFTConfig, SFTConfigError, check_sft_config

    loaded = cli.load(args, PROG, SFTConfig, get_sft_experiment, check_sft_config, (SFTConfigError,))
    if loaded is None:
        return 2
    config, profile, lake, faults = loaded

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
