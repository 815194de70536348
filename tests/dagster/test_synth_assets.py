"""`synthetic/porting` materialized in process with the real resources (sandbox included):
metadata counts, the table, and a second run adding nothing. CPU; needs bubblewrap."""

import pytest
from dagster import DagsterInstance, materialize

from assets.synth import synth_assets
from factory.lake import Lake
from resources import InferenceResource, LakeResource, SandboxResource


@pytest.mark.slow
def test_porting_asset_commits_verified_rows_with_metadata(tmp_path):
    [porting] = [a for a in synth_assets() if a.key.path == ["synthetic", "porting"]]
    resources = {"lake": LakeResource(home=str(tmp_path)), "inference": InferenceResource(), "sandbox": SandboxResource()}
    run_config = {"ops": {"synthetic__porting": {"config": {"limit": 60}}}}
    instance = DagsterInstance.ephemeral()
    first = materialize([porting], resources=resources, run_config=run_config, instance=instance)
    meta = first.asset_materializations_for_node("synthetic__porting")[0].metadata
    assert meta["seeds"].value == 60 and meta["accepted"].value == 60 and meta["rejected"].value == 0
    assert Lake.open(home=tmp_path).table("synthetic.porting").scan().to_arrow().num_rows == 60
    second = materialize([porting], resources=resources, run_config=run_config, instance=instance)
    meta = second.asset_materializations_for_node("synthetic__porting")[0].metadata
    assert meta["accepted"].value == 0 and meta["snapshot_id"].value == "none (nothing accepted)"
    assert "| dedup | 60 |" in meta["rejected_by"].value
