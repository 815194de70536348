"""The deterministic document split (`factory.data.split`): held-out fractions over 20,000
synthetic doc ids, the nested property between fractions, logical shards in range and balanced,
`is_heldout` agreeing with the vectorised mask, independence from row order, a pinned golden hash
(so the split can never change silently) and the salt as part of the split's identity.

Pure numpy and hashlib: runs on CPU in well under a second, no lake needed.
"""

from __future__ import annotations

import numpy as np
import pytest

from factory.data.split import (
    DEFAULT_HELDOUT_FRACTION,
    SALT,
    doc_hashes,
    heldout_mask,
    is_heldout,
    shard_of,
)

N = 20_000
IDS = [f"doc-{i:06d}" for i in range(N)]


@pytest.fixture(scope="module")
def hashes() -> np.ndarray:
    return doc_hashes(IDS)


def test_hashes_are_one_uint64_per_id(hashes):
    assert hashes.dtype == np.uint64 and hashes.shape == (N,)
    assert len(np.unique(hashes)) == N  # 64-bit: no collisions among 20k ids
    assert doc_hashes([]).shape == (0,)


@pytest.mark.parametrize("fraction", [0.02, 0.1])
def test_heldout_fraction_is_close_to_the_requested_one(hashes, fraction):
    held = int(heldout_mask(hashes, fraction).sum())
    assert abs(held / N - fraction) <= 0.005, f"{held} of {N} held out at {fraction}"


def test_edge_fractions(hashes):
    assert heldout_mask(hashes, 0.0).sum() == 0
    assert heldout_mask(hashes, 1.0).sum() == N  # u is in [0, 1), so everything is under 1


def test_smaller_fraction_is_a_subset_of_a_larger_one(hashes):
    small, large = heldout_mask(hashes, 0.02), heldout_mask(hashes, 0.1)
    assert not np.any(small & ~large), "a document held out at 0.02 is trained on at 0.1"
    assert small.sum() < large.sum()


def test_shards_are_in_range_and_balanced(hashes):
    train = hashes[~heldout_mask(hashes, DEFAULT_HELDOUT_FRACTION)]
    for num_shards in (1, 8, 13):
        shards = shard_of(train, num_shards)
        assert shards.dtype == np.int64
        assert shards.min() >= 0 and shards.max() < num_shards
        counts = np.bincount(shards, minlength=num_shards)
        expected = len(train) / num_shards
        assert counts.min() > 0.9 * expected and counts.max() < 1.1 * expected, counts.tolist()


def test_shard_is_independent_of_the_heldout_draw(hashes):
    """Shards use the low bits, the split the high bits: held-out documents spread over every shard."""
    held = heldout_mask(hashes, 0.1)
    counts = np.bincount(shard_of(hashes[held], 8), minlength=8)
    assert counts.min() > 0.75 * held.sum() / 8, counts.tolist()


def test_is_heldout_agrees_with_the_mask(hashes):
    for fraction in (0.02, 0.1):
        mask = heldout_mask(hashes[:3000], fraction)
        one_by_one = np.array([is_heldout(d, fraction) for d in IDS[:3000]])
        assert np.array_equal(mask, one_by_one)
        assert mask.sum() > 0  # the comparison covers both outcomes
    assert is_heldout(IDS[0]) == bool(heldout_mask(hashes[:1], DEFAULT_HELDOUT_FRACTION)[0])


def test_split_does_not_depend_on_row_order(hashes):
    order = np.random.default_rng(0).permutation(N)
    shuffled = doc_hashes([IDS[i] for i in order])
    assert np.array_equal(shuffled, hashes[order])


def test_golden_value_pins_the_split():
    """If this fails, every held-out set and shard assignment in every mix version has moved."""
    assert SALT == "factory-split-v1"
    (h,) = doc_hashes(["abc"])
    assert int(h) == 13143300168386765874
    assert int(shard_of(doc_hashes(["abc"]), 8)[0]) == 13143300168386765874 % (1 << 32) % 8
    u = (13143300168386765874 >> 32) / 2**32  # 0.7125...: trained on below 0.71, held out above
    assert 0.712 < u < 0.713
    assert not is_heldout("abc", 0.7) and is_heldout("abc", 0.72)


def test_salt_changes_the_split(hashes):
    other = doc_hashes(IDS, salt="another-salt")
    assert not np.any(other == hashes)
    a, b = heldout_mask(hashes, 0.1), heldout_mask(other, 0.1)
    overlap = int((a & b).sum())
    # independent draws overlap in ~1% of documents (0.1 * 0.1), not the ~10% of a shared split
    assert overlap < 0.2 * a.sum(), f"{overlap} of {a.sum()} held-out documents shared across salts"
    assert int(doc_hashes(["abc"], salt="another-salt")[0]) != 13143300168386765874
