"""The `tokenizer` and `mix` assets through Dagster, and the jobs that select them.

Each test builds its own lake in tmp_path (the embedded sqlite catalog, `file://` warehouse)
holding refined.python_stdlib, refined.site_packages and refined.package_docs made from real
standard-library text by the shared `corpus` fixture (code from a few packages; module docstrings
as the prose source), then materializes in process with `materialize([...])` and the real
`LakeResource(home=tmp_path)`:

- `tokenizer` with a small vocabulary: its metadata, and a re-run that records nothing new;
- `mix` partition `default`: metadata, the three blocking checks passing, an unchanged re-run
  that commits nothing, and a new snapshot of one source making v2;
- `mix` partition `code_curriculum`: two stages, one `mixes.versions` row per (stage, source);
- `mix` before any tokenizer: the run fails naming the tokenizer, and no version is written;
- the definitions: `tokenize_job`, `mix_job` and `demo_job` select what they say they do.

Runs on CPU, no servers, no network; about 20 seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, materialize
from pyiceberg.expressions import EqualTo

from assets import mix, tokenizer
from factory.lake import Lake
from factory.mix import MIX_VERSIONS_TABLE, mix_versions
from resources import LakeResource

CODE = {"refined.python_stdlib": ["json", "email"], "refined.site_packages": ["asyncio", "concurrent"]}
DOCS = "refined.package_docs"
TOKENIZER_CONFIG = {"ops": {"tokenizer": {"config": {"vocab_size": 512, "sample_bytes_per_source": 100_000}}}}
CHECKS = {"weights_sum_to_one", "pinned_snapshots_exist", "no_empty_source"}


# -- a small refined lake of real text ------------------------------------------------------------
def refined_lake(home: Path, corpus) -> Lake:
    lake = Lake.open(home=home)
    for table, packages in CODE.items():
        corpus.write(lake, table, corpus.code(table, packages))
    corpus.write(lake, DOCS, corpus.docstrings(DOCS))
    return lake


# -- running the assets ---------------------------------------------------------------------------
def run_tokenizer(home: Path, instance: DagsterInstance, raise_on_error: bool = True):
    return materialize([tokenizer], resources={"lake": LakeResource(home=str(home))}, run_config=TOKENIZER_CONFIG,
                       instance=instance, raise_on_error=raise_on_error)


def run_mix(home: Path, instance: DagsterInstance, partition: str, raise_on_error: bool = True):
    return materialize([mix], resources={"lake": LakeResource(home=str(home))}, partition_key=partition,
                       instance=instance, raise_on_error=raise_on_error)


def metadata(result, key: str) -> dict:
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == AssetKey(key)]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def version_rows(lake: Lake, version_id: str) -> list[dict]:
    return lake.table(MIX_VERSIONS_TABLE).scan(row_filter=EqualTo("version_id", version_id),
                                               selected_fields=("stage", "source", "weight")).to_arrow().to_pylist()


# -- tokenizer ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_tokenizer_asset_trains_then_rerun_records_nothing(tmp_path, corpus):
    lake = refined_lake(tmp_path, corpus)
    instance = DagsterInstance.ephemeral()

    first = run_tokenizer(tmp_path, instance)
    assert first.success
    meta = metadata(first, "tokenizer")
    assert meta["status"] == "new"
    assert meta["vocab_size"] == 512
    assert meta["version_id"].startswith("tokenizer/default@") and meta["content_hash"].startswith(
        meta["version_id"].rsplit("@", 1)[1])
    assert set(meta["bytes_per_token"]) == {*CODE, DOCS}
    assert all(1.0 < bpt < 10.0 for bpt in meta["bytes_per_token"].values())  # a 512-token BPE compresses a little
    assert set(meta["special_ids"]) == {"bos", "eos", "pad", "fim_prefix", "fim_middle", "fim_suffix"}
    assert Path(meta["path"]).is_file()
    [record] = [r for r in lake.lineage.records() if r.kind == "tokenizer"]
    assert record.version_id == meta["version_id"] and record.run_id == first.run_id
    assert sorted(record.upstream) == sorted(f"{t}@{lake.current_snapshot_id(t)}" for t in (*CODE, DOCS))

    again = run_tokenizer(tmp_path, instance)
    assert again.success
    meta2 = metadata(again, "tokenizer")
    assert meta2["status"] == "unchanged: already in the lake"
    assert meta2["version_id"] == meta["version_id"] and meta2["content_hash"] == meta["content_hash"]
    assert [r.version_id for r in lake.lineage.records() if r.kind == "tokenizer"] == [meta["version_id"]]


# -- mix ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_mix_asset_registers_checks_then_versions_only_on_change(tmp_path, corpus):
    lake = refined_lake(tmp_path, corpus)
    instance = DagsterInstance.ephemeral()
    assert run_tokenizer(tmp_path, instance).success

    first = run_mix(tmp_path, instance, "default")
    assert first.success
    meta = metadata(first, "mix")
    assert meta["version_id"] == "mix/default@v1"
    assert meta["status"] == "new version"
    assert meta["tokenizer"].startswith("tokenizer/default@") and meta["seq_len"] == 256
    assert meta["token_estimate"] > 0
    checks = {e.check_name: e.passed for e in first.get_asset_check_evaluations()}
    assert checks == {name: True for name in CHECKS}
    snapshot = lake.table(MIX_VERSIONS_TABLE).current_snapshot().snapshot_id
    rows = version_rows(lake, "mix/default@v1")
    assert sorted((r["source"], r["weight"]) for r in rows) == [
        (DOCS, 0.10), ("refined.python_stdlib", 0.35), ("refined.site_packages", 0.55)]

    again = run_mix(tmp_path, instance, "default")
    assert again.success
    meta2 = metadata(again, "mix")
    assert meta2["version_id"] == "mix/default@v1"
    assert meta2["status"].startswith("unchanged")
    assert lake.table(MIX_VERSIONS_TABLE).current_snapshot().snapshot_id == snapshot  # nothing committed

    new_docs = corpus.write(lake, DOCS, corpus.docstrings(DOCS, skip=40, count=10))
    third = run_mix(tmp_path, instance, "default")
    assert third.success
    meta3 = metadata(third, "mix")
    assert meta3["version_id"] == "mix/default@v2" and meta3["status"] == "new version"
    [v1, v2] = mix_versions(lake, "default")
    assert v2.pins[DOCS].snapshot_id == new_docs and v2.pins[DOCS].rows == v1.pins[DOCS].rows + 10
    for table in CODE:  # the other sources keep their snapshot
        assert v2.pins[table].snapshot_id == v1.pins[table].snapshot_id
    assert {e.check_name: e.passed for e in third.get_asset_check_evaluations()} == {name: True for name in CHECKS}


@pytest.mark.slow
def test_code_curriculum_partition_registers_two_stages(tmp_path, corpus):
    lake = refined_lake(tmp_path, corpus)
    instance = DagsterInstance.ephemeral()
    assert run_tokenizer(tmp_path, instance).success

    result = run_mix(tmp_path, instance, "code_curriculum")
    assert result.success
    assert metadata(result, "mix")["version_id"] == "mix/code_curriculum@v1"
    rows = version_rows(lake, "mix/code_curriculum@v1")
    assert len(rows) == 2 * 2  # (stage 0 until 2M tokens, stage 1 after) x (stdlib, site-packages)
    assert {(r["stage"], r["source"]): r["weight"] for r in rows} == {
        (0, "refined.python_stdlib"): 0.8, (0, "refined.site_packages"): 0.2,
        (1, "refined.python_stdlib"): 0.4, (1, "refined.site_packages"): 0.6}
    assert mix_versions(lake, "default") == []  # the other partition is untouched


@pytest.mark.slow
def test_mix_without_a_tokenizer_fails_and_writes_nothing(tmp_path, corpus):
    lake = refined_lake(tmp_path, corpus)
    result = run_mix(tmp_path, DagsterInstance.ephemeral(), "default", raise_on_error=False)
    assert not result.success
    [failure] = result.get_step_failure_events()
    error, messages = failure.step_failure_data.error, []
    while error is not None:
        messages.append(error.message)
        error = error.cause
    assert any("no tokenizer named 'default'" in m and "mix default" in m for m in messages), messages
    assert result.get_asset_materialization_events() == []
    assert not lake.has_table(MIX_VERSIONS_TABLE)
    assert [r for r in lake.lineage.records() if r.kind == "mix_version"] == []


# -- definitions ----------------------------------------------------------------------------------
def test_jobs_select_the_tokenizer_and_mix_assets():
    from configs.mixes import mix_names
    from definitions import defs

    def selected(job: str) -> set[AssetKey]:
        return set(defs.resolve_job_def(job).asset_layer.selected_asset_keys)

    assert selected("tokenize_job") == {AssetKey("tokenizer")}
    assert selected("mix_job") == {AssetKey("mix")}
    assert defs.resolve_job_def("mix_job").partitions_def.get_partition_keys() == mix_names()
    assert set(mix_names()) >= {"default", "code_curriculum"}
    demo = selected("demo_job")
    assert AssetKey("tokenizer") in demo and AssetKey("mix") not in demo
    assert {AssetKey(["refined", s]) for s in ("python_stdlib", "site_packages", "package_docs")} <= demo
