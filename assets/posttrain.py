"""Post-training assets: `sft_run` (supervised fine-tuning) and `rl_run` (reinforcement learning).

`sft_run`: one dynamic partition per SFT run (an `-> SFTConfig` function's name in configs/experiments,
or a config queued as JSON). The body checks the config against the lake (start checkpoint, the
dataset's source table), then launches `python -m factory.posttrain.sft` through Dagster Pipes: the
pre-training trainer on packed chat examples, so checkpoints (train.checkpoints, evaluated by the eval
sensor every `eval_every`-th), metrics (MLflow, train.metrics), the card and resume after a kill are
exactly `training_run`'s. The summary adds the held-out loss of the task format before and after.

`rl_run`: one dynamic partition per RL run (its config's `name`, an `-> RLConfig` function in
configs/experiments or an RL sweep's cell `<sweep>-<hash8>`, or a config queued as JSON). Materializing it checks the config against the lake
here (the start checkpoint, a task table: a bad one fails before any process starts), then launches
`python -m factory.posttrain.rl` through Dagster Pipes. Logs stream back; the summary carries the
reward curve (a plot), pass rates and the checkpoints, which land in train.checkpoints like any run's,
so the eval sensor evaluates every `eval_every`-th one. A relaunch resumes from the newest checkpoint
with the rollout table made consistent (factory.posttrain.rl.loop).
"""

import sys
from typing import Optional

from dagster import Config, DynamicPartitionsDefinition, Failure, MaterializeResult, PipesSubprocessClient, asset

from assets._metadata import display
from assets.evals import checkpoint_key, checkpoint_partitions
from factory.deploy import profile_env
from factory.deploy.kube.placement import op_tags
from factory.experiments.queue import resolve_rl_run
from factory.experiments.registry import get_sft_experiment
from factory.home import CHECKOUT
from factory.posttrain.rl import RLConfig, check_rl_config
from factory.posttrain.rl.report import rl_summary
from factory.posttrain.sft import SFTConfig, check_sft_config
from factory.train.checkpoint import checkpoints
from resources.lake import LakeResource
from resources.pipes_reporter import SPEC as PIPES_REPORTER
from resources.tracker import TrackerResource

sft_runs = DynamicPartitionsDefinition(name="sft_runs")


class SFTRunConfig(Config):
    config_json: Optional[str] = None
    """The run, as queued (`SFTConfig` JSON); its name must be the partition. Empty = the experiment file's."""
    steps: Optional[int] = None
    """Override the number of optimizer steps (e.g. a shorter CI run)."""

    def sft_config(self, run: str) -> SFTConfig:
        config = SFTConfig.model_validate_json(self.config_json) if self.config_json else get_sft_experiment(run)
        if config.name != run:
            raise ValueError(f"the SFT config is run {config.name!r}, but the partition is {run!r}")
        return SFTConfig.model_validate({**config.model_dump(), "steps": self.steps}) if self.steps else config


@asset(
    key="sft_run",
    partitions_def=sft_runs,
    group_name="posttrain",
    kinds={"pytorch"},
    op_tags=op_tags("train"),
    description="A supervised fine-tuning run in the chat format (chat tokens added to a pre-trained checkpoint, "
                "prompt-masked packed loss) on sft.examples built from a synthetic table; checkpoints to "
                "train.checkpoints like any run's. Resumes from its newest one.",
)
def sft_run(context, config: SFTRunConfig, lake: LakeResource, tracker: TrackerResource,
            pipes_subprocess_client: PipesSubprocessClient) -> MaterializeResult:
    run = context.partition_key
    sft = config.sft_config(run)
    start = check_sft_config(sft, lake.lake())
    context.log.info(f"{run}: fine-tuning {start.checkpoint_id} on dataset {sft.data} for {sft.steps} steps")
    home, profile = str(lake.lake().home), lake.profile()
    command = [sys.executable, "-m", "factory.posttrain.sft", "--config-json", sft.model_dump_json(),
               "--run-id", context.run_id, "--home", home, "--reporter", PIPES_REPORTER]
    completed = pipes_subprocess_client.run(context=context, command=command, cwd=str(CHECKOUT),
                                            env={**tracker.env(), **profile_env(profile), "FACTORY_HOME": home})
    rows = checkpoints(lake.lake(), run)
    keys = [checkpoint_key(r["checkpoint_id"]) for r in rows if r is rows[-1] or r["step"] % r["eval_every"] == 0]
    context.instance.add_dynamic_partitions(checkpoint_partitions.name, keys)
    reported = dict(completed.get_materialize_result().metadata or {})
    if "heldout_loss_after" not in reported:
        raise Failure(description=f"{run}: the SFT process reported no summary")
    return MaterializeResult(metadata=display(reported, first=("loss_curve", "heldout_loss_before",
                                                               "heldout_loss_after")))

rl_runs = DynamicPartitionsDefinition(name="rl_runs")


class RLRunConfig(Config):
    config_json: Optional[str] = None
    """The run, as queued (`RLConfig` JSON); its name must be the partition. Empty = the experiment file's (or the RL
    sweep cell's) of that name."""
    steps: Optional[int] = None
    """Override the number of policy updates (e.g. a shorter CI run)."""

    def rl_config(self, run: str) -> RLConfig:
        config = RLConfig.model_validate_json(self.config_json) if self.config_json else resolve_rl_run(run)
        if config.name != run:
            raise ValueError(f"the RL config is run {config.name!r}, but the partition is {run!r}")
        return RLConfig.model_validate({**config.model_dump(), "steps": self.steps}) if self.steps else config


@asset(
    key="rl_run",
    partitions_def=rl_runs,
    group_name="posttrain",
    kinds={"pytorch", "vllm"},
    op_tags=op_tags("train"),
    description="A reinforcement-learning run (GRPO on vLLM rollouts, rewards from sandboxed execution through the "
                "task engine): rollouts to rl.rollouts, checkpoints to train.checkpoints. Resumes from its newest one.",
)
def rl_run(context, config: RLRunConfig, lake: LakeResource,
           pipes_subprocess_client: PipesSubprocessClient) -> MaterializeResult:
    run = context.partition_key
    rl = config.rl_config(run)
    check_rl_config(rl, lake.lake())
    home, profile = str(lake.lake().home), lake.profile()
    command = [sys.executable, "-m", "factory.posttrain.rl", "--config-json",
               rl.model_dump_json(), "--run-id", context.run_id, "--home", home, "--reporter", PIPES_REPORTER]
    completed = pipes_subprocess_client.run(context=context, command=command,
                                            env={**profile_env(profile), "FACTORY_HOME": home}, cwd=str(CHECKOUT))
    rows = checkpoints(lake.lake(), run)
    keys = [checkpoint_key(r["checkpoint_id"]) for r in rows if r is rows[-1] or r["step"] % r["eval_every"] == 0]
    context.instance.add_dynamic_partitions(checkpoint_partitions.name, keys)
    reported = {k: getattr(v, "value", v) for k, v in (completed.get_materialize_result().metadata or {}).items()}
    if "rewards" not in reported:
        raise Failure(description=f"{run}: the RL process reported no summary")
    return MaterializeResult(metadata=display(rl_summary(lake.lake(), rl, reported), first=("reward_curve",)))
