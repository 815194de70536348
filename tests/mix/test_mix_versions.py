"""Mix versions (`factory.mix.versions`, `factory.mix.spec`): registering pins every table to its
snapshot and the tokenizer, writes one `mixes.versions` row per (stage, source) and a lineage row;
an unchanged plan commits nothing; a new weight or a new snapshot makes the next version; lookups
by id and name; `version_problems`. Bad inputs each fail with an error naming the input and
commit nothing.

Read-only checks use the session lake (`mix_lake`) under mix names of their own (`versions_*`);
tests that write tables use a fresh tmp lake. Every test runs on both catalogs (`catalog`): a real
pyiceberg `SqlCatalog` on sqlite, and an Iceberg REST catalog over S3 on the session's SeaweedFS
(loopback only); a few seconds each.
"""

from __future__ import annotations

import pytest
from conftest import spec
from pydantic import ValidationError
from pyiceberg.expressions import EqualTo

from factory.data.split import doc_hashes, heldout_mask
from factory.lake import Lake
from factory.lake.schemas import REFINED_DOCUMENTS
from factory.mix import (
    MIX_VERSIONS_TABLE,
    MixError,
    MixSpec,
    get_version,
    latest_version,
    load_spec,
    mix_versions,
    register_mix_version,
    version_problems,
)
from factory.tokenize import TokenizerConfig, latest_tokenizer, train_tokenizer

TABLES = ["refined.alpha", "refined.beta", "refined.gamma"]
pytestmark = pytest.mark.usefixtures("catalog")

STAGES = [{"until_tokens": 1_000, "weights": {"refined.alpha": 1.0}},
          {"until_tokens": 5_000, "weights": {"refined.beta": 0.5, "refined.gamma": 0.5}}]


def stored_rows(lake: Lake, mix: str) -> list[dict]:
    rows = lake.table(MIX_VERSIONS_TABLE).scan(row_filter=EqualTo("mix", mix)).to_arrow().to_pylist()
    return sorted(rows, key=lambda r: (r["version"], r["stage"], r["source"]))


def versions_snapshot(lake: Lake) -> int | None:
    return lake.current_snapshot_id(MIX_VERSIONS_TABLE) if lake.has_table(MIX_VERSIONS_TABLE) else None


def lineage_of(lake: Lake, version_id: str):
    return [r for r in lake.lineage.records() if r.version_id == version_id]


def fresh_lake(lake: Lake, corpus, documents) -> Lake:
    """`lake` with two small tables and a tokenizer trained on them: for tests that write tables."""
    corpus.write(lake, "refined.alpha", documents("refined.alpha")[:20], chunks=3)
    corpus.write(lake, "refined.beta", documents("refined.beta")[:10], chunks=3)
    train_tokenizer(lake, TokenizerConfig(name="default", vocab_size=300, sources=["refined.alpha", "refined.beta"],
                                          sample_bytes_per_source=50_000, measure_bytes_per_source=20_000))
    return lake


def pair(name: str, **overrides) -> MixSpec:
    return spec(name, sources=[{"table": "refined.alpha", "weight": 0.6}, {"table": "refined.beta", "weight": 0.4}],
                **overrides)


# -- registering ---------------------------------------------------------------------------------

def test_register_creates_v1_with_one_row_per_source(mix_lake):
    v, created = register_mix_version(mix_lake, spec("versions_a"))
    assert created and v.version == 1 and v.version_id == "mix/versions_a@v1"
    tokenizer = latest_tokenizer(mix_lake, "default")
    assert (v.tokenizer_version, v.tokenizer_path) == (tokenizer.version_id, tokenizer.path)

    rows = stored_rows(mix_lake, "versions_a")
    assert len(rows) == 3
    assert {r["source"]: r["weight"] for r in rows} == {"refined.alpha": 0.5, "refined.beta": 0.3, "refined.gamma": 0.2}
    assert {(r["version_id"], r["stage"], r["until_tokens"], r["seq_len"], r["tokenizer"], r["plan_hash"])
            for r in rows} == {("mix/versions_a@v1", 0, None, 32, tokenizer.version_id, v.plan_hash)}
    for r in rows:
        pin = v.pins[r["source"]]
        assert r["snapshot_id"] == pin.snapshot_id == mix_lake.current_snapshot_id(r["source"])
        assert (r["rows"], r["train_rows"], r["bytes"], r["token_estimate"]) == \
            (pin.rows, pin.train_rows, pin.bytes, pin.token_estimate)


