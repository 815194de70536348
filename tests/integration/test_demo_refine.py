"""The refinement chain through Dagster, read from the home `make demo` left: its `demo_job` run
materialized every step asset of every embedded source with the blocking checks, in one run of the
real instance, over the real sources (a real SparkSession and the home's Iceberg catalog).

Checked there rather than by a chain of its own (which took 7 minutes of a loaded `make test`
for what the demo has already done): each check passed in that run, each step table was written
by it, each step's lineage reads what the previous step wrote, and every dropped document has its
`refined.exclusions` row. Read only; `slow` with the demo home it waits for."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, RunsFilter

from configs.refine import pipelines
from factory.lake import Lake

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_run(demo_home):
    """(lake, the demo_job run's id, its materialized asset keys, its check verdicts)."""
    instance = DagsterInstance.from_config(demo_home["DAGSTER_HOME"])
    try:
        [run] = instance.get_runs(filters=RunsFilter(job_name="demo_job"))
        materialized = {e.dagster_event.asset_key
                        for e in instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)}
        checks = {}
        for e in instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION):
            evaluation = e.dagster_event.event_specific_data
            checks[(evaluation.asset_key.to_user_string(), evaluation.check_name)] = evaluation.passed
    finally:
        instance.dispose()
    return Lake.open(home=Path(demo_home["FACTORY_HOME"])), run.run_id, materialized, checks


def test_the_demo_job_ran_every_blocking_check_and_each_passed(demo_run):
    _, _, _, checks = demo_run
    for source in pipelines():
        assert checks[(f"refined/{source}", "not_empty")] is True
        assert checks[(f"refined/{source}", "no_eval_ngram_overlap")] is True
        assert checks[(f"staged/{source}_exact_deduped", "no_duplicate_content")] is True


def test_each_step_reads_what_the_previous_wrote_and_every_drop_is_an_exclusion(demo_run):
    lake, run_id, materialized, _ = demo_run
    for source, pipeline in pipelines().items():
        previous_out = None
        for index in range(len(pipeline.steps)):
            table = pipeline.table(index)
            assert AssetKey(table.split(".")) in materialized
            [record] = lake.lineage.resolve(table)
            assert record.run_id == run_id
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
