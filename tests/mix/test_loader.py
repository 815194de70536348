"""The streaming loader on a real lake (three tables of standard-library text, a trained BPE):
exact resume at the same world size, a 2 -> 1 world-size change, source proportions, live
version switches with exact accounting, curriculum stages, repetition caps, held-out documents
never streamed, and layout errors. Runs on CPU; the whole file takes a few seconds per test."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from conftest import spec

from factory.data.split import doc_hashes, heldout_mask
from factory.mix import (
    LoaderConfig,
    MixError,
    MixLoader,
    RepetitionCapReached,
    accounting,
    get_version,
    merge_states,
    register_mix_version,
)


def run(lake, ref, config, steps, world_size=1, state=None):
    """`steps` batches from every rank; returns (per-rank batches, merged state)."""
    loaders = [MixLoader(lake, ref, config, rank=r, world_size=world_size, state=state) for r in range(world_size)]
    try:
        batches = [[ld.next_batch() for _ in range(steps)] for ld in loaders]
        return batches, merge_states([ld.state_dict() for ld in loaders])
    finally:
        for ld in loaders:
            ld.close()


def rows(batches) -> list[bytes]:
    return [row.numpy().tobytes() for b in batches for row in b.tokens]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.slow
def test_resume_after_k_steps_is_bit_identical(mix_lake, workers):
    config = LoaderConfig(global_batch=16, num_shards=4, seed=7, num_workers=workers, prefetch=8)
    for world in (1, 2):
        whole, _ = run(mix_lake, "trio", config, 12, world)
        first, state = run(mix_lake, "trio", config, 5, world)
        rest, _ = run(mix_lake, "trio", config, 7, world, state=state)
        for rank in range(world):
            a = torch.cat([b.tokens for b in whole[rank]])
            b = torch.cat([b.tokens for b in first[rank] + rest[rank]])
            assert torch.equal(a, b), f"world {world} rank {rank}: resumed stream differs"
            assert [b.step for b in first[rank] + rest[rank]] == list(range(12))


def test_state_survives_a_checkpoint_file(mix_lake, tmp_path):
    """The state is plain data: torch.save / torch.load(weights_only=True) and JSON both keep it."""
    import json

    config = LoaderConfig(global_batch=8, num_shards=2, num_workers=1)
    whole, _ = run(mix_lake, "trio", config, 6)
    _, state = run(mix_lake, "trio", config, 3)
    torch.save({"loader": state}, tmp_path / "ckpt.pt")
    loaded = torch.load(tmp_path / "ckpt.pt", weights_only=True)["loader"]
    via_json = json.loads(json.dumps(loaded))
    for restored in (loaded, via_json):
        rest, _ = run(mix_lake, "trio", config, 3, state=restored)
        assert torch.equal(torch.cat([b.tokens for b in rest[0]]), torch.cat([b.tokens for b in whole[0][3:]]))


def test_world_size_change_consumes_the_same_documents(mix_lake):
    config = LoaderConfig(global_batch=16, num_shards=4, seed=3, num_workers=1)
    whole, whole_state = run(mix_lake, "trio", config, 10, world_size=2)
    before, state = run(mix_lake, "trio", config, 4, world_size=2)
    after, after_state = run(mix_lake, "trio", config, 6, world_size=1, state=state)
    uninterrupted = [b for rank in whole for b in rank]
    changed = [b for rank in before for b in rank] + after[0]
    docs = lambda bs: Counter(d for b in bs for ids in b.doc_ids for d in ids)  # noqa: E731
    assert docs(changed) == docs(uninterrupted)
    # stronger: the same sequences, only in another rank/row order
    assert sorted(rows(changed)) == sorted(rows(uninterrupted))
    assert accounting(after_state) == accounting(whole_state)
    assert after[0][0].step == 4 and after[0][0].tokens.shape[0] == 16


@pytest.mark.slow
def test_source_proportions_over_10000_sequences(mix_lake):
    config = LoaderConfig(global_batch=80, num_shards=8, seed=11, num_workers=1)
    batches, state = run(mix_lake, "trio", config, 125)
    sources = Counter(s for b in batches[0] for s in b.sources)
    assert sum(sources.values()) == 10_000
    weights = get_version(mix_lake, "trio").spec.weights
    for table, weight in weights.items():
        assert abs(sources[table] / 10_000 - weight) < 0.02, (table, sources[table], weight)
    counted = accounting(state)["versions"]["mix/trio@v1"]
    assert {t: c["sequences"] for t, c in counted.items()} == dict(sources)
    assert all(c["tokens"] == c["sequences"] * 33 for c in counted.values())


def test_rows_are_packed_documents_with_eos_between(mix_lake):
    batches, _ = run(mix_lake, "trio", LoaderConfig(global_batch=8, num_shards=8, num_workers=0), 3)
    version = get_version(mix_lake, "trio")
    from factory.tokenize import load_tokenizer

    tok = load_tokenizer(version.tokenizer_path)
    eos = tok.token_to_id("<|eos|>")
    stream = [b for b in batches[0]]
    assert all(b.tokens.shape == (8, 33) and b.tokens.dtype == torch.int64 for b in stream)
    # a row spanning several documents has an eos at each boundary
    multi = [(row, ids) for b in stream for row, ids in zip(b.tokens, b.doc_ids) if len(ids) > 1]
    assert all((row == eos).sum() >= len(ids) - 1 for row, ids in multi)


@pytest.mark.slow
def test_max_doc_tokens_streams_only_the_start_of_each_document(mix_lake, documents):
    """With `max_doc_tokens` a source streams the first N tokens of each document and then its eos,
    so the same tokens cover many more documents; the cut parts never reach a row."""
    from factory.tokenize import load_tokenizer

    config = LoaderConfig(global_batch=4, num_shards=1, num_workers=0)
    register_mix_version(mix_lake, spec("whole_gamma", sources=[{"table": "refined.gamma", "weight": 1.0}]))
    register_mix_version(mix_lake, spec("prefixes", sources=[{"table": "refined.gamma", "weight": 1.0,
                                                              "max_doc_tokens": 5}]))
    whole, _ = run(mix_lake, "whole_gamma", config, 6)
    batches, _ = run(mix_lake, "prefixes", config, 6)
    tok = load_tokenizer(get_version(mix_lake, "prefixes").tokenizer_path)
    eos = tok.token_to_id("<|eos|>")
    stream = torch.cat([row for b in batches[0] for row in b.tokens]).tolist()  # one shard: rows are consecutive
    pieces = [[]]
    for t in stream:
        pieces[-1].append(t)
        if t == eos:
            pieces.append([])
    complete = pieces[1:-1]  # the first and last may be cut by the stream's ends
    prefixes = {tuple(tok.encode(r["text"], add_special_tokens=False).ids[:5]) + (eos,)
                for r in documents("refined.gamma")}
    assert len(complete) > 100 and all(tuple(p) in prefixes for p in complete)
    assert {len(p) for p in complete} == {6}  # 5 tokens and the eos: every gamma document is longer
    docs = lambda bs: {d for b in bs for ids in b.doc_ids for d in ids}  # noqa: E731
    assert len(docs(batches[0])) > 2 * len(docs(whole[0]))


@pytest.mark.slow
def test_heldout_documents_are_never_streamed(mix_lake, documents):
    sources = [{"table": t, "weight": 1 / 3} for t in ("refined.alpha", "refined.beta", "refined.gamma")]
    register_mix_version(mix_lake, spec("heldout_half", heldout_fraction=0.3, seq_len=2048, sources=sources))
    config = LoaderConfig(global_batch=32, num_shards=2, num_workers=1)
    batches, state = run(mix_lake, "heldout_half", config, 40)
    seen = {d for b in batches[0] for ids in b.doc_ids for d in ids}
    assert min(accounting(state)["epochs"].values()) > 1  # every training document came by
    assert not heldout_mask(doc_hashes(sorted(seen)), 0.3).any()
    all_ids = [r["doc_id"] for t in ("refined.alpha", "refined.beta", "refined.gamma") for r in documents(t)]
    held = {d for d, h in zip(all_ids, heldout_mask(doc_hashes(all_ids), 0.3)) if h}
    assert held and not held & seen


def test_live_switch_at_a_step_boundary(mix_lake):
    only = lambda table: [{"table": t, "weight": float(t == table)} for t in  # noqa: E731
                          ("refined.alpha", "refined.beta", "refined.gamma")]
    v1, _ = register_mix_version(mix_lake, spec("live", sources=only("refined.alpha")))
    config = LoaderConfig(global_batch=8, num_shards=4, num_workers=1, follow=True, poll_every=1)
    loader = MixLoader(mix_lake, v1, config, run_id="run-live")
    try:
        before = [loader.next_batch() for _ in range(5)]
        v2, created = register_mix_version(mix_lake, spec("live", sources=only("refined.beta")))
        assert created and v2.version == 2
        after = [loader.next_batch() for _ in range(4)]
        state = loader.state_dict()
    finally:
        loader.close()
    assert {s for b in before for s in b.sources} == {"refined.alpha"}
    assert {b.version_id for b in before} == {"mix/live@v1"}
    assert {s for b in after for s in b.sources} == {"refined.beta"}
    assert {b.version_id for b in after} == {"mix/live@v2"} and after[0].step == 5
    assert state["history"] == [{"step": 5, "from": "mix/live@v1", "to": "mix/live@v2"}]
    counts = accounting(state)["versions"]
    assert counts["mix/live@v1"] == {"refined.alpha": {"sequences": 40, "tokens": 40 * 33}}
    assert counts["mix/live@v2"] == {"refined.beta": {"sequences": 32, "tokens": 32 * 33}}
    switch = [r for r in mix_lake.lineage.records() if r.kind == "mix_switch"]
    assert [(r.upstream, r.metadata["step"]) for r in switch] == [(["mix/live@v1", "mix/live@v2"], 5)]
    # resuming after the switch stays on v2, positions intact
    resumed = MixLoader(mix_lake, "live", config, state=state)
    try:
        assert resumed.next_batch().version_id == "mix/live@v2"
    finally:
        resumed.close()


def test_curriculum_stage_switches_by_tokens(mix_lake):
    stages = [{"until_tokens": 8 * 33 * 3, "weights": {"refined.alpha": 1.0}}]
    register_mix_version(mix_lake, spec("staged", stages=stages))
    batches, _ = run(mix_lake, "staged", LoaderConfig(global_batch=8, num_shards=2, num_workers=1), 8)
    assert [b.stage for b in batches[0]] == [0, 0, 0, 1, 1, 1, 1, 1]
    assert {s for b in batches[0][:3] for s in b.sources} == {"refined.alpha"}
    assert len({s for b in batches[0][3:] for s in b.sources}) > 1


@pytest.mark.parametrize("on_cap", ["error", "stop"])
def test_repetition_cap(mix_lake, on_cap):
    sources = [{"table": "refined.gamma", "weight": 1.0, "max_epochs": 1}]
    register_mix_version(mix_lake, spec(f"capped_{on_cap}", sources=sources, on_cap=on_cap))
    loader = MixLoader(mix_lake, f"capped_{on_cap}", LoaderConfig(global_batch=4, num_shards=1, num_workers=1))
    try:
        if on_cap == "error":
            with pytest.raises(RepetitionCapReached, match="refined.gamma reached its repetition cap"):
                for _ in range(10_000):
                    loader.next_batch()
        else:
            steps = sum(1 for _ in loader)  # ends cleanly
            assert 0 < steps < 10_000
            assert accounting(loader.state_dict())["epochs"]["refined.gamma"] <= 1.0
    finally:
        loader.close()


def test_new_snapshot_of_a_source_becomes_a_new_version(mix_lake, corpus, documents):
    """Appending to a table and re-registering pins the new snapshot; a follower picks it up."""
    rows = documents("refined.gamma")[:5]
    corpus.write(mix_lake, "refined.delta", rows)
    sources = [{"table": "refined.alpha", "weight": 0.1}, {"table": "refined.delta", "weight": 0.9}]
    v1, _ = register_mix_version(mix_lake, spec("growing", sources=sources, seq_len=1024))
    config = LoaderConfig(global_batch=8, num_shards=1, num_workers=0, follow=True, poll_every=2)
    loader = MixLoader(mix_lake, v1, config)
    try:
        batches = [loader.next_batch() for _ in range(3)]
        extra = [dict(r, doc_id=r["doc_id"][:-4] + "beef") for r in documents("refined.gamma")[5:]]
        corpus.write(mix_lake, "refined.delta", extra)
        v2, created = register_mix_version(mix_lake, spec("growing", sources=sources, seq_len=1024))
        assert created and v2.pins["refined.delta"].snapshot_id != v1.pins["refined.delta"].snapshot_id
        assert v2.pins["refined.delta"].train_rows > v1.pins["refined.delta"].train_rows
        batches += [loader.next_batch() for _ in range(27)]
    finally:
        loader.close()
    assert [b.version_id for b in batches[3:5]] == ["mix/growing@v1", "mix/growing@v2"]  # polled at step 4
    ids = {d for b in batches for ids in b.doc_ids for d in ids}
    assert len({r["doc_id"] for r in extra} & ids) > 5


def test_layout_and_state_errors(mix_lake):
    with pytest.raises(MixError, match="world size 3 must divide num_shards=8"):
        MixLoader(mix_lake, "trio", LoaderConfig(global_batch=8), world_size=3)
    with pytest.raises(MixError, match="must divide global_batch=12"):
        MixLoader(mix_lake, "trio", LoaderConfig(global_batch=12))
    _, state = run(mix_lake, "trio", LoaderConfig(global_batch=8, num_workers=0), 1)
    with pytest.raises(MixError, match="seed=0, the config says 5"):
        MixLoader(mix_lake, "trio", LoaderConfig(global_batch=8, seed=5), state=state)
    one_rank = MixLoader(mix_lake, "trio", LoaderConfig(global_batch=8, num_workers=0), rank=0, world_size=2)
    with one_rank:
        one_rank.next_batch()
        partial = one_rank.state_dict()
    with pytest.raises(MixError, match=r"no position for shards \[1, 3, 5, 7\].*merge_states"):
        MixLoader(mix_lake, "trio", LoaderConfig(global_batch=8, num_workers=0), state=partial)
    with pytest.raises(MixError, match="no registered version"):
        MixLoader(mix_lake, "nope", LoaderConfig(global_batch=8))
