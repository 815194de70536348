"""`checkpoint_export` + `eval_scores` materialized in process with the real resources on a real
trained checkpoint: the blocking `logits_match` check passes and scores land in `evals.results`;
on a corrupted export the check fails and `eval_scores` does not run. CPU; vLLM in-process."""

import json

from dagster import AssetKey, DagsterInstance, materialize

from assets.evals import checkpoint_export, checkpoint_partitions, eval_scores
from factory.evals import results
from resources import InferenceResource, LakeResource, SandboxResource


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
    assert scores[0].metadata["eval_id"].value == "eval/evalsmoke@8/quick"  # the experiment's eval_suite
    assert "| bpb | all |" in scores[0].metadata["scores"].value
    assert any(r["eval_id"] == "eval/evalsmoke@8/quick" for r in results(lake, "evalsmoke"))


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
