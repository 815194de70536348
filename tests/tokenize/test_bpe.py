"""Byte-level BPE training (`factory.tokenize.bpe`) on small tables of real standard-library text
(built by the shared `corpus` fixture) in a tmp lake: determinism (same sample -> same bytes, same
directory; a rebuilt lake -> same tokenizer), special-token ids, byte-level round trips, bytes
per token, the artifact layout, the lineage row, loading through `transformers`,
`latest_tokenizer`, held-out documents never sampled, and the errors for empty or missing tables
and invalid configs.

Every test runs on both catalogs (`catalog`): a real pyiceberg `SqlCatalog` on sqlite, and an
Iceberg REST catalog over S3 on the session's SeaweedFS (loopback only); a few seconds on CPU.
The tokenizer artifact itself always lives under FACTORY_HOME.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from factory.data.split import is_heldout
from factory.home import artifacts_dir
from factory.lake import Lake, LakeError
from factory.lake.schemas import REFINED_DOCUMENTS
from factory.tokenize import (
    SPECIAL_TOKENS,
    TokenizerArtifact,
    TokenizerConfig,
    TokenizerError,
    latest_tokenizer,
    load_tokenizer,
    train_tokenizer,
)

PACKAGES = {"refined.code_a": ["json", "email"], "refined.code_b": ["asyncio"]}
CONFIG = TokenizerConfig(name="default", vocab_size=512, sources=list(PACKAGES), sample_bytes_per_source=200_000,
                         measure_bytes_per_source=50_000, heldout_fraction=0.1)
TEXT = "def naïve(x):\n\treturn f'{x} → ∑ 日本語 🐍🚀'  # tab, emoji, CJK\r\n\n    \u200b€\n"


pytestmark = pytest.mark.usefixtures("catalog")


def build_lake(lake: Lake, corpus) -> Lake:
    for table, packages in PACKAGES.items():
        corpus.write(lake, table, corpus.code(table, packages), chunks=3)
    return lake


@pytest.fixture(scope="module")
def trained_by_kind(tmp_path_factory, corpus) -> dict:
    """One trained lake per catalog kind for the module, built when a test first asks."""
    return {}


@pytest.fixture
def trained(trained_by_kind, catalog, tmp_path_factory, corpus) -> tuple[Lake, TokenizerArtifact]:
    if catalog.kind not in trained_by_kind:
        lake = build_lake(catalog.lake(tmp_path_factory.mktemp("bpe")), corpus)
        trained_by_kind[catalog.kind] = lake, train_tokenizer(lake, CONFIG)
    return trained_by_kind[catalog.kind]


def tokenizer_dirs(lake: Lake) -> set[str]:
    return {p.name for p in (artifacts_dir(lake.home) / "tokenizers").iterdir()}


# -- determinism ---------------------------------------------------------------------------------

def test_same_sample_gives_same_bytes_and_reuses_the_directory(trained):
    lake, first = trained
    before = tokenizer_dirs(lake)
    second = train_tokenizer(lake, CONFIG)
    assert second.content_hash == first.content_hash and second.version_id == first.version_id
    assert first.new and not second.new
    assert len([r for r in lake.lineage.records() if r.version_id == first.version_id]) == 1
    assert (second.sample_docs, second.sample_bytes) == (first.sample_docs, first.sample_bytes)
    assert second.path == first.path
    assert tokenizer_dirs(lake) == before, "a retraining with the same sample wrote another directory"
    assert hashlib.sha256(Path(first.file).read_bytes()).hexdigest() == first.content_hash


def test_rebuilt_lake_trains_the_same_tokenizer(trained, tmp_path, corpus, catalog):
    """Same documents, new snapshots and data-file names: the sample and the bytes do not move."""
    lake, first = trained
    rebuilt = train_tokenizer(build_lake(catalog.other().lake(tmp_path), corpus), CONFIG)
    assert rebuilt.sampled != first.sampled  # genuinely different snapshots
    assert rebuilt.sample_docs == first.sample_docs
    assert rebuilt.content_hash == first.content_hash and rebuilt.new  # new to that lake


# -- the tokenizer itself ------------------------------------------------------------------------

def test_special_tokens_have_ids_0_to_5_in_order(trained):
    _, art = trained
    assert art.special_ids == {role: i for i, role in enumerate(SPECIAL_TOKENS)}
    tok = load_tokenizer(art.path)
    assert [tok.id_to_token(i) for i in range(6)] == list(SPECIAL_TOKENS.values())
    assert art.vocab_size == tok.get_vocab_size() == CONFIG.vocab_size


def test_byte_level_round_trip(trained):
    _, art = trained
    tok = load_tokenizer(art.file)
    ids = tok.encode(TEXT).ids
    assert tok.decode(ids) == TEXT
    assert min(ids) >= len(SPECIAL_TOKENS)  # plain text never produces a special token
    assert len(ids) < len(TEXT.encode())  # merges were learned and used
    emoji = tok.encode("🐍").ids  # a rare character: at most its 4 bytes, never <unk>
    assert 1 <= len(emoji) <= 4 and tok.decode(emoji) == "🐍"


def test_bytes_per_token_per_source(trained):
    _, art = trained
    assert set(art.bytes_per_token) == set(CONFIG.sources)
    for table, bpt in art.bytes_per_token.items():
        assert 1.5 < bpt < 8, f"{table}: {bpt} bytes per token"


def test_sample_is_a_subsample_near_the_byte_target(trained, corpus):
    _, art = trained
    for table in CONFIG.sources:
        docs = corpus.code(table, PACKAGES[table])
        assert 0 < art.sample_docs[table] < len(docs)
        # whole documents are drawn, so the sample is near, not at, the target
        assert 0.3 * CONFIG.sample_bytes_per_source < art.sample_bytes[table] < 3 * CONFIG.sample_bytes_per_source


def test_loads_with_transformers_and_encodes_identically(trained):
    from transformers import PreTrainedTokenizerFast

    _, art = trained
    hf = PreTrainedTokenizerFast(tokenizer_file=art.file)
    assert hf.encode(TEXT, add_special_tokens=False) == load_tokenizer(art.path).encode(TEXT).ids
    assert hf.convert_tokens_to_ids(SPECIAL_TOKENS["eos"]) == 1
    assert len(hf) == CONFIG.vocab_size


# -- artifact, lineage, lookup -------------------------------------------------------------------

def test_artifact_directory(trained):
    lake, art = trained
    directory = Path(art.path)
    assert directory.parent == artifacts_dir(lake.home) / "tokenizers"
    assert directory.name == f"default-{art.content_hash[:12]}"
    assert art.version_id == f"tokenizer/default@{art.content_hash[:12]}"
    assert sorted(p.name for p in directory.iterdir()) == ["meta.json", "tokenizer.json"]
    assert not [p for p in directory.parent.iterdir() if ".tmp-" in p.name], "a temp directory was left behind"
    meta = json.loads((directory / "meta.json").read_text())
    assert meta["content_hash"] == art.content_hash
    assert meta["special_ids"] == art.special_ids
    assert meta["sampled"] == art.sampled


def test_lineage_points_at_the_sampled_snapshots(trained):
    lake, art = trained
    (row,) = [r for r in lake.lineage.records() if r.kind == "tokenizer" and r.version_id == art.version_id]
    assert row.name == "tokenizer/default" and row.content_hash == art.content_hash
    assert row.uri == Path(art.path).as_uri()
    assert row.upstream == sorted(f"{t}@{lake.current_snapshot_id(t)}" for t in CONFIG.sources)
    assert row.upstream == sorted(f"{t}@{s}" for t, s in art.sampled.items())
    assert TokenizerConfig.model_validate(row.config) == CONFIG


def test_latest_tokenizer(trained):
    lake, art = trained
    found = latest_tokenizer(lake, "default")
    assert (found.version_id, found.content_hash, found.path) == (art.version_id, art.content_hash, art.path)
    assert found.special_ids == art.special_ids and found.sampled == art.sampled
    with pytest.raises(TokenizerError, match="'nope'"):
        latest_tokenizer(lake, "nope")


def test_heldout_documents_are_never_sampled(trained, corpus):
    """With the whole table in reach (rate 1), the sample is exactly the training side of the split."""
    lake, _ = trained
    config = CONFIG.model_copy(update={"name": "half", "heldout_fraction": 0.5, "sample_bytes_per_source": 10**9})
    art = train_tokenizer(lake, config)
    for table in config.sources:
        docs = corpus.code(table, PACKAGES[table])
        train = [d for d in docs if not is_heldout(d["doc_id"], 0.5)]
        assert 0.25 * len(docs) < len(train) < 0.75 * len(docs)  # the check has held-out documents to catch
        assert art.sample_docs[table] == len(train)
        assert art.sample_bytes[table] == sum(d["bytes"] for d in train)


# -- errors --------------------------------------------------------------------------------------

def _no_tokenizer_written(lake: Lake) -> None:
    assert not [r for r in lake.lineage.records() if r.kind == "tokenizer"]
    assert not (artifacts_dir(lake.home) / "tokenizers").exists()


def test_empty_table_is_refused(lake, corpus):
    corpus.write(lake, "refined.empty", [])
    assert lake.current_snapshot_id("refined.empty") is not None
    with pytest.raises(TokenizerError, match=r"table refined\.empty is empty"):
        train_tokenizer(lake, CONFIG.model_copy(update={"sources": ["refined.empty"]}))
    _no_tokenizer_written(lake)


def test_never_written_table_is_refused(lake):
    lake.ensure_table("refined.unwritten", REFINED_DOCUMENTS)
    with pytest.raises(LakeError, match=r"refined\.unwritten has no snapshot"):
        train_tokenizer(lake, CONFIG.model_copy(update={"sources": ["refined.unwritten"]}))
    _no_tokenizer_written(lake)


def test_missing_table_is_refused(lake):
    with pytest.raises(LakeError, match=r"refined\.missing does not exist"):
        train_tokenizer(lake, CONFIG.model_copy(update={"sources": ["refined.missing"]}))
    _no_tokenizer_written(lake)


def test_all_heldout_table_gives_an_empty_sample(lake, corpus):
    docs = corpus.code("refined.code_b", PACKAGES["refined.code_b"])[:3]
    assert all(is_heldout(d["doc_id"], 0.999) for d in docs)
    corpus.write(lake, "refined.small", docs)
    with pytest.raises(TokenizerError, match="the sample is empty"):
        train_tokenizer(lake, CONFIG.model_copy(update={"sources": ["refined.small"], "heldout_fraction": 0.999}))
    _no_tokenizer_written(lake)


@pytest.mark.parametrize("overrides, words", [
    ({"vocab_size": 100}, ["vocab_size", "262"]),
    ({"special_tokens": {"bos": "<b>", "pad": "<p>"}}, ["special_tokens", "eos"]),
    ({"special_tokens": {"bos": "<x>", "eos": "<x>", "pad": "<p>"}}, ["special_tokens", "share"]),
    ({"sources": []}, ["sources", "at least one"]),
    ({"sources": ["refined.a", "refined.a"]}, ["sources", "twice"]),
    ({"heldout_fraction": 1.0}, ["heldout_fraction"]),
    ({"vocab": 512}, ["vocab", "Extra inputs"]),
])
def test_config_validation(overrides, words):
    with pytest.raises(ValidationError) as e:
        TokenizerConfig.model_validate({"sources": ["refined.a"], **overrides})
    for word in words:
        assert word in str(e.value)
