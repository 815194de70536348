"""Refinement step assets: `staged/<source>_<step>` ... `refined/<source>`, one per step.

Each asset runs one step of the source's pipeline (configs/refine.py) on the pinned snapshot of
the previous step and reports rows/bytes in and out, drops by reason and redactions. Blocking
checks guard the chain: no duplicate content after exact dedup; the refined table is non-empty
and shares no long n-gram with the evaluation sets.
"""

from dagster import (
    AssetCheckResult,
    AssetKey,
    AssetsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
    asset_check,
)

from assets._metadata import display
from configs.refine import pipelines
from factory.data.objectstore import executor_s3
from factory.data.refine import checks
from factory.data.refine.config import RefineConfig
from factory.data.refine.pipeline import StepReport, run_step
from factory.deploy.kube.placement import op_tags
from resources.lake import LakeResource
from resources.spark import SparkResource


def refine_assets() -> list[AssetsDefinition]:
    return [_step_asset(p, i) for p in pipelines().values() for i in range(len(p.steps))]


def refine_checks() -> list:
    out = []
    for pipeline in pipelines().values():
        for i, step in enumerate(pipeline.steps):
            if step.kind == "exact_dedup":
                out.append(_no_duplicates_check(pipeline.table(i)))
        out += [_not_empty_check(pipeline), _no_eval_overlap_check(pipeline)]
    return out


def dedup_asset_keys() -> list[AssetKey]:
    return [_key(p.table(i)) for p in pipelines().values() for i, s in enumerate(p.steps)
            if s.kind in ("exact_dedup", "near_dedup")]


def _key(table: str) -> AssetKey:
    return AssetKey(table.split("."))


def _step_asset(pipeline: RefineConfig, index: int) -> AssetsDefinition:
    step, table = pipeline.steps[index], pipeline.table(index)
    deps = [_key(pipeline.table(index - 1))]
    deps += [AssetKey(["staged", f"{other}_normalized"]) for other in getattr(step, "across_sources", [])]

    @asset(
        key=_key(table),
        deps=deps,
        group_name=f"refine_{pipeline.source}",
        op_tags=op_tags("refine"),
        kinds={"spark", "iceberg"},
        description=f"{pipeline.source}: {step.kind} — {type(step).__doc__.strip()} Drops go to refined.exclusions.",
    )
    def _asset(context, lake: LakeResource, spark: SparkResource) -> MaterializeResult:
        report = run_step(spark.session(), lake.lake(), pipeline, index, run_id=context.run_id, log=context.log.info,
                          s3=executor_s3(lake.profile()))
        return MaterializeResult(metadata=_metadata(report))

    return _asset


def _metadata(r: StepReport) -> dict:
    rows = "\n".join(f"| {reason} | {n} | {r.dropped_bytes[reason]:,} |" for reason, n in r.dropped.items())
    drops = "| reason | documents | bytes |\n|---|---|---|\n" + (rows or "| (none) | 0 | 0 |")
    return display({
        "table": r.table,
        "snapshot_id": str(r.snapshot_id),
        "input": f"{r.input_table}@{r.input_snapshot_id}",
        "dagster/row_count": r.rows_out,
        "rows_in": r.rows_in,
        "rows_out": r.rows_out,
        "bytes_in": r.bytes_in,
        "bytes_out": r.bytes_out,
        "drops": MetadataValue.md(drops),
        "dropped": MetadataValue.json(r.dropped),
        "redactions": MetadataValue.json(r.redactions),
        "exclusions_snapshot_id": str(r.exclusions_snapshot_id),
        "seconds": r.seconds,
        "query_drops": MetadataValue.md(
            f"`factory sql \"select reason, count(*) from refined.exclusions where source='{r.source}' "
            f"and step='{r.step}' group by 1\"`"
        ),
    })


def _no_duplicates_check(table: str):
    @asset_check(asset=_key(table), name="no_duplicate_content", blocking=True,
                 description="No two rows share a content hash after exact dedup.")
    def _check(lake: LakeResource) -> AssetCheckResult:
        duplicates = checks.duplicate_content(lake.lake(), table)
        return AssetCheckResult(passed=duplicates == 0, metadata={"duplicate_rows": duplicates})

    return _check


def _not_empty_check(pipeline: RefineConfig):
    table = pipeline.table(len(pipeline.steps) - 1)

    @asset_check(asset=_key(table), name="not_empty", blocking=True, description="The refined table has rows.")
    def _check(lake: LakeResource) -> AssetCheckResult:
        rows = checks.row_count(lake.lake(), table)
        return AssetCheckResult(passed=rows > 0, metadata={"rows": rows})

    return _check


def _no_eval_overlap_check(pipeline: RefineConfig):
    table = pipeline.table(len(pipeline.steps) - 1)
    decontam = next((s for s in pipeline.steps if s.kind == "decontaminate"), None)

    @asset_check(asset=_key(table), name="no_eval_ngram_overlap", blocking=True,
                 description="No row shares a long n-gram with the evaluation sets (HumanEval).")
    def _check(lake: LakeResource) -> AssetCheckResult:
        if decontam is None:
            return AssetCheckResult(passed=False, metadata={"reason": "the pipeline has no decontaminate step"})
        hits = checks.eval_overlap(lake.lake(), table, decontam)
        return AssetCheckResult(passed=not hits, metadata={"contaminated_rows": len(hits),
                                                           "examples": MetadataValue.json(hits[:5])})

    return _check
