"""The refinement chain through Dagster: every step asset of every embedded source plus the
blocking checks, materialized in one in-process run over small real raw tables (a real
SparkSession and a real Iceberg catalog in tmp_path). Marked `spark` (~60-90 s)."""

import pytest
from dagster import AssetKey, DagsterInstance, materialize

from assets import all_checks
from assets.raw import raw_assets
from assets.refine import refine_assets
from configs.refine import pipelines
from factory.lake import Lake
from resources import LakeResource, SparkResource

pytestmark = pytest.mark.spark


def test_refine_chain_materializes_with_checks_and_exclusions(tmp_path):
    resources = {"lake": LakeResource(home=str(tmp_path)), "spark": SparkResource(master="local[2]")}
    raw_config = {"ops": {f"raw__{s}": {"config": {"max_documents": 60}} for s in pipelines()}}
    result = materialize([*raw_assets(), *refine_assets(), *all_checks()], resources=resources, run_config=raw_config,
                         instance=DagsterInstance.ephemeral())
    assert result.success

    checks = {(e.asset_key.to_user_string(), e.check_name): e.passed for e in result.get_asset_check_evaluations()}
    for source in pipelines():
        assert checks[(f"refined/{source}", "not_empty")] is True
        assert checks[(f"refined/{source}", "no_eval_ngram_overlap")] is True
        assert checks[(f"staged/{source}_exact_deduped", "no_duplicate_content")] is True

    lake = Lake.open(home=tmp_path)
    materialized = {e.asset_key for e in result.get_asset_materialization_events()}
    for source, pipeline in pipelines().items():
        previous_out = None
        for index in range(len(pipeline.steps)):
            table = pipeline.table(index)
            assert AssetKey(table.split(".")) in materialized
            [record] = lake.lineage.resolve(table)
            assert record.run_id == result.run_id
            meta = record.metadata
            if previous_out is not None:
                assert meta["rows_in"] == previous_out  # each step reads what the previous wrote
            assert meta["rows_in"] - meta["rows_out"] == sum(meta["dropped"].values())
            source_input = pipeline.table(index - 1)
            assert f"{source_input}@{lake.current_snapshot_id(source_input)}" in record.upstream
            previous_out = meta["rows_out"]
        excluded = lake.table("refined.exclusions").scan(row_filter=f"source == '{source}'").to_arrow()
        raw_rows = lake.table(f"raw.{source}").scan().to_arrow().num_rows
        refined_rows = lake.table(f"refined.{source}").scan().to_arrow().num_rows
        assert excluded.num_rows == raw_rows - refined_rows  # every dropped document is accounted for
