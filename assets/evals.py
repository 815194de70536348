"""`checkpoint_export` and `eval_scores`: one dynamic partition per evaluated checkpoint (`<run>@<step>`).

The eval sensor adds a partition and requests a run for every checkpoint whose step is a
multiple of its experiment's `eval_every`; the training asset adds the run's last checkpoint.
Other checkpoints stay rows of `train.checkpoints` (Dagster's dynamic partitions break at tens
of thousands of keys): evaluate one with `factory eval <run>@<step>`, or add its key in the UI.

`checkpoint_export` depends on `training_run` with `AllPartitionMapping`: a checkpoint key
`<run>@<step>` belongs to one `training_runs` key `<run>`, but Dagster has no built-in mapping
that parses a key (Identity needs equal keys; Static needs static partitions; a custom
`PartitionMapping` subclass is deprecated and not sent to the webserver or the daemon, which
would fall back to Identity). The edge draws the chain run -> export -> scores in the asset
graph; it is a `deps` edge (nothing is loaded), and neither the eval sensor nor
`materialize([checkpoint_export, eval_scores])` selects `training_run`, so evaluating a
checkpoint never requires or launches training partitions.

`checkpoint_export` writes the Hugging Face Llama directory and runs the blocking
`logits_match` check: ours, transformers and the engine must agree, or `eval_scores` does not
run — a score of a model that is not the trained model would be worse than no score.
"""


from typing import Optional

from dagster import (
    AllPartitionMapping,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    Config,
    DynamicPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
)

from assets._metadata import display, table
from configs.evals import suite as eval_suite
from factory.deploy.kube.placement import op_tags
from factory.evals import evaluate
from factory.evals.results import previous_results
from factory.infer import export_checkpoint, find_checkpoint, find_export
from factory.infer.equivalence import verify_export
from resources.inference import InferenceResource, SandboxResource
from resources.lake import LakeResource

checkpoint_partitions = DynamicPartitionsDefinition(name="checkpoints")


def checkpoint_key(checkpoint_id: str) -> str:
    """Partition key of a checkpoint id: `ckpt/smoke@120` -> `smoke@120`."""
    return checkpoint_id.removeprefix("ckpt/")


@asset(
    key="checkpoint_export",
    partitions_def=checkpoint_partitions,
    deps=[AssetDep("training_run", partition_mapping=AllPartitionMapping())],
    group_name="evals",
    kinds={"huggingface", "pytorch"},
    check_specs=[AssetCheckSpec("logits_match", asset="checkpoint_export", blocking=True,
                                description="Logits of ours, transformers' LlamaForCausalLM and the engine (vLLM) "
                                            "agree in fp32 on a fixed prompt set; greedy generations match.")],
    op_tags=op_tags("export"),
    description="A checkpoint exported to the Hugging Face Llama format (config.json, model.safetensors, "
                "tokenizer files) at a content-addressed path under artifacts/exports.",
)
def checkpoint_export(context: AssetExecutionContext, lake: LakeResource,
                      inference: InferenceResource) -> MaterializeResult:
    checkpoint = find_checkpoint(lake.lake(), f"ckpt/{context.partition_key}")
    export = export_checkpoint(lake.lake(), checkpoint, run_id=context.run_id)
    engine = inference.engine_config()
    context.log.info(f"exported {export.checkpoint_id} to {export.path}; checking equivalence on {engine.kind}")
    report = verify_export(lake.lake(), export, engine, checkpoint=checkpoint)
    context.log.info(report.summary())
    return MaterializeResult(
        metadata=display({"export_id": export.export_id,
                          "serve": MetadataValue.md(f"`factory serve {export.export_id}`"),
                          "path": MetadataValue.path(str(export.path)), "checkpoint_id": export.checkpoint_id,
                          "mix_version": export.mix_version, "sha256": export.sha256}),
        check_results=[AssetCheckResult(
            check_name="logits_match", passed=report.passed, severity=AssetCheckSeverity.ERROR,
            metadata=display({"summary": report.summary(), "problems": report.problems,
                              "max_logit_diff_transformers": report.max_logit_diff_transformers,
                              "max_logprob_diff_engine": report.max_logprob_diff_engine}))],
    )


class EvalConfig(Config):
    suite: Optional[str] = None
    """Eval suite of configs/evals.py; default: the experiment's `eval_suite`."""


@asset(
    key="eval_scores",
    deps=["checkpoint_export"],
    partitions_def=checkpoint_partitions,
    group_name="evals",
    kinds={"iceberg", "python"},
    op_tags=op_tags("eval"),
    description="The eval suite on one checkpoint's export: bits per byte on held-out splits, HumanEval "
                "pass@k in the sandbox, next-line completion. Scores in evals.results, items in evals.samples.",
)
def eval_scores(context: AssetExecutionContext, config: EvalConfig, lake: LakeResource,
                inference: InferenceResource, sandbox: SandboxResource) -> MaterializeResult:
    checkpoint = find_checkpoint(lake.lake(), f"ckpt/{context.partition_key}")
    export = find_export(lake.lake(), checkpoint.checkpoint_id)
    suite = eval_suite(config.suite or checkpoint.plan.experiment.eval_suite)
    report = evaluate(lake.lake(), export, inference.engine(export), suite, tokens=checkpoint.ref.tokens,
                      sandbox_config=sandbox.config(), log=context.log.info, run_id=context.run_id,
                      partition=context.partition_key)
    previous = previous_results(lake.lake(), export.run, export.step, suite.name)
    # one float per metric: the asset's "Plots" tab charts each across checkpoints
    headline = {f"{r['task']}/{r['metric']}": r["value"] for r in report.rows}
    return MaterializeResult(metadata=display({
        "scores": _scores_table(report.rows, previous), **headline, "eval_id": report.eval_id,
        "lineage": MetadataValue.md(f"`factory lineage {report.eval_id}`"),
        "details": {"seconds": report.seconds, "snapshot_id": report.snapshot_id, "tasks": report.metadata},
    }))


def _scores_table(rows: list[dict], previous: list[dict]):
    """The scores as a table the UI shows whole (a Markdown table of six columns was clipped):
    value ± stderr, n, and the change from the previous evaluated checkpoint of the run."""
    before = {(r["task"], r["metric"]): r["value"] for r in previous}
    change = f"change vs step {previous[0]['step']}" if previous else "change"
    records = []
    for r in rows:
        old = before.get((r["task"], r["metric"]))
        records.append({"task": r["task"], "metric": r["metric"], "value": r["value"], "± stderr": r["stderr"],
                        "n": r["n"], change: None if old is None else r["value"] - old})
    return table(records, ["task", "metric", "value", "± stderr", "n", change])
