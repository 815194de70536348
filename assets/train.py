"""`training_run`: one dynamic partition per run (`<experiment>-<hash8>`, added by the experiment
sensor, the sweep schedules and `factory experiment submit` / `factory sweep launch`).
Materializing it plans the run here (a bad config fails before any process starts), then
launches `python -m factory.train` (under torchrun for several ranks) through Dagster Pipes.
Logs and the final summary (loss curve, checkpoints) stream back; a relaunch resumes from the
latest valid checkpoint, so a killed run loses at most `checkpoint.every` steps, and a preempted
one (SIGTERM) at most the step in progress: the trainer checkpoints it and exits, this asset fails
saying so, and the run's retry (`dagster/max_retries` on train_job) resumes from it. Only evaluated
checkpoints and the last one become `checkpoints` partitions (one per checkpoint would pass
Dagster's dynamic-partition limits after a few hundred runs).

Queued runs carry their experiment as JSON in the run config, so a run trains exactly what was
queued; a partition launched by hand from the UI is looked up among the experiment files and
sweep cells by its run name.
"""


import re
from typing import Optional

from dagster import (
    AllPartitionMapping,
    AssetDep,
    Config,
    DynamicPartitionsDefinition,
    Failure,
    MaterializeResult,
    PipesSubprocessClient,
    asset,
)

from assets._metadata import display, table
from assets.evals import checkpoint_key, checkpoint_partitions
from factory.deploy import profile_env
from factory.deploy.kube.placement import SWEEP_TAG_KEY, op_tags
from factory.experiments import ExperimentConfig, ExperimentError, plan_experiment
from factory.experiments.card import card_rows, launch_line, render_card
from factory.experiments.queue import resolve_run
from factory.experiments.sweep import run_name
from factory.home import CHECKOUT
from factory.train.checkpoint import checkpoints
from factory.train.launch import launch_command
from factory.train.preempt import preemption_of
from resources.lake import LakeResource
from resources.pipes_reporter import SPEC as PIPES_REPORTER
from resources.tracker import TrackerResource

training_runs = DynamicPartitionsDefinition(name="training_runs")


class TrainingRunConfig(Config):
    experiment_json: Optional[str] = None
    """The experiment, as queued (`ExperimentConfig` JSON); its run name must be the partition."""
    source: Optional[str] = None
    """Where it was queued from (`configs/experiments/smoke.py:smoke`, a sweep's cell); shown, not used."""
    steps: Optional[int] = None
    """Override the experiment's length in optimizer steps (e.g. a shorter CI run)."""
    checkpoint_every: Optional[int] = None
    """Override the steps between checkpoints."""
    eval_every: Optional[int] = None
    """Override the steps between evaluations (the eval sensor evaluates those checkpoints)."""
    eval_suite: Optional[str] = None
    """Override the eval suite (configs/evals.py) run on them."""

    def experiment(self, run: str) -> ExperimentConfig:
        if self.experiment_json is None:
            return resolve_run(run)
        exp = ExperimentConfig.model_validate_json(self.experiment_json)
        if run_name(exp) != run:
            raise ExperimentError(f"run config's experiment is run {run_name(exp)!r}, but the partition is {run!r}")
        return exp

    def apply(self, exp: ExperimentConfig) -> ExperimentConfig:
        """`exp` with this run's overrides, validated (the same ones `python -m factory.train` takes)."""
        return exp.with_run_overrides(steps=self.steps, checkpoint_every=self.checkpoint_every,
                                      eval_every=self.eval_every, eval_suite=self.eval_suite)