def test_pins_count_only_the_training_split(mix_lake, documents):
    v = latest_version(mix_lake, "trio")
    for table, pin in v.pins.items():
        data = mix_lake.table(table).scan(snapshot_id=pin.snapshot_id, selected_fields=("doc_id", "bytes")).to_arrow()
        keep = ~heldout_mask(doc_hashes(data.column("doc_id").to_pylist()), v.spec.heldout_fraction)
        assert pin.rows == data.num_rows == len(documents(table))
        assert pin.train_rows == int(keep.sum()) and pin.train_rows > 0
        assert pin.bytes == sum(b for b, k in zip(data.column("bytes").to_pylist(), keep) if k)
        assert pin.token_estimate == int(pin.bytes / pin.bytes_per_token)
        assert pin.bytes_per_token == latest_tokenizer(mix_lake, "default").bytes_per_token[table]


def test_stages_make_one_row_per_stage_and_source(mix_lake):
    v, created = register_mix_version(mix_lake, spec("versions_staged", stages=STAGES))
    assert created
    rows = stored_rows(mix_lake, "versions_staged")
    assert len(rows) == (len(STAGES) + 1) * len(TABLES)
    assert {r["stage"]: r["until_tokens"] for r in rows} == {0: 1_000, 1: 5_000, 2: None}
    weights = {(r["stage"], r["source"]): r["weight"] for r in rows}
    assert [weights[0, t] for t in TABLES] == [1.0, 0.0, 0.0]  # a table a stage leaves out weighs 0
    assert [weights[1, t] for t in TABLES] == [0.0, 0.5, 0.5]
    assert [weights[2, t] for t in TABLES] == [0.5, 0.3, 0.2]
    assert v.stage_at(999) == (0, {"refined.alpha": 1.0, "refined.beta": 0.0, "refined.gamma": 0.0})
    assert v.stage_at(1_000)[0] == 1 and v.stage_at(5_000) == (2, v.spec.weights)


def test_lineage_row_points_at_every_pin_and_the_tokenizer(mix_lake):
    v, _ = register_mix_version(mix_lake, spec("versions_lineage"), extra_upstream=["synthetic/batch@1"])
    (row,) = lineage_of(mix_lake, "mix/versions_lineage@v1")
    assert row.kind == "mix_version" and row.name == "mix/versions_lineage" and row.content_hash == v.plan_hash
    pins = sorted(f"{t}@{p.snapshot_id}" for t, p in v.pins.items())
    assert row.upstream == pins + [latest_tokenizer(mix_lake, "default").version_id, "synthetic/batch@1"]
    assert row.metadata["weights"] == v.spec.weights
    assert row.metadata["token_estimate"] == sum(p.token_estimate for p in v.pins.values())


def test_unchanged_plan_commits_nothing(mix_lake):
    first, _ = register_mix_version(mix_lake, spec("versions_same"))
    snapshot = versions_snapshot(mix_lake)
    again, created = register_mix_version(mix_lake, spec("versions_same"))
    assert not created and again == first
    assert versions_snapshot(mix_lake) == snapshot, "an unchanged plan committed to mixes.versions"
    assert len(lineage_of(mix_lake, "mix/versions_same@v1")) == 1
    assert [x.version for x in mix_versions(mix_lake, "versions_same")] == [1]


def test_new_weight_makes_v2(mix_lake):
    v1, _ = register_mix_version(mix_lake, spec("versions_reweighted"))
    reweighted = [{"table": "refined.alpha", "weight": 0.4}, {"table": "refined.beta", "weight": 0.4},
                  {"table": "refined.gamma", "weight": 0.2}]
    v2, created = register_mix_version(mix_lake, spec("versions_reweighted", sources=reweighted))
    assert created and v2.version == 2 and v2.plan_hash != v1.plan_hash
    assert {t: p.snapshot_id for t, p in v2.pins.items()} == {t: p.snapshot_id for t, p in v1.pins.items()}
    rows = stored_rows(mix_lake, "versions_reweighted")
    assert [(r["version"], r["weight"]) for r in rows] == [(1, 0.5), (1, 0.3), (1, 0.2), (2, 0.4), (2, 0.4), (2, 0.2)]
    assert get_version(mix_lake, "versions_reweighted") == v2
    assert get_version(mix_lake, "versions_reweighted@v1").spec.weights["refined.alpha"] == 0.5


