"""Deterministic document splits by a hash of `doc_id`: held-out vs training, and logical shards.

One 64-bit hash per document decides both things, so they never depend on file layout, Spark
partitioning or the order a table was written in — a table rewritten with the same documents
splits the same way:

- held out iff `u < heldout_fraction`, where `u` is the hash's top 32 bits scaled to [0, 1); a
  smaller fraction's held-out set is a subset of a larger one's, so evaluations at different
  fractions stay comparable. Training never streams these; evaluations read them (bits per byte).
- logical shard = the hash's low 32 bits mod `num_shards` (training documents only). Shards are
  what the loader's streams are made of; ranks and loader workers own whole shards, which is
  what makes a world-size change exact (see `factory.mix.loader`).

The salt is part of the split's identity: changing it reshuffles every split, so it is fixed here
and recorded in every mix version.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

SALT = "factory-split-v1"
DEFAULT_HELDOUT_FRACTION = 0.02


def doc_hashes(doc_ids: Iterable[str], salt: str = SALT) -> np.ndarray:
    """One uint64 per doc id: the first 8 bytes of sha256(salt, doc_id), big-endian."""
    prefix = salt.encode() + b"\x00"
    digests = b"".join(hashlib.sha256(prefix + d.encode()).digest()[:8] for d in doc_ids)
    return np.frombuffer(digests, dtype=">u8").astype(np.uint64)


def heldout_mask(hashes: np.ndarray, fraction: float) -> np.ndarray:
    """True where a document is held out."""
    return (hashes >> np.uint64(32)).astype(np.float64) / 2.0**32 < fraction


def uniform(hashes: np.ndarray) -> np.ndarray:
    """A second draw in [0, 1) from the same hash (its low bits), independent of the held-out
    decision: samples that must not depend on file order pick documents with it."""
    return (hashes & np.uint64(0xFFFFFFFF)).astype(np.float64) / 2.0**32


def shard_of(hashes: np.ndarray, num_shards: int) -> np.ndarray:
    """The logical shard of each document (meaningful for training documents only)."""
    return ((hashes & np.uint64(0xFFFFFFFF)) % np.uint64(num_shards)).astype(np.int64)


def is_heldout(doc_id: str, fraction: float = DEFAULT_HELDOUT_FRACTION, salt: str = SALT) -> bool:
    """Whether one document is held out (the evaluation side uses this)."""
    return bool(heldout_mask(doc_hashes([doc_id], salt), fraction)[0])
