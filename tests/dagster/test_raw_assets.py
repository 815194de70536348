"""The raw/<source> assets materialize through a real (ephemeral) Dagster instance into a real
Iceberg catalog in tmp_path, report their metadata, and commit nothing when re-run unchanged.
CPU, no servers."""

from dagster import DagsterInstance, build_schedule_context, materialize

from assets.raw import raw_assets
from factory.lake import Lake
from resources import LakeResource
from sensors import raw_refresh_schedule


def _run(home, instance, **config):
    run_config = {"ops": {f"raw__{name}": {"config": config} for name in ("python_stdlib", "package_docs")}}
    assets = [a for a in raw_assets() if a.key.path[-1] in ("python_stdlib", "package_docs")]
    return materialize(assets, resources={"lake": LakeResource(home=str(home))}, run_config=run_config, instance=instance)


def _metadata(result, name):
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key.path[-1] == name]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_raw_assets_write_tables_lineage_and_metadata(tmp_path):
    instance = DagsterInstance.ephemeral()
    first = _run(tmp_path, instance, max_documents=20)
    assert first.success
    meta = _metadata(first, "python_stdlib")
    assert meta["dagster/row_count"] == 20
    assert meta["status"] == "new snapshot"
    assert meta["bytes"] > 0 and "**" in meta["sample"]

    lake = Lake.open(home=tmp_path)
    table = lake.table("raw.python_stdlib")
    assert table.scan().to_arrow().num_rows == 20
    assert str(table.current_snapshot().snapshot_id) == meta["snapshot_id"]
    [record] = lake.lineage.resolve("raw.python_stdlib")
    assert record.run_id == first.run_id
    assert record.asset_key == "raw/python_stdlib"
    assert record.config_hash == meta["config_hash"]

    again = _run(tmp_path, instance, max_documents=20)
    assert again.success
    meta2 = _metadata(again, "python_stdlib")
    assert meta2["status"] == "unchanged: nothing committed"
    assert meta2["snapshot_id"] == meta["snapshot_id"]
    assert len(lake.lineage.records()) == 2  # one per table, none added by the unchanged re-run


def test_refresh_schedule_requests_the_ingest_job():
    context = build_schedule_context()
    data = raw_refresh_schedule.evaluate_tick(context)
    assert [r.job_name for r in data.run_requests] in ([None], ["ingest_job"])
    assert raw_refresh_schedule.job_name == "ingest_job"
