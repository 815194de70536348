"""The per-document text functions behind the refinement steps (`factory.data.refine.text`):
normalization (BOM, line endings, NFC), the binary-garbage measure, word-token and shingle hashes,
MinHash signatures and LSH bands — deterministic across processes and hash seeds — and the exact
vs estimated Jaccard the near-dedup step relies on.

Unit tier: pure Python + numpy, no Spark; runs on CPU in a few seconds.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import zlib

import numpy as np
import pytest

from factory.data.refine import text as T
from factory.data.refine.config import NearDedupConfig


def words(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(n)]


# -- normalize -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw, expected",
    [
        ("\ufeffdef f():\r\n    return 1\r\n", "def f():\n    return 1\n"),  # BOM + CRLF
        ("old\rmac\rlines", "old\nmac\nlines"),  # bare CR
        ("caf\u0065\u0301", "caf\u00e9"),  # e + combining acute -> é (NFC)
        ("\ufeff\ufeffx", "x"),  # every leading BOM goes
        ("a\ufeffb", "a\ufeffb"),  # a BOM inside the text is a zero-width no-break space: kept
        ("plain\n", "plain\n"),
    ],
)
def test_normalize_text(raw, expected):
    assert T.normalize_text(raw) == expected
    assert T.normalize_text(expected) == expected  # idempotent


def test_control_fraction_counts_nul_control_and_replacement_chars_not_whitespace():
    assert T.control_fraction("") == 0.0
    assert T.control_fraction("a\tb\nc\fd\ve") == 0.0  # tab, newline, form feed, vertical tab are text
    assert T.control_fraction("ab\x00\x01") == 0.5
    assert T.control_fraction("\ufffd" * 3 + "a") == 0.75
    garbage = bytes(random.Random(0).randrange(0, 32) for _ in range(1000)).decode("latin-1")
    assert T.control_fraction(garbage) > 0.8


@pytest.mark.parametrize("text", ["", "x = 1  # ok\n\tdef f(a_b): return a_b.c9\n", "\x00\x0b\x0c\r\x1f\x7f", "é\x07ünï_côdé 9 ²\ufffd",
                                  "naïve café, ǅungla ⅓ x²\n" * 3])
def test_fast_counts_agree_with_their_plain_definitions(text):
    """The translate paths (ASCII text) and the fallbacks (any other) give what a loop per character
    and the `\\w+` regex give: the quality rules' thresholds compare the very same numbers."""
    bad = sum(1 for c in text if (c < " " and c not in "\t\n\f\v") or c == "\ufffd")
    assert T.control_fraction(text) == (bad / len(text) if text else 0.0)
    assert T.alnum_count(text) == sum(c.isalnum() for c in text)
    tokens = [t.decode() if isinstance(t, bytes) else t for t in T.word_tokens(text)]
    assert tokens == T.WORD.findall(text)


def test_content_kind_by_language():
    assert [T.content_kind(lang) for lang in ("python", "c", "rust", "sql")] == ["code"] * 4
    assert [T.content_kind(lang) for lang in ("markdown", "text", "rst", "json")] == ["prose"] * 4


# -- hashes --------------------------------------------------------------------------------------
def test_token_hashes_are_crc32_of_lowercased_word_tokens():
    hashes = T.token_hashes("Hello, WORLD_1 x!")
    assert hashes.dtype == np.uint64
    assert hashes.tolist() == [zlib.crc32(b"hello"), zlib.crc32(b"world_1"), zlib.crc32(b"x")]
    assert len(T.token_hashes("  ...  !! ")) == 0


def test_ngram_hashes_count_order_and_shortfall():
    tokens = T.token_hashes("a b c d e f")
    assert len(T.ngram_hashes(tokens, 5)) == 2
    assert len(T.ngram_hashes(tokens, 6)) == 1
    assert len(T.ngram_hashes(tokens, 7)) == 0  # fewer tokens than n: no n-grams at all
    # order matters: the same tokens in another order are another shingle
    assert T.ngram_hashes(T.token_hashes("a b c"), 3)[0] != T.ngram_hashes(T.token_hashes("c b a"), 3)[0]
    # a shingle hashes the same wherever it occurs
    assert T.ngram_hashes(T.token_hashes("x a b c"), 3)[1] == T.ngram_hashes(T.token_hashes("a b c y"), 3)[0]


def test_permutations_are_seeded():
    a1, b1 = T.permutations(126, seed=1)
    a2, b2 = T.permutations(126, seed=1)
    a3, _ = T.permutations(126, seed=2)
    assert len(a1) == len(b1) == 126 and (a1 >= 1).all()
    assert (a1 == a2).all() and (b1 == b2).all()
    assert not (a1 == a3).all()


# -- MinHash -------------------------------------------------------------------------------------
def test_minhash_none_without_words_and_short_documents_are_one_shingle():
    a, b = T.permutations(12, seed=1)
    assert T.minhash("", 5, a, b) is None
    assert T.minhash("!!! ---", 5, a, b) is None
    short = T.minhash("only three words", 5, a, b)
    assert short is not None and len(short) == 12
    # the one shingle of all three words: the same as 3-word shingling of the same text
    assert (short == T.minhash("only three words", 3, a, b)).all()