def test_new_snapshot_makes_a_new_version(lake, corpus, documents):
    fresh_lake(lake, corpus, documents)
    v1, _ = register_mix_version(lake, pair("grow"))
    beta = lake.current_snapshot_id("refined.beta")
    extra = documents("refined.alpha")[20:26]
    new_snapshot = corpus.write(lake, "refined.alpha", extra)
    v2, created = register_mix_version(lake, pair("grow"))
    assert created and v2.version == 2
    assert v2.pins["refined.alpha"].snapshot_id == new_snapshot != v1.pins["refined.alpha"].snapshot_id
    assert v2.pins["refined.alpha"].rows == v1.pins["refined.alpha"].rows + len(extra)
    assert v2.pins["refined.beta"].snapshot_id == v1.pins["refined.beta"].snapshot_id == beta
    (row,) = lineage_of(lake, "mix/grow@v2")
    assert f"refined.alpha@{new_snapshot}" in row.upstream
    assert f"refined.alpha@{v1.pins['refined.alpha'].snapshot_id}" not in row.upstream
    assert get_version(lake, "grow@v1") == v1  # the old version still reads its old pins


# -- lookups and checks --------------------------------------------------------------------------

def test_get_version_by_id_and_name(mix_lake):
    v = get_version(mix_lake, "trio@v1")
    assert v.version_id == "mix/trio@v1"
    assert get_version(mix_lake, "mix/trio@v1") == v
    assert get_version(mix_lake, "trio") == latest_version(mix_lake, "trio") == mix_versions(mix_lake, "trio")[-1]


def test_get_version_errors_name_the_mix(mix_lake):
    with pytest.raises(MixError, match="'versions_unknown' has no registered version"):
        get_version(mix_lake, "versions_unknown")
    with pytest.raises(MixError, match=r"'trio' has no version 9 \(versions 1\.\."):
        get_version(mix_lake, "mix/trio@v9")
    assert mix_versions(mix_lake, "versions_unknown") == [] and latest_version(mix_lake, "versions_unknown") is None


def test_version_problems(mix_lake):
    v = get_version(mix_lake, "trio@v1")
    assert version_problems(mix_lake, v) == {"weights_sum_to_one": [], "pinned_snapshots_exist": [],
                                             "no_empty_source": []}
    alpha = v.pins["refined.alpha"]
    broken = v.model_copy(update={"pins": {**v.pins, "refined.alpha": alpha.model_copy(update={"snapshot_id": 12345}),
                                           "refined.beta": v.pins["refined.beta"].model_copy(update={"train_rows": 0})}})
    problems = version_problems(mix_lake, broken)
    assert problems["pinned_snapshots_exist"] == ["refined.alpha@12345 no longer exists"]
    assert problems["no_empty_source"] == [f"refined.beta@{v.pins['refined.beta'].snapshot_id} has no training rows"]
    assert problems["weights_sum_to_one"] == []


# -- bad inputs: a clear error naming the input, nothing committed ------------------------------

def test_missing_table(mix_lake):
    snapshot = versions_snapshot(mix_lake)
    bad = spec("versions_missing", sources=[{"table": "refined.alpha", "weight": 0.5},
                                            {"table": "refined.nope", "weight": 0.5}])
    with pytest.raises(MixError, match=r"mix versions_missing: source refined\.nope does not exist"):
        register_mix_version(mix_lake, bad)
    assert versions_snapshot(mix_lake) == snapshot and mix_versions(mix_lake, "versions_missing") == []


def test_untrained_tokenizer(mix_lake):
    snapshot = versions_snapshot(mix_lake)
    with pytest.raises(MixError, match="mix versions_tok: no tokenizer named 'nope'"):
        register_mix_version(mix_lake, spec("versions_tok", tokenizer="nope"))
    assert versions_snapshot(mix_lake) == snapshot and not lineage_of(mix_lake, "mix/versions_tok@v1")


@pytest.mark.parametrize("sources, words", [
    ([("refined.alpha", 0.5), ("refined.beta", 0.4)], ["weights sum to 0.9, not 1"]),
    ([("refined.alpha", 1.1), ("refined.beta", -0.1)], ["weight", ">= 0", "-0.1"]),
    ([("refined.alpha", float("nan")), ("refined.beta", 1.0)], ["weight", "finite"]),
    ([("refined.alpha", 0.5), ("refined.alpha", 0.5)], ["listed twice"]),
    ([("alpha", 1.0)], ["needs a namespace", "refined.alpha"]),
    ([], ["sources is empty"]),
])
def test_bad_weights_and_sources_fail_validation(sources, words):
    with pytest.raises(ValidationError) as e:
        spec("versions_bad", sources=[{"table": t, "weight": w} for t, w in sources])
    for word in words:
        assert word in str(e.value)


