"""`checkpoint_export` + `eval_scores` materialized in process with the real resources on a real
trained checkpoint: the blocking `logits_match` check passes and scores land in `evals.results`;
on a corrupted export the check fails and `eval_scores` does not run. CPU; vLLM in-process.

`checkpoint_export` depends on `training_run` (all partitions): materializing a checkpoint's
partition neither needs nor runs a `training_run` partition (none exists in these instances).
The scores show as a table (every row and column: the UI does not clip a table value), with
values rounded to 4 significant digits and the exact headline floats kept in `raw_values`."""

import json

from dagster import AssetKey, DagsterInstance, materialize

from assets.evals import checkpoint_export, checkpoint_partitions, eval_scores
from factory.evals import results
from resources import InferenceResource, LakeResource, SandboxResource
import pytest

pytestmark = pytest.mark.slow


def run(home, partition: str, instance: DagsterInstance):
    instance.add_dynamic_partitions(checkpoint_partitions.name, [partition])
    return materialize(
        [checkpoint_export, eval_scores], partition_key=partition, instance=instance, raise_on_error=False,
        resources={"lake": LakeResource(home=str(home)), "inference": InferenceResource(), "sandbox": SandboxResource()},
    )


def test_export_check_and_scores(trained_checkpoints):
    lake = trained_checkpoints.lake
    result = run(lake.home, "evalsmoke@8", DagsterInstance.ephemeral())
    assert result.success
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == "logits_match" and check.passed
    scores = [m for m in result.asset_materializations_for_node("eval_scores")]
    meta = scores[0].metadata
    assert meta["eval_id"].value == "eval/evalsmoke@8/quick"  # the experiment's eval_suite
    rows = [r for r in results(lake, "evalsmoke") if r["eval_id"] == "eval/evalsmoke@8/quick"]
    assert rows
    table = meta["scores"]
    assert [c.name for c in table.schema.columns][:5] == ["task", "metric", "value", "± stderr", "n"]
    assert len(table.records) == len(rows)
    shown = {(r.data["task"], r.data["metric"]): r.data["value"] for r in table.records}
    assert ("bpb", "all") in shown
    for r in rows:  # the table and the headline floats show 4 significant digits; raw_values the exact value
        key = f"{r['task']}/{r['metric']}"
        assert shown[(r["task"], r["metric"])] == meta[key].value == float(f"{r['value']:.4g}")
        assert meta["raw_values"].value.get(key, r["value"]) == r["value"]
    assert list(meta)[0] == "scores"
    materialized = {e.asset_key for e in result.get_asset_materialization_events()}
    assert materialized == {AssetKey("checkpoint_export"), AssetKey("eval_scores")}  # no training_run


def test_a_corrupted_export_blocks_the_evaluation(trained_checkpoints, monkeypatch):
    lake = trained_checkpoints.lake
    before = [r for r in results(lake, "evalsmoke") if r["step"] == 4]
    monkeypatch.setenv("FACTORY_FAULTS", json.dumps({"corrupt_export": True}))
    result = run(lake.home, "evalsmoke@4", DagsterInstance.ephemeral())
    (check,) = result.get_asset_check_evaluations()
    assert not check.passed and "differ from ours" in json.dumps(check.metadata["problems"].value)
    materialized = {e.asset_key for e in result.get_asset_materialization_events()}
    assert AssetKey("checkpoint_export") in materialized and AssetKey("eval_scores") not in materialized
    assert [r for r in results(lake, "evalsmoke") if r["step"] == 4] == before