@asset(
    key="training_run",
    partitions_def=training_runs,
    deps=[AssetDep("mix", partition_mapping=AllPartitionMapping())],
    group_name="train",
    kinds={"pytorch"},
    op_tags=op_tags("train"),
    description="A training run of one experiment (configs/experiments) or sweep cell (configs/sweeps): streams its "
                "mix, checkpoints to train.checkpoints, metrics to MLflow and train.metrics. Resumes from its latest "
                "valid checkpoint.",
)
def training_run(context, config: TrainingRunConfig, lake: LakeResource, tracker: TrackerResource,
                 pipes_subprocess_client: PipesSubprocessClient) -> MaterializeResult:
    run = context.partition_key
    plan = plan_experiment(lake.lake(), config.apply(config.experiment(run)))
    card = render_card(plan)
    context.log.info(f"planned {run}: {plan.steps} steps, {plan.parameters:,} parameters, {plan.mix_version}\n\n{card}")
    home, profile = str(lake.lake().home), lake.profile()
    # the trainer gets this run's profile explicitly: it writes to the lake this asset planned against
    try:
        if profile.training.launcher == "kubernetes":  # torchrun pods placed by the kind table
            from resources.k8s_training import run_training_pods  # dagster-k8s loads in seconds: only here

            completed, _ = run_training_pods(context, plan, profile, run=run, home=home, reporter=PIPES_REPORTER,
                                             env={**tracker.env(), "FACTORY_HOME": home},
                                             kind="sweep" if SWEEP_TAG_KEY in context.run.tags else "train")
        else:
            completed = pipes_subprocess_client.run(
                context=context, command=launch_command(plan, home=home, run_id=context.run_id, run=run,
                                                        reporter=PIPES_REPORTER, training=profile.training),
                env={**tracker.env(), **profile_env(profile), "FACTORY_HOME": home}, cwd=str(CHECKOUT),
            )
    except Exception as e:
        _on_failure(context, lake.lake(), run, e)
        raise
    result = completed.get_materialize_result()
    # the evaluated checkpoints (the sensor adds them as they land) and the run's last one become
    # partitions of checkpoint_export / eval_scores; the rest stay rows of train.checkpoints
    # (`factory eval <run>@<step>`): Dagster's dynamic partitions break at tens of thousands
    rows = checkpoints(lake.lake(), run)
    keys = [checkpoint_key(r["checkpoint_id"]) for r in rows
            if r is rows[-1] or (r["eval_every"] > 0 and r["step"] % r["eval_every"] == 0)]
    context.instance.add_dynamic_partitions(checkpoint_partitions.name, keys)
    deploy = (f"{profile.name}: {profile.catalog.kind} catalog {profile.catalog.uri or 'under FACTORY_HOME'}, "
              f"{profile.training.launcher} launcher")
    return MaterializeResult(metadata=_metadata(dict(result.metadata or {}), plan, deploy))


# read by the run-retry daemon from the run's tags when the run fails (dagster 1.13)
NO_RETRY = {"dagster/retry_on_asset_or_op_failure": "false"}
# PipesSubprocessClient's "process failed with code N": 1 and 2 are the trainer's own errors
RAISED = re.compile(r"failed with code (1|2)\b")


def _on_failure(context, lake, run: str, error: Exception) -> None:
    """A trainer that stopped on SIGTERM recorded where (exit 75 alone; torchrun's agent exits 1):
    fail saying so, and the run's retry (`dagster/max_retries`) resumes from that checkpoint. A
    trainer that raised (a numerics error, a bad mix: exit 1 or 2) would fail the same way again,
    so its run is tagged not to be retried; one killed by a signal (OOM killer, a lost node) is
    retried and resumes from its last checkpoint."""
    found = preemption_of(lake, run, context.run_id)
    if not found:
        if RAISED.search(str(error)):
            context.log.info("the trainer raised (not a preemption or a kill): this run is not retried")
            context.instance.add_run_tags(context.run_id, NO_RETRY)
        return
    raise Failure(description=f"preempted at step {found['step']}, checkpoint {found['checkpoint']} written "
                              f"{found['seconds_to_checkpoint']} s after SIGTERM (grace {found['grace_s']} s); "
                              "the retry resumes from it",
                  metadata={"preempted_at_step": found["step"], "checkpoint": found["checkpoint"]}) from error


# The run's page leads with what a person opens it for; what went wrong shows only when it did;
# identities (hashes, versions, the deploy profile) sit in one `details` entry instead of a row each.
LEADING = ("loss_curve", "card", "final_loss", "tokens", "seconds", "checkpoints")
ONLY_IF_SET = ("incidents", "skipped_steps", "resumed_from")


def _metadata(reported: dict, plan, deploy: str) -> dict:
    """The trainer's summary (through Pipes) and the plan, as the run's page shows them."""
    def value(key):  # Pipes hands MetadataValues; the checks below need the plain value
        return getattr(reported[key], "value", reported[key])

    e = plan.experiment
    shown = {k: reported[k] for k in LEADING if k in reported}
    shown |= {k: reported[k] for k in ONLY_IF_SET if k in reported and value(k)}
    rows = [("experiment", f"{e.name}: {e.description or '(no description)'}"), *card_rows(plan),
            ("run it", f"factory experiment submit {e.name}, or {launch_line(plan)} --experiment {e.name}")]
    # the table cells show plain text: the card's Markdown code ticks would print as ticks
    shown["card"] = table([{"field": k, "value": v.replace("`", "")} for k, v in rows], ["field", "value"])
    shown["details"] = {"experiment": e.name, "config_hash": plan.config_hash, "parameters": plan.parameters,
                        "deploy": deploy, **{k: value(k) for k in reported if k not in shown}}
    return display(shown, first=LEADING)
