"""`training_run`: one partition per experiment in configs/experiments; materializing it plans
the run here (a bad config fails before any process starts), then launches `python -m
factory.train` (under torchrun for several ranks) through Dagster Pipes. Logs and the final
summary (loss curve, checkpoints) stream back; a relaunch resumes from the latest valid
checkpoint, so a killed run loses at most `checkpoint.every` steps.
"""


from typing import Optional

from dagster import (
    AllPartitionMapping,
    AssetDep,
    Config,
    MaterializeResult,
    MetadataValue,
    PipesSubprocessClient,
    StaticPartitionsDefinition,
    asset,
)

from assets.evals import checkpoint_key, checkpoint_partitions
from configs.experiments import EXPERIMENTS, experiment
from factory.experiments import plan_experiment
from factory.experiments.card import render_card
from factory.home import CHECKOUT
from factory.train.checkpoint import checkpoints
from factory.train.launch import launch_command
from resources.lake import LakeResource
from resources.pipes_reporter import SPEC as PIPES_REPORTER
from resources.tracker import TrackerResource

experiment_partitions = StaticPartitionsDefinition(sorted(EXPERIMENTS))


class TrainingRunConfig(Config):
    steps: Optional[int] = None
    """Override the experiment's length in optimizer steps (e.g. a shorter CI run)."""
    checkpoint_every: Optional[int] = None
    """Override the steps between checkpoints."""
    eval_every: Optional[int] = None
    """Override the steps between evaluations (the eval sensor evaluates those checkpoints)."""
    eval_suite: Optional[str] = None
    """Override the eval suite (configs/evals.py) run on them."""

    def apply(self, exp):
        changes = {}
        if self.steps is not None:
            changes |= {"steps": self.steps, "tokens": None}
        if self.checkpoint_every is not None:
            changes["checkpoint"] = exp.checkpoint.model_copy(update={"every": self.checkpoint_every})
        changes |= {k: v for k, v in (("eval_every", self.eval_every), ("eval_suite", self.eval_suite)) if v is not None}
        return exp.derive(**changes) if changes else exp


@asset(
    key="training_run",
    partitions_def=experiment_partitions,
    deps=[AssetDep("mix", partition_mapping=AllPartitionMapping())],
    group_name="train",
    kinds={"pytorch"},
    op_tags={"factory/kind": "training"},
    description="A training run of one experiment (configs/experiments): streams its mix, checkpoints to "
                "train.checkpoints, metrics to MLflow and train.metrics. Resumes from its latest valid checkpoint.",
)
def training_run(context, config: TrainingRunConfig, lake: LakeResource, tracker: TrackerResource,
                 pipes_subprocess_client: PipesSubprocessClient) -> MaterializeResult:
    plan = plan_experiment(lake.lake(), config.apply(experiment(context.partition_key)))
    card = render_card(plan)
    context.log.info(f"planned {plan.experiment.name}: {plan.steps} steps, {plan.parameters:,} parameters, "
                     f"{plan.mix_version}")
    home = str(lake.lake().home)
    completed = pipes_subprocess_client.run(
        context=context, command=launch_command(plan, home=home, run_id=context.run_id, reporter=PIPES_REPORTER),
        env={**tracker.env(), "FACTORY_HOME": home}, cwd=str(CHECKOUT),
    )
    result = completed.get_materialize_result()
    # every checkpoint becomes a partition of checkpoint_export / eval_scores (the sensor adds the
    # ones it evaluates as they land; this makes the others launchable from the UI)
    keys = [checkpoint_key(r["checkpoint_id"]) for r in checkpoints(lake.lake(), plan.experiment.name)]
    context.instance.add_dynamic_partitions(checkpoint_partitions.name, keys)
    return MaterializeResult(metadata={**(result.metadata or {}), "card": MetadataValue.md(card),
                                       "config_hash": plan.config_hash})
