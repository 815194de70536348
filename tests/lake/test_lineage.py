"""The `factory.lineage` table (`factory.lake.lineage`): rows round-trip through Iceberg, and the
graph they form resolves and walks both ways — raw snapshot → tokenizer → eval.

Every test runs on both catalogs (`catalog`): a real pyiceberg `SqlCatalog` on sqlite in
`tmp_path`, and an Iceberg REST catalog over S3 on the session's SeaweedFS.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from factory.lake import CommitStamp, LineageRecord
from factory.lake.commit import stamp_of
from factory.lake.lineage import LINEAGE_TABLE, snapshot_record, table_version_id
from factory.lake.schemas import RAW_DOCUMENTS
from factory.version import config_hash

pytestmark = pytest.mark.usefixtures("catalog")

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
SOURCE_CONFIG = {"name": "toy", "root": "/data/toy"}


def raw_rows(*texts: str) -> pa.Table:
    now = T0
    return pa.Table.from_pylist(
        [
            {"doc_id": f"d{i}", "source": "toy", "path": f"{i}.txt", "text": t, "language": "text",
             "bytes": len(t), "license": None, "content_sha256": f"h{i}", "ingested_at": now}
            for i, t in enumerate(texts)
        ],
        schema=RAW_DOCUMENTS.as_arrow(),
    )


@pytest.fixture
def graph(lake):
    """raw.toy@<snap> → tokenizer → eval, the way the assets write them."""
    stamp = CommitStamp(
        asset_key="raw/toy", config_hash=config_hash(SOURCE_CONFIG), run_id="run-raw",
        upstream={"source.toy": 7}, content_hash="c0ffee00c0ffee00",
    )
    commit = lake.commit("raw.toy", raw_rows("a", "b"), stamp, mode="overwrite", schema=RAW_DOCUMENTS)
    raw = snapshot_record(commit, stamp, SOURCE_CONFIG, uri=lake.table("raw.toy").location(), metadata={"documents": 2})
    raw = raw.model_copy(update={"created_at": T0})
    tokenizer = LineageRecord(
        version_id="tokenizer/bpe-1k@ab12cd34ef56", kind="tokenizer", name="tokenizer/bpe-1k",
        uri="file:///artifacts/tokenizer/ab12cd34ef56", content_hash="ab12cd34ef567890",
        upstream=[raw.version_id], config_json='{"vocab_size":1024}', config_hash="tokcfg",
        code_version="sha1", env_lock="env1", asset_key="tokenizer", run_id="run-tok",
        metadata_json='{"vocab":1024}', created_at=T0 + dt.timedelta(minutes=1),
    )
    evaluation = LineageRecord(
        version_id="eval/humaneval@e1", kind="eval_result", name="eval/humaneval",
        upstream=[tokenizer.version_id], content_hash="99887766554433", metadata_json='{"pass@1":0.25}',
        created_at=T0 + dt.timedelta(minutes=2),
    )
    lake.lineage.record(raw)
    lake.lineage.record(tokenizer, evaluation)  # two rows, one commit
    return commit, raw, tokenizer, evaluation


def test_no_lineage_table_reads_as_empty(lake):
    assert lake.lineage.records() == []
    assert lake.lineage.resolve("raw.toy") == []
    assert lake.lineage.downstream_of("raw.toy@1") == []


def test_snapshot_record_carries_the_commit_and_its_stamp(lake, graph):
    commit, raw, _, _ = graph
    assert raw.version_id == f"raw.toy@{commit.snapshot_id}" == table_version_id("raw.toy", commit.snapshot_id)
    assert raw.kind == "table_snapshot" and raw.name == "raw.toy" and raw.snapshot_id == commit.snapshot_id
    assert raw.upstream == ["source.toy@7"]
    assert raw.config == SOURCE_CONFIG and raw.config_hash == config_hash(SOURCE_CONFIG)
    assert raw.content_hash == "c0ffee00c0ffee00" and raw.run_id == "run-raw" and raw.asset_key == "raw/toy"
    assert raw.code_version == stamp_of(lake.table("raw.toy"))["code-version"] != ""
    assert raw.metadata == {"documents": 2}


def test_records_round_trip_through_iceberg(lake, graph):
    _, raw, tokenizer, evaluation = graph
    assert lake.lineage.records() == [raw, tokenizer, evaluation]  # every field, oldest first
    table = lake.table(LINEAGE_TABLE)
    assert len(table.snapshots()) == 2  # one commit per record() call
    assert stamp_of(table)["asset-key"] == "factory/lineage"
    assert stamp_of(table)["run-id"] == "run-tok"


def test_resolve_by_id_name_uri_and_hash_prefix(lake, graph):
    commit, raw, tokenizer, evaluation = graph
    store = lake.lineage
    assert store.resolve(raw.version_id) == [raw]
    assert store.resolve("tokenizer/bpe-1k") == [tokenizer]
    assert store.resolve("file:///artifacts/tokenizer/ab12cd34ef56") == [tokenizer]
    assert store.resolve("ab12cd34") == [tokenizer]  # content-hash prefix of 8+
    assert store.resolve("ab12cd3") == []  # too short to be a hash prefix
    assert store.resolve("eval/nothing") == []


def test_resolve_table_name_prefers_the_current_snapshot(lake, graph):
    commit, raw, _, _ = graph
    stamp = CommitStamp(asset_key="raw/toy", config_hash="h2", content_hash="second")
    second = lake.commit("raw.toy", raw_rows("c"), stamp, mode="overwrite")
    newer = snapshot_record(second, stamp, {"v": 2}).model_copy(update={"created_at": T0 + dt.timedelta(hours=1)})
    lake.lineage.record(newer)
    assert lake.lineage.resolve("raw.toy") == [newer]

    # a snapshot without a lineage row (a crash between the two commits): nothing — never the row
    # of an older snapshot (`factory lineage` then shows the current snapshot itself)
    lake.commit("raw.toy", raw_rows("d"), CommitStamp(asset_key="raw/toy", config_hash="h3"), mode="overwrite")
    assert lake.lineage.resolve("raw.toy") == []


def test_upstream_of_walks_to_the_sources(lake, graph):
    _, raw, tokenizer, evaluation = graph
    tree = lake.lineage.upstream_of(evaluation.version_id)
    assert tree["record"] == evaluation
    [tok_node] = tree["upstream"]
    assert tok_node["record"] == tokenizer
    [raw_node] = tok_node["upstream"]
    assert raw_node["version_id"] == raw.version_id and raw_node["record"] == raw
    [leaf] = raw_node["upstream"]
    assert leaf == {"version_id": "source.toy@7", "record": None, "upstream": []}  # unknown id: a leaf


def test_downstream_of_finds_every_transitive_user(lake, graph):
    _, raw, tokenizer, evaluation = graph
    store = lake.lineage
    assert store.downstream_of(raw.version_id) == [tokenizer, evaluation]
    assert store.downstream_of(tokenizer.version_id) == [evaluation]
    assert store.downstream_of(evaluation.version_id) == []
    # "which data snapshots, code version and config produced this eval score?"
    tok = store.upstream_of(evaluation.version_id)["upstream"][0]
    data = tok["upstream"][0]["record"]
    assert (data.snapshot_id, data.code_version, data.config) == (raw.snapshot_id, raw.code_version, SOURCE_CONFIG)


def test_lineage_cycle_does_not_loop(lake):
    a = LineageRecord(version_id="a", kind="x", name="a", upstream=["b"], created_at=T0)
    b = LineageRecord(version_id="b", kind="x", name="b", upstream=["a"], created_at=T0 + dt.timedelta(seconds=1))
    lake.lineage.record(a, b)
    tree = lake.lineage.upstream_of("a")
    assert tree["upstream"][0]["version_id"] == "b"
    assert tree["upstream"][0]["upstream"][0] == {"version_id": "a", "record": a, "upstream": []}
    assert lake.lineage.downstream_of("a") == [a, b]


def test_a_pinned_view_reads_like_the_store_as_the_table_was_and_writes_nothing(lake, graph):
    """`pinned()` (what `factory lineage` reads through): one load and one plan of the table, each
    filtered read keeping the files whose bounds can match; the same answers as the store."""
    _, raw, tokenizer, evaluation = graph
    view, store = lake.lineage.pinned(), lake.lineage
    for ref in (raw.version_id, "tokenizer/bpe-1k", "file:///artifacts/tokenizer/ab12cd34ef56", "ab12cd34", "nothing"):
        assert view.resolve(ref) == store.resolve(ref), ref
    assert view.records() == store.records() and view.records(kind="eval_result") == [evaluation]
    assert view.upstream_trees([evaluation.version_id, tokenizer.version_id]) == \
        [store.upstream_of(evaluation.version_id), store.upstream_of(tokenizer.version_id)]
    assert view.downstream_of(raw.version_id) == store.downstream_of(raw.version_id) == [tokenizer, evaluation]

    later = LineageRecord(version_id="eval/later@e2", kind="eval_result", name="eval/later", upstream=[raw.version_id],
                          created_at=T0 + dt.timedelta(minutes=3))
    store.record(later)
    assert view.resolve("eval/later") == [] and store.resolve("eval/later") == [later]  # as it was when pinned
    with pytest.raises(TypeError, match="read only"):
        view.record(later)
    assert lake.lineage.pinned().downstream_of(raw.version_id) == [tokenizer, evaluation, later]
