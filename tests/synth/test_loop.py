"""The synthetic loop on a real lake: a porting batch makes a new
`synthetic.porting` snapshot → `synthetic_mix_sensor` requests `default_synthetic` → the mix asset
registers a version pinning it → the loader streams its rows; a second batch gives a new snapshot,
a new version, and a loader following the mix switches to it. CPU; needs bubblewrap (~40 s)."""

import json

import pytest
from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context, materialize

from assets.mix import mix
from configs.synth import pipeline
from factory.mix import LoaderConfig, MixLoader, get_version
from factory.sandbox import Sandbox, SandboxConfig
from factory.synth import PipelineConfig, run_pipeline
from factory.tokenize import load_tokenizer
from resources.lake import LakeResource
from sensors.synth import synthetic_mix_sensor

MIX = "default_synthetic"


def porting(limit: int) -> PipelineConfig:
    config = pipeline("porting")
    return PipelineConfig.model_validate({**config.model_dump(), "seeds": {**config.seeds.model_dump(), "limit": limit}})


def tick(home, cursor):
    context = build_sensor_context(instance=DagsterInstance.ephemeral(), cursor=cursor,
                                   resources={"lake": LakeResource(home=str(home))})
    return synthetic_mix_sensor(context), context


def register(home, instance):
    result = materialize([mix], partition_key=MIX, instance=instance, resources={"lake": LakeResource(home=str(home))})
    return result.asset_materializations_for_node("mix")[0].metadata["version_id"].value


@pytest.mark.slow
def test_new_synthetic_snapshots_become_mix_versions_that_training_streams(tmp_path, build_training_lake):
    lake = build_training_lake(tmp_path / "home")
    sandbox = Sandbox(SandboxConfig(workers=2))
    instance = DagsterInstance.ephemeral()

    result, context = tick(lake.home, None)
    assert isinstance(result, SkipReason)  # no synthetic table yet

    first = run_pipeline(lake, porting(150), sandbox=lambda t: sandbox, log=lambda m: None)
    assert first.accepted == 150
    result, _ = tick(lake.home, context.cursor)
    assert isinstance(result, SensorResult)
    [request] = result.run_requests
    assert request.partition_key == MIX and request.run_key == f"{MIX}:synthetic.porting@{first.snapshot_id}"
    assert json.loads(result.cursor) == {"synthetic.porting": first.snapshot_id}
    assert isinstance(tick(lake.home, result.cursor)[0], SkipReason)  # nothing new since

    v1 = register(lake.home, instance)
    version = get_version(lake, v1)
    assert v1 == f"mix/{MIX}@v1" and version.pins["synthetic.porting"].snapshot_id == first.snapshot_id
    tokenizer = load_tokenizer(version.tokenizer_path)
    loader = MixLoader(lake, v1, LoaderConfig(global_batch=16, num_shards=8, num_workers=0, follow=True, poll_every=1))
    try:
        batches = [loader.next_batch() for _ in range(6)]
        rows = [tokenizer.decode(b.tokens[i].tolist()) for b in batches for i, s in enumerate(b.sources)
                if s == "synthetic.porting"]
        assert rows and any("def solve(question" in r for r in rows)

        second = run_pipeline(lake, porting(300), sandbox=lambda t: sandbox, log=lambda m: None)
        assert second.accepted == 150 and second.rejected == {"dedup": 150}  # the first 150 are already there
        result, _ = tick(lake.home, result.cursor)
        assert [r.run_key for r in result.run_requests] == [f"{MIX}:synthetic.porting@{second.snapshot_id}"]
        v2 = register(lake.home, instance)
        assert v2 == f"mix/{MIX}@v2"
        after = [loader.next_batch() for _ in range(2)]
        assert {b.version_id for b in after} == {v2}
        assert loader.state_dict()["history"][-1] == {"step": 6, "from": v1, "to": v2}
    finally:
        loader.close()
