"""Per-document text functions behind the Spark steps: pure Python + numpy, testable alone.

Hashing is deterministic across processes and machines (crc32 per token, fixed 64-bit mixing):
Python's own `hash` is salted per process and would make dedup depend on which executor ran.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
import zlib

import numpy as np

WORD = re.compile(r"\w+")
# ASCII byte -> itself lower-cased if it is a word character (`\w`: letters, digits, "_"), else a space.
ASCII_WORDS = bytes(ord(chr(c).lower()) if chr(c).isalnum() or chr(c) == "_" else ord(" ") for c in range(128))
ASCII_WORDS += b" " * 128
# The same without lower-casing: `\w+` tokens of ASCII text by one translate and split (`words`).
ASCII_WORD_CHARS = bytes(c if chr(c).isalnum() or chr(c) == "_" else ord(" ") for c in range(128)) + b" " * 128
# ASCII bytes str.isalnum() rejects (all but [A-Za-z0-9]), deleted to count the rest (`alnum_count`).
NOT_ALNUM = bytes(c for c in range(256) if c >= 128 or not chr(c).isalnum())
# What control_fraction counts: C0 controls but tab, newline, form feed, vertical tab; and U+FFFD.
CONTROL = [c for c in range(32) if chr(c) not in "\t\n\f\v"]
CONTROL_BYTES, CONTROL_CHARS = bytes(CONTROL), dict.fromkeys([*CONTROL, 0xFFFD])
MERSENNE = np.uint64((1 << 61) - 1)
MIX = np.uint64(0x9E3779B97F4A7C15)
CODE_LANGUAGES = {"python", "c", "cpp", "javascript", "typescript", "rust", "go", "shell", "sql", "css", "html"}


# -- normalize -----------------------------------------------------------------------------------
def normalize_text(text: str) -> str:
    """NFC, `\\n` line endings, no byte-order mark."""
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    return unicodedata.normalize("NFC", text)


def control_fraction(text: str) -> float:
    """Share of NUL/control characters (tab and newline excluded) and U+FFFD: binary garbage.

    Counted by deleting them in one `translate` (bytes for ASCII text), not a loop per character."""
    if not text:
        return 0.0
    kept = text.encode().translate(None, CONTROL_BYTES) if text.isascii() else text.translate(CONTROL_CHARS)
    return (len(text) - len(kept)) / len(text)


def alnum_count(text: str) -> int:
    """How many characters of `text` are alphanumeric (`str.isalnum`); ASCII text by one translate."""
    if text.isascii():
        return len(text.encode().translate(None, NOT_ALNUM))
    return sum(map(str.isalnum, text))


def word_tokens(text: str) -> list[str] | list[bytes]:
    """The `\\w+` tokens of `text`, case kept: ASCII text's as bytes, by one translate and split (the
    same tokens and lengths as the regex, which tests Unicode classes character by character)."""
    if text.isascii():
        return text.encode().translate(ASCII_WORD_CHARS).split()
    return WORD.findall(text)


def content_kind(language: str) -> str:
    return "code" if language in CODE_LANGUAGES else "prose"


# -- shingles and MinHash --------------------------------------------------------------------------
def token_hashes(text: str) -> np.ndarray:
    """crc32 of each lower-cased word (`\\w+`) token, as uint64.

    ASCII text (~90% of code) takes a path with the same tokens at 3x the speed: one
    `bytes.translate` lower-cases letters and blanks every byte outside `[a-z0-9_]`, and `split()`
    cuts the runs — where the regex over `str` tests Unicode classes character by character.
    """
    if text.isascii():
        tokens = text.encode().translate(ASCII_WORDS).split()
    else:
        tokens = [t.encode() for t in WORD.findall(text.lower())]
    return np.fromiter(map(zlib.crc32, tokens), dtype=np.uint64, count=len(tokens))


def ngram_hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """64-bit hashes of every run of `n` consecutive token hashes (empty if fewer tokens)."""
    count = len(tokens) - n + 1
    if count <= 0:
        return np.empty(0, dtype=np.uint64)
    h = np.zeros(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = (h ^ tokens[j : j + count]) * MIX
            h ^= h >> np.uint64(29)
    return h


def permutations(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The (a, b) of `count` hash functions h(x) = ((a*x + b) mod 2^64) mod (2^61 - 1), as datasketch.

    a and b span [0, 2^61): with a, x < 2^32 (a*x < 8p) the modulus wrapped at most 8 times, so
    the minimum fell on one of a few small shingles for most functions (~10 distinct argmins in
    126) and the Jaccard estimate had 4x the standard error of independent permutations.
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    a = rng.integers(1, MERSENNE, size=count, dtype=np.uint64)
    b = rng.integers(0, MERSENNE, size=count, dtype=np.uint64)
    return a, b


def sorted_unique(x: np.ndarray) -> np.ndarray:
    """`np.unique(x)` without its per-call overhead (a third of the cost on small documents)."""
    x = np.sort(x)
    keep = np.empty(len(x), dtype=bool)
    keep[:1] = True
    np.not_equal(x[1:], x[:-1], out=keep[1:])
    return x[keep]


def minhash(text: str, shingle_size: int, a: np.ndarray, b: np.ndarray, block: int = 4096) -> np.ndarray | None:
    """MinHash signature over unique word shingles; None for a document without words.

    A document shorter than `shingle_size` words is one shingle of all its words.
    """
    tokens = token_hashes(text)
    if len(tokens) == 0:
        return None
    shingles = sorted_unique(ngram_hashes(tokens, min(shingle_size, len(tokens))) & np.uint64(0xFFFFFFFF))
    signature = np.full(len(a), np.iinfo(np.uint64).max, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for start in range(0, len(shingles), block):  # bounded memory for huge documents
            x = shingles[start : start + block]
            v = a[:, None] * x[None, :]
            v += b[:, None]  # (a*x + b) mod 2^64
            # mod p without a division (which is 60% of the cost): as 2^61 = 1 (mod p), folding the
            # top 3 bits onto the low 61 gives v mod p, or a value in [p, p + 7] that needs one
            # more subtraction of p. That happens with probability ~2^-58 per value; a block
            # where it does takes the division, so the signature is exactly the same.
            r = v & MERSENNE
            v >>= np.uint64(61)
            r += v
            if r.max() >= MERSENNE:
                r = (a[:, None] * x[None, :] + b[:, None]) % MERSENNE
            np.minimum(signature, r.min(axis=1), out=signature)
    return signature


def band_hashes(signature: np.ndarray, bands: int, rows: int) -> list[int]:
    """One signed 64-bit hash per band of `rows` signature values (Spark's long)."""
    return [
        int.from_bytes(hashlib.blake2b(signature[i * rows : (i + 1) * rows].tobytes(), digest_size=8,
                                       person=i.to_bytes(4, "little")).digest(), "little", signed=True)
        for i in range(bands)
    ]


def estimated_jaccard(sig_a: bytes, sig_b: bytes) -> float:
    a, b = np.frombuffer(sig_a, dtype=np.uint64), np.frombuffer(sig_b, dtype=np.uint64)
    return float(np.mean(a == b))


def exact_jaccard(text_a: str, text_b: str, shingle_size: int) -> float:
    """Jaccard of the two documents' shingle sets (for tests and benchmarks)."""
    sets = []
    for text in (text_a, text_b):
        tokens = token_hashes(text)
        sets.append(set(ngram_hashes(tokens, min(shingle_size, max(len(tokens), 1))).tolist()))
    union = sets[0] | sets[1]
    return len(sets[0] & sets[1]) / len(union) if union else 1.0