def test_minhash_ignores_case_and_punctuation_and_block_size():
    a, b = T.permutations(60, seed=3)
    text = " ".join(words(300, seed=1))
    sig = T.minhash(text, 5, a, b)
    assert (sig == T.minhash(text.upper().replace(" ", " , "), 5, a, b)).all()
    assert (sig == T.minhash(text, 5, a, b, block=7)).all()  # bounded-memory blocks change nothing


def test_hash_functions_pick_different_minimum_shingles():
    """Each of the 126 functions must act like its own permutation: if most share an argmin, the
    signature holds a handful of independent values and near-dedup misses or invents pairs."""
    a, b = T.permutations(126, seed=1)
    x = np.unique(T.ngram_hashes(T.token_hashes(" ".join(words(304, seed=9))), 5) & np.uint64(0xFFFFFFFF))
    with np.errstate(over="ignore"):
        argmins = ((a[:, None] * x[None, :] + b[:, None]) % T.MERSENNE).argmin(axis=1)
    assert len(x) == 300
    assert len(set(argmins.tolist())) > 80  # ~103 expected for independent functions; was 10


def test_band_hashes_are_signed_longs_one_per_band():
    config = NearDedupConfig()
    a, b = T.permutations(config.permutations, config.seed)
    sig = T.minhash(" ".join(words(200, seed=2)), 5, a, b)
    bands = T.band_hashes(sig, config.bands, config.rows)
    assert len(bands) == 21 and len(set(bands)) == 21
    assert all(-(1 << 63) <= h < (1 << 63) for h in bands)
    # the same rows in another band hash differently (the band index is in the hash)
    twice = np.concatenate([sig[:6], sig[:6]])
    first, second = T.band_hashes(twice, 2, 6)
    assert first != second


def test_signatures_and_bands_are_identical_in_another_process_with_another_hash_seed():
    """Dedup must not depend on which executor hashed a document: Python's `hash` is salted per
    process, crc32 + fixed mixing are not."""
    text = " ".join(words(120, seed=4))
    code = (
        "import sys, json; from factory.data.refine import text as T\n"
        "a, b = T.permutations(126, 1); s = T.minhash(sys.stdin.read(), 5, a, b)\n"
        "print(json.dumps([s.tolist(), T.band_hashes(s, 21, 6)]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], input=text, capture_output=True, text=True, env=env,
                         check=True).stdout
    a, b = T.permutations(126, 1)
    sig = T.minhash(text, 5, a, b)
    assert json.loads(out) == [sig.tolist(), T.band_hashes(sig, 21, 6)]


# -- Jaccard -------------------------------------------------------------------------------------
def test_exact_jaccard_on_hand_built_pairs():
    base = words(104, seed=5)  # 100 five-word shingles
    assert T.exact_jaccard(" ".join(base), " ".join(base), 5) == 1.0
    assert T.exact_jaccard(" ".join(base), " ".join(words(104, seed=6)), 5) == 0.0
    changed = list(base)
    changed[50] = "zzzzzzzz"  # touches shingles 46..50: 95 shared of 105
    assert T.exact_jaccard(" ".join(base), " ".join(changed), 5) == pytest.approx(95 / 105)
    assert T.exact_jaccard("", "", 5) == 1.0


@pytest.mark.parametrize("replaced", [3, 10, 20])
def test_estimated_jaccard_tracks_exact_jaccard(replaced):
    """126 independent permutations: standard error <= 0.045, so 4 sigma < 0.18, and the mean of
    20 pairs within 0.04."""
    a, b = T.permutations(126, seed=1)
    errors = []
    for seed in range(20):
        base = words(300, seed=100 + seed)
        rng = random.Random(seed)
        near = list(base)
        for slot in rng.sample(range(1, 59), replaced):
            near[slot * 5 + 2] = "replaced" + str(slot)
        exact = T.exact_jaccard(" ".join(base), " ".join(near), 5)
        sa, sb = T.minhash(" ".join(base), 5, a, b), T.minhash(" ".join(near), 5, a, b)
        errors.append(T.estimated_jaccard(sa.tobytes(), sb.tobytes()) - exact)
    assert max(abs(e) for e in errors) < 0.18
    assert abs(sum(errors) / len(errors)) < 0.04


def test_division_free_mod_matches_the_reference_including_the_fallback(monkeypatch):
    """minhash folds (a*x + b) mod 2^64 onto 61 bits instead of dividing; a block whose fold lands
    in [p, p+7] must fall back to the division, so signatures equal the plain formula."""
    import factory.data.refine.text as text_module

    def reference(text, a, b):
        tokens = text_module.token_hashes(text)
        shingles = np.unique(text_module.ngram_hashes(tokens, min(5, len(tokens))) & np.uint64(0xFFFFFFFF))
        with np.errstate(over="ignore"):
            return ((a[:, None] * shingles[None, :] + b[:, None]) % text_module.MERSENNE).min(axis=1)

    a, b = text_module.permutations(64, seed=3)
    doc = " ".join(f"w{i % 97}" for i in range(500))
    assert np.array_equal(text_module.minhash(doc, 5, a, b), reference(doc, a, b))

    # a = 1, b = p and a shingle hash of 0 give a*x + b = p exactly: the fold yields p, not 0.
    p = text_module.MERSENNE
    monkeypatch.setattr(text_module, "ngram_hashes", lambda tokens, n: np.zeros(1, dtype=np.uint64))
    edge = text_module.minhash("anything", 5, np.array([1], dtype=np.uint64), np.array([p], dtype=np.uint64))
    assert edge.tolist() == [0]