def test_stage_naming_a_table_not_in_sources():
    with pytest.raises(ValidationError, match=r"stages\[0\] names tables not in sources: \['refined\.nope'\]"):
        spec("versions_bad", stages=[{"until_tokens": 10, "weights": {"refined.nope": 1.0}}])
    with pytest.raises(ValidationError, match=r"stages\[1\]\.until_tokens must increase"):
        spec("versions_bad", stages=[{"until_tokens": 10, "weights": {"refined.alpha": 1.0}},
                                     {"until_tokens": 10, "weights": {"refined.alpha": 1.0}}])
    with pytest.raises(ValidationError, match=r"stages\[0\]: weights sum to 0\.5"):
        spec("versions_bad", stages=[{"until_tokens": 10, "weights": {"refined.alpha": 0.5}}])


def test_empty_source(lake, corpus, documents):
    fresh_lake(lake, corpus, documents)
    corpus.write(lake, "refined.empty", [])
    bad = spec("hollow", sources=[{"table": "refined.alpha", "weight": 0.5}, {"table": "refined.empty", "weight": 0.5}])
    with pytest.raises(MixError, match=r"mix hollow: source refined\.empty is empty at snapshot \d+"):
        register_mix_version(lake, bad)
    assert not lake.has_table(MIX_VERSIONS_TABLE) and not lineage_of(lake, "mix/hollow@v1")


def test_never_written_source(lake, corpus, documents):
    """A table that exists with no snapshot at all: a mix error naming the table."""
    fresh_lake(lake, corpus, documents)
    lake.ensure_table("refined.unwritten", REFINED_DOCUMENTS)
    bad = spec("unwritten", sources=[{"table": "refined.unwritten", "weight": 1.0}])
    with pytest.raises(MixError, match=r"source refined\.unwritten: table refined\.unwritten has no snapshot"):
        register_mix_version(lake, bad)
    assert not lake.has_table(MIX_VERSIONS_TABLE)


def test_all_heldout_source(mix_lake, documents):
    snapshot = versions_snapshot(mix_lake)
    rows = len(documents("refined.alpha"))
    with pytest.raises(MixError, match=rf"mix versions_held: source refined\.alpha has {rows} rows, all in the held-out"):
        register_mix_version(mix_lake, spec("versions_held", heldout_fraction=0.999999))
    assert versions_snapshot(mix_lake) == snapshot


# -- YAML specs ----------------------------------------------------------------------------------

def test_load_spec_names_the_file(tmp_path):
    good = tmp_path / "from_yaml.yaml"
    good.write_text("seq_len: 64\nsources:\n  - {table: refined.alpha, weight: 0.75}\n"
                    "  - {table: refined.beta, weight: 0.25, max_epochs: 2}\n")
    loaded = load_spec(good)
    assert loaded.name == "from_yaml" and loaded.weights == {"refined.alpha": 0.75, "refined.beta": 0.25}
    assert loaded.sources[1].max_epochs == 2 and loaded.seq_len == 64

    bad_sum = tmp_path / "bad_sum.yaml"
    bad_sum.write_text("sources:\n  - {table: refined.alpha, weight: 0.5}\n  - {table: refined.beta, weight: 0.4}\n")
    with pytest.raises(MixError) as e:
        load_spec(bad_sum)
    assert str(bad_sum) in str(e.value) and "weights sum to 0.9, not 1" in str(e.value)
    assert "refined.alpha" in str(e.value) and "refined.beta" in str(e.value)

    negative = tmp_path / "negative.yaml"
    negative.write_text("sources:\n  - {table: refined.alpha, weight: 1.5}\n  - {table: refined.beta, weight: -0.5}\n")
    with pytest.raises(MixError, match=r"negative\.yaml: sources\.1\.weight: .*got -0\.5"):
        load_spec(negative)

    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(MixError, match=r"list\.yaml: expected a mapping"):
        load_spec(tmp_path / "list.yaml")
    with pytest.raises(MixError, match=r"absent\.yaml: cannot read it"):
        load_spec(tmp_path / "absent.yaml")
