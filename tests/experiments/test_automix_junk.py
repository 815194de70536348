"""The auto-mixer's designed case: junk documents made from the corpus (`factory.data.junk`) and a
fit that must leave them out. Covers: `shuffle_words` and `shuffle_characters` are deterministic
and really junk (same words or characters, same whitespace skeleton, same bytes, another order; a
document of one repeated word or character is refused and counted by reason);
`foreign_characters` moves them into the Cyrillic block; `uniform_words` (`uniform_tokens`)
replaces every word (token) by a type of the sources drawn uniformly (deterministic, same
whitespace skeleton or token count, only types seen twice); `repeated_line` repeats a document's
first line, `repeated_word` its first word, `reversed_words` reverses its words over the same layout; `build_junk_table` writes `junk.repeated_line` (the designed case's) with lineage to the
pinned source snapshots and no held-out source document, is idempotent, and mix
`default_with_junk` (its YAML validates) registers over it; `junk.uniform_words` draws no word only
held-out documents have; on synthetic proxies where one table only displaces the useful ones, RegMix's
proposal gives it a small weight and beats the uniform mix in truth; the `automix_junk` sweep
scores proxies on the real sources only, and `automix_junk_code` (mix `code_with_junk`) on its one
real source. CPU only: numpy for the fit, a sqlite lake
(`build_training_lake`, ~3 s) for the table. No training (bench/automix_bench.py trains).
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
import numpy as np

from configs.evals import suite
from configs.mixes import mix_spec
from factory.data.junk import (CYRILLIC, JunkConfig, build_junk_table, foreign_characters, junk_rows,
                               repeated_line, repeated_word, reversed_words, shuffle_characters, shuffle_words, token_types, uniform_tokens,
                               uniform_words, word_types)
from factory.data.split import is_heldout
from factory.experiments.automix import ProxyResult, fit, propose
from factory.experiments.sweep import Dirichlet, expand
from factory.lake.scan import pin_snapshot, stream_snapshot
from factory.mix import register_mix_version

CODE = "def area(radius):\n    \"\"\"Area of a circle.\"\"\"\n    return 3.14159 * radius ** 2\n\n\nprint(area(2))\n"
REAL = ("refined.python_stdlib", "refined.site_packages", "refined.package_docs")
JUNK = "junk.repeated_line"  # what mix default_with_junk names
COLUMNS = ["doc_id", "source", "path", "text"]


def _skeleton(text: str) -> list[str]:
    return re.findall(r"\s+", text)


def test_shuffled_words_are_the_same_words_in_another_order_on_the_same_layout():
    junk = shuffle_words(CODE, "doc-1")
    assert junk == shuffle_words(CODE, "doc-1")  # deterministic
    assert junk != CODE and junk.split() != CODE.split()  # another order
    assert Counter(junk.split()) == Counter(CODE.split())  # the same multiset of words
    assert _skeleton(junk) == _skeleton(CODE) and len(junk.encode()) == len(CODE.encode())  # same layout and bytes
    assert shuffle_words(CODE, "doc-2") != junk  # the key seeds the permutation
    # a permutation can come out as the identity (2 words: half the time): it is rotated, never kept
    assert all(shuffle_words("alpha beta", f"k{i}") == "beta alpha" for i in range(8))
    assert shuffle_words("spam spam\nspam", "k") is None and shuffle_words("", "k") is None


def test_shuffled_characters_keep_the_characters_and_layout_but_not_the_words():
    junk = shuffle_characters(CODE, "doc-1")
    assert junk == shuffle_characters(CODE, "doc-1") and junk != shuffle_characters(CODE, "doc-2")
    assert Counter(junk) == Counter(CODE) and _skeleton(junk) == _skeleton(CODE)  # same characters, same layout
    assert [len(w) for w in junk.split()] == [len(w) for w in CODE.split()]  # words keep their lengths...
    assert len(set(junk.split()) & set(CODE.split())) <= 2  # ...but hardly one keeps its spelling
    assert shuffle_characters("aa \n a", "k") is None


def _foreign(text: str) -> str:
    return "".join(c if c.isspace() else chr(CYRILLIC + ord(c) % 64) for c in text)


def test_foreign_characters_are_the_shuffled_characters_in_a_script_the_corpus_lacks():
    junk = foreign_characters(CODE, "doc-1")
    assert junk == _foreign(shuffle_characters(CODE, "doc-1")) and junk == foreign_characters(CODE, "doc-1")
    assert Counter(junk) == Counter(_foreign(CODE)) and _skeleton(junk) == _skeleton(CODE)
    assert all("\u0410" <= c <= "\u044f" for c in junk if not c.isspace())  # nothing of the corpus's alphabet
    assert foreign_characters("aa \n a", "k") is None


def test_uniform_words_draws_the_corpus_word_types_over_the_same_layout():
    types = word_types([{"text": CODE}, {"text": CODE + " zeta"}])
    assert types == tuple(sorted(set(CODE.split()))) and "zeta" not in types  # seen twice, sorted
    assert types == word_types([{"text": CODE + " zeta"}, {"text": CODE}])  # order-independent
    assert word_types([{"text": "b a\nc a"}]) == ("a",)  # the only word seen twice
    assert word_types([{"text": CODE}], min_count=1) == tuple(sorted(set(CODE.split())))
    junk = uniform_words(CODE, "doc-1", types)
    assert junk == uniform_words(CODE, "doc-1", types) and junk != uniform_words(CODE, "doc-2", types)
    assert _skeleton(junk) == _skeleton(CODE) and len(junk.split()) == len(CODE.split())
    assert set(junk.split()) <= set(types) and junk != CODE
    many = Counter(uniform_words(" ".join(["w"] * 4000), "k", types).split())
    assert set(many) == set(types) and max(many.values()) < 2 * min(many.values())  # uniform over types
    assert uniform_words(" \n ", "k", types) is None and uniform_words(CODE, "k", ()) is None


class _Characters:
    """A stand-in tokenizer: one token per character (its code point)."""

    def encode(self, text, add_special_tokens=False):
        return type("Encoding", (), {"ids": [ord(c) for c in text]})()

    def encode_batch(self, texts, add_special_tokens=False):
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        return "".join(map(chr, ids))


def test_uniform_tokens_draw_the_corpus_token_types_as_many_as_the_document_has():
    tokenizer = _Characters()
    types = token_types([{"text": CODE}], tokenizer)
    assert types == tuple(sorted(ord(c) for c, n in Counter(CODE).items() if n >= 2))
    junk = uniform_tokens(CODE, "doc-1", tokenizer, types)
    assert junk == uniform_tokens(CODE, "doc-1", tokenizer, types) != uniform_tokens(CODE, "doc-2", tokenizer, types)
    assert len(junk) == len(CODE) and {ord(c) for c in junk} <= set(types)
    assert uniform_tokens("", "k", tokenizer, types) is None


def test_a_repeated_word_is_the_first_word_over_the_document_length():
    junk = repeated_word(CODE)
    first = CODE.split()[0]
    assert set(junk.split()) == {first} and len(junk) >= len(CODE) and junk == repeated_word(CODE)
    assert repeated_word(" \n\t ") is None and repeated_word("") is None


def test_a_repeated_line_is_the_first_line_over_the_document_length():
    junk = repeated_line(CODE)
    assert set(junk.splitlines()) == {"def area(radius):"} and len(CODE) <= len(junk) < len(CODE) + 19
    assert repeated_line("\n\n  x = 1\n") is None and repeated_line("") is None
    assert repeated_line("\n a\nb") == " a\n" * 2  # blank lines are skipped, the line is kept as it is


def test_reversed_words_are_the_same_words_backwards_on_the_same_layout():
    junk = reversed_words(CODE)
    assert junk == reversed_words(CODE, "any key")  # deterministic, no key needed
    assert junk.split() == CODE.split()[::-1] and _skeleton(junk) == _skeleton(CODE)
    assert len(junk.encode()) == len(CODE.encode()) and reversed_words(junk) == CODE  # its own inverse
    assert reversed_words("a  b\nc") == "c  b\na"
    assert reversed_words("spam eggs spam") is None and reversed_words("pass") is None and reversed_words("") is None
    rows, skipped = junk_rows([{"doc_id": "a", "source": "s", "path": "x.py", "text": CODE, "bytes": len(CODE)},
                               {"doc_id": "b", "source": "s", "path": "y.py", "text": "x = x", "bytes": 5}],
                              JunkConfig(shuffle="reversed_words", sources=("refined.python_stdlib",)))
    assert [r["text"] for r in rows] == [junk] and skipped == {"palindrome_of_words": 1}


def test_junk_rows_hash_their_ids_and_count_what_cannot_be_shuffled():
    docs = [{"doc_id": "a", "source": "python_stdlib", "path": "x.py", "text": CODE, "bytes": len(CODE)},
            {"doc_id": "b", "source": "python_stdlib", "path": "y.py", "text": "pass", "bytes": 4}]
    config = JunkConfig(sources=("refined.python_stdlib",))
    rows, skipped = junk_rows(docs, config)
    assert skipped == {"too_few_distinct_words": 1} and len(rows) == 1  # "pass" is one word
    assert rows == junk_rows(docs, config)[0]
    assert rows[0]["doc_id"] != "a" and len(rows[0]["doc_id"]) == 24 and rows[0]["path"] == "shuffled:x.py"
    assert rows[0]["source"] == "junk/python_stdlib" and rows[0]["bytes"] == len(CODE.encode())
    assert junk_rows(docs, config.model_copy(update={"salt": "other"}))[0][0]["text"] != rows[0]["text"]
    by_characters, skipped = junk_rows(docs, config.model_copy(update={"shuffle": "characters"}))
    assert len(by_characters) == 2 and skipped == {"too_few_distinct_characters": 0}
    assert Counter(by_characters[0]["text"]) == Counter(CODE) and by_characters[0]["doc_id"] != rows[0]["doc_id"]
    drawn, skipped = junk_rows([*docs, {**docs[1], "doc_id": "c", "text": "\n"}],
                               config.model_copy(update={"shuffle": "uniform_words", "min_type_count": 1}))
    assert skipped == {"no_words": 1} and len(drawn) == 2  # types come from these documents only
    assert set(drawn[0]["text"].split()) <= set(CODE.split()) | {"pass"}


@pytest.mark.slow
def test_the_junk_table_has_lineage_no_heldout_source_document_and_builds_once(build_training_lake, tmp_path):
    lake = build_training_lake(tmp_path / "home")
    config = JunkConfig(name="repeated_line", shuffle="repeated_line", sources=REAL, max_docs_per_source=20,
                        heldout_fraction=0.25)
    lines: list[str] = []
    report = build_junk_table(lake, config, run_id="r1", log=lines.append)
    assert report.created and report.table == JUNK and 40 <= report.rows <= 60
    assert set(report.upstream) == set(REAL)
    assert sum(v for k, v in report.skipped.items() if k.startswith("heldout:")) > 0

    def read(table: str) -> list[dict]:
        return [r for b in stream_snapshot(lake, pin_snapshot(lake, table), COLUMNS) for r in b.to_pylist()]

    rows = read(JUNK)
    assert len(rows) == report.rows and all(r["path"].startswith("shuffled:") for r in rows)
    sources = [d for t in REAL for d in read(t)]
    by_place = {(f"junk/{d['source']}", f"shuffled:{d['path']}"): d for d in sources}
    originals = [by_place[(r["source"], r["path"])] for r in rows]
    assert not any(is_heldout(d["doc_id"], 0.25) for d in originals)
    assert all(r["text"] == repeated_line(d["text"]) for r, d in zip(rows, originals))

    record = next(r for r in lake.lineage.records() if r.version_id == report.version_id)
    assert record.run_id == "r1" and {u.rsplit("@", 1)[0] for u in record.upstream} == set(REAL)
    assert f"{JUNK}@{report.snapshot_id}" in lines[-1]

    snapshots = len(lake.table(JUNK).snapshots())
    again = build_junk_table(lake, config, log=lines.append)
    assert (again.created, again.snapshot_id) == (False, report.snapshot_id) and "unchanged" in lines[-1]
    assert len(lake.table(JUNK).snapshots()) == snapshots  # nothing committed

    spec = mix_spec("default_with_junk")
    assert list(spec.weights) == [*REAL, JUNK] and abs(sum(spec.weights.values()) - 1) < 1e-9
    version, created = register_mix_version(lake, spec)
    assert created and version.pins[JUNK].snapshot_id == report.snapshot_id and version.pins[JUNK].train_rows > 0

    words = build_junk_table(lake, config.model_copy(update={"name": "uniform_words", "shuffle": "uniform_words"}))
    rows = read(words.table)
    originals = [by_place[(r["source"], r["path"])] for r in rows]
    assert not any(is_heldout(d["doc_id"], 0.25) for d in originals)
    assert all(_skeleton(r["text"]) == _skeleton(d["text"]) for r, d in zip(rows, originals))
    drawn = {w for r in rows for w in r["text"].split()}
    assert drawn <= set(word_types(originals)) and len(drawn) > 50  # the sampled documents' types only
    heldout_only = ({w for d in sources if is_heldout(d["doc_id"], 0.25) for w in d["text"].split()}
                    - {w for d in sources if not is_heldout(d["doc_id"], 0.25) for w in d["text"].split()})
    assert heldout_only and not drawn & heldout_only


def test_the_proposal_gives_a_table_that_only_displaces_the_others_a_small_weight():
    """Truth: a quadratic in the real tables' renormalized shares, plus a penalty for the share the
    junk takes; 24 proxies from the sweep's own Dirichlet, with noise like a proxy's bits per byte."""
    tables = (*REAL, JUNK)
    optimum = np.array([0.4, 0.45, 0.15])

    def truth(W: np.ndarray) -> np.ndarray:
        W = np.atleast_2d(W)
        real = W[:, :3] / np.clip(W[:, :3].sum(axis=1, keepdims=True), 1e-9, None)
        return 2.0 + 0.5 * ((real - optimum) ** 2).sum(axis=1) + 0.6 * W[:, 3]

    rng, sampler = np.random.default_rng(0), Dirichlet(tables=tables)
    results = []
    for i in range(24):
        w = sampler.sample(rng)
        loss = float(truth(np.array([w[t] for t in tables]))[0] + rng.normal(0, 0.005))
        results.append(ProxyResult(run=f"automix_junk-{i:08x}", weights=w, loss=loss))
    regression = fit(results, tables)
    assert regression.quality.features == "quadratic" and regression.quality.loo_spearman > 0.8, regression.quality

    proposal = propose(results, tables)
    assert proposal.weights[JUNK] < 0.05, proposal.weights
    assert min(proposal.weights[t] for t in REAL) > proposal.weights[JUNK]
    w = np.array([proposal.weights[t] for t in tables])
    uniform = np.full(4, 0.25)
    assert truth(w)[0] < truth(uniform)[0] - 0.1 and proposal.predicted_loss < proposal.uniform_loss


def test_the_junk_sweep_ranks_proxies_on_the_real_sources_only():
    from configs.sweeps.automix_junk import automix_junk

    sweep = automix_junk()
    assert sweep.params["mix_weights"].tables == (*REAL, JUNK) and sweep.metric == "bpb/all"
    assert sweep.base.mix == "default_with_junk" and sweep.base.eval_suite == "heldout_default"
    (task,) = suite("heldout_default").tasks
    assert task.sources == REAL  # bpb/all is then the byte-weighted mean over these three


def test_the_reversed_junk_sweep_is_the_junk_sweep_over_its_own_mix():
    from configs.sweeps.automix_junk import automix_junk, automix_reversed

    sweep, junk = automix_reversed(), automix_junk()
    assert sweep.params["mix_weights"].tables == (*REAL, "junk.reversed_words")
    assert sweep.base.mix == "default_with_reversed_words" and sweep.base.eval_suite == "heldout_default"
    assert sweep.base.model == junk.base.model and sweep.base.optimizer == junk.base.optimizer
    assert sweep.base.steps == junk.base.steps and len(expand(sweep)) == len(expand(junk)) == 16
    spec, original = mix_spec("default_with_reversed_words"), mix_spec("default_with_junk")
    assert [(s.weight, s.max_doc_tokens, s.max_epochs) for s in spec.sources] == \
        [(s.weight, s.max_doc_tokens, s.max_epochs) for s in original.sources]


def test_the_one_source_junk_sweep_ranks_proxies_on_that_source_only():
    from configs.sweeps.automix_junk import automix_junk, automix_junk_code

    sweep = automix_junk_code()
    assert sweep.params["mix_weights"].tables == ("refined.site_packages", JUNK)
    assert sweep.base.mix == "code_with_junk" and sweep.base.eval_suite == "heldout_code"
    assert set(mix_spec("code_with_junk").weights) == {"refined.site_packages", JUNK}
    (task,) = suite("heldout_code").tasks
    assert task.sources == ("refined.site_packages",)
    assert len(expand(sweep)) == 8
    junk = automix_junk()  # the same proxies as the four-table case, on the same 512-token footing
    assert sweep.base.model == junk.base.model and sweep.base.optimizer == junk.base.optimizer
    assert sweep.base.steps == junk.base.steps and sweep.base.schedule == junk.base.schedule
    assert {s.max_doc_tokens for s in mix_spec("code_with_junk").sources} == \
        {s.max_doc_tokens for s in mix_spec("default_with_junk").sources} == {512}
