"""Junk documents made from the corpus: a source the auto-mixer must learn to leave out.

The auto-mixer (`factory.experiments.automix`) is only shown to work where the right answer is
known. `build_junk_table` writes one from the training documents of real tables, committed as
`junk.<name>` with the refined-documents schema and a lineage row whose upstream are the pinned
source snapshots, so a mix can name it like any refined table. Six kinds, by what they break:
`shuffle_words`, `shuffle_characters` and `foreign_characters` (characters shuffled, then moved into
another script) keep each document's words or characters over its whitespace skeleton;
`uniform_words` and `uniform_tokens` draw the corpus's own word (token) types uniformly;
`repeated_line` repeats a document's first line to its length (degenerate, boilerplate-like text).
`configs/mixes/default_with_junk.yaml`, the designed case, names `junk.repeated_line`.

Design, and why:
- How much junk costs held-out bits/byte on real text depends on what the model can learn, so the
  kinds were probed on the auto-mixer's proxy (d=32, 40 steps of 8 sequences; junk at 0 scores
  2.93): the designed case uses the one that hurts. Junk that keeps the corpus's token statistics
  or that context tells apart from real text costs a proxy this small little: shuffled words +0.03
  at 3/4 junk; foreign characters (tokens real text hardly uses) ~0 below 0.3, ~+0.1 above 0.4;
  uniform words -0.015 and uniform tokens +0.02 at 1/2 (such a proxy is still far from even the
  unigram distribution, ~7 nats a token, so wrong unigrams barely register). A repeated line is
  what such a proxy does learn, fast: its few tokens are easy to predict, so the model comes to
  expect them everywhere: +0.17 at 1/2 (3.10).
- Shuffles keep each document's bytes and multiset of words (or characters) over its whitespace
  skeleton, so a test checks them by multisets; the uniform kinds draw only types seen at least
  `min_type_count` (2) times in the sampled documents, sorted (a deterministic set; the cap drops
  one-off identifiers and literals, most of a code corpus's types).
- Deterministic: permutations and draws are seeded by sha256 of (salt, shuffle, doc_id), documents
  are picked by the split hash (not file order), and the junk doc ids are hashes too, so rebuilding
  on the same snapshots writes the same table bit for bit; the content hash makes the build idempotent.
- The sources' held-out documents are never used (at the mix default `heldout_fraction`), not even
  for the uniform kinds' types: junk made from them would leak the evaluation's text into training.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from factory.data.split import DEFAULT_HELDOUT_FRACTION, doc_hashes, heldout_mask, uniform
from factory.lake import CommitStamp, Lake, LakeError
from factory.lake.commit import stamp_of
from factory.lake.lineage import snapshot_record, table_version_id
from factory.lake.scan import pin_snapshot, stream_snapshot
from factory.lake.schemas import REFINED_DOCUMENTS
from factory.version import config_hash

_PIECES = re.compile(r"(\s+)")


class JunkConfig(BaseModel):
    """Which documents become junk, and where the junk goes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field("shuffled_words", pattern=r"^[a-z0-9_]+$", description="Table name in namespace `junk`.")
    shuffle: Literal["words", "characters", "foreign", "uniform_words", "uniform_tokens", "repeated_line",
                     "repeated_word", "reversed_words"] = Field(
        "words", description="What each document becomes: its words or characters permuted over the same whitespace, "
                             "characters permuted then moved into another script (`foreign`), every word (token) "
                             "drawn uniformly from the sources' types (`uniform_words`, `uniform_tokens`), or its "
                             "first line (`repeated_line`) or first word (`repeated_word`) repeated, or its "
                             "words in reverse order (`reversed_words`).")
    tokenizer: str = Field("default", description="`uniform_tokens`: the trained tokenizer whose tokens are drawn.")
    min_type_count: int = Field(2, ge=1, description="The uniform kinds draw only word (token) types seen at least "
                                                     "this often in the sampled training documents.")
    sources: tuple[str, ...] = Field(min_length=1, description="Tables whose training documents are shuffled.")
    max_docs_per_source: int = Field(2000, ge=1, description="Documents taken per source (a uniform sample by hash).")
    heldout_fraction: float = Field(DEFAULT_HELDOUT_FRACTION, ge=0, lt=1,
                                    description="Source documents held out at this fraction are never used.")
    salt: str = Field("junk-v1", description="Seeds every permutation; changing it reshuffles the table.")

    @property
    def table(self) -> str:
        return f"junk.{self.name}"


class JunkReport(BaseModel):
    """What one build wrote (or found already written)."""

    model_config = ConfigDict(frozen=True)

    table: str
    snapshot_id: int
    created: bool
    rows: int
    bytes: int
    skipped: dict[str, int] = Field(description="Source documents not used, by reason.")
    upstream: dict[str, int]

    @property
    def version_id(self) -> str:
        return table_version_id(self.table, self.snapshot_id)


def shuffle_words(text: str, key: str) -> str | None:
    """`text` with its words (maximal non-whitespace runs) permuted over the same whitespace, by a
    permutation seeded from `key`; None when it has fewer than two distinct words (no reorder of it
    is junk). The result always differs from `text`."""
    pieces = _PIECES.split(text)
    slots = [i for i, p in enumerate(pieces) if p and not p.isspace()]
    order = _permuted([pieces[i] for i in slots], key)
    if order is None:
        return None
    for slot, word in zip(slots, order):
        pieces[slot] = word
    return "".join(pieces)


def shuffle_characters(text: str, key: str) -> str | None:
    """`text` with its non-whitespace characters permuted over the same positions (whitespace stays
    put); None when it has fewer than two distinct ones. Unlike `shuffle_words`, even the tokens
    change: the tokenizer's merges no longer match, so the junk's token distribution is not the
    corpus's and a model learns the wrong unigrams from it, not only the wrong order."""
    slots = [i for i, c in enumerate(text) if not c.isspace()]
    order = _permuted([text[i] for i in slots], key)
    if order is None:
        return None
    chars = list(text)
    for slot, c in zip(slots, order):
        chars[slot] = c
    return "".join(chars)


def foreign_characters(text: str, key: str) -> str | None:
    """`shuffle_characters`, then every non-whitespace character moved into the Cyrillic block by a
    fixed map (code point mod 64): text in a script the corpus does not have. Its tokens are ones
    real text hardly uses, so every sequence of it pulls the model's predictions away from real
    text, even in a model that has learned nothing but which tokens are common."""
    shuffled = shuffle_characters(text, key)
    if shuffled is None:
        return None
    return "".join(c if c.isspace() else chr(CYRILLIC + ord(c) % 64) for c in shuffled)


def uniform_words(text: str, key: str, types: Sequence[str]) -> str | None:
    """`text` with every word (maximal non-whitespace run) replaced by one of `types` drawn uniformly
    at random, seeded from `key`, over the same whitespace; None when it has no word. The words are
    the corpus's own, but a rare one is as common as `self` or `the`: a model that learns from it
    learns the wrong unigrams, the statistics real text relies on most."""
    pieces = _PIECES.split(text)
    slots = [i for i, p in enumerate(pieces) if p and not p.isspace()]
    if not slots or not types:
        return None
    rng = random.Random(hashlib.sha256(key.encode()).digest())
    for slot in slots:
        pieces[slot] = types[rng.randrange(len(types))]
    return "".join(pieces)


def uniform_tokens(text: str, key: str, tokenizer, types: Sequence[int]) -> str | None:
    """As many tokens as `text` has, each drawn uniformly from `types` (token ids) seeded from
    `key`, decoded; None when it has no token. The corpus's own tokens, but a rare one as common as
    a space: it pulls a model's next-token distribution back toward uniform, undoing the first thing
    a model learns (which tokens are common), and no context tells it from real text but its
    randomness."""
    n = len(tokenizer.encode(text, add_special_tokens=False).ids)
    if not n or not types:
        return None
    rng = random.Random(hashlib.sha256(key.encode()).digest())
    return tokenizer.decode([types[rng.randrange(len(types))] for _ in range(n)])


def token_types(docs: Sequence[dict], tokenizer, min_count: int = 2) -> tuple[int, ...]:
    """The token ids of `docs` seen at least `min_count` times, sorted."""
    counts = Counter(i for e in tokenizer.encode_batch([d["text"] or "" for d in docs], add_special_tokens=False)
                     for i in e.ids)
    return tuple(sorted(i for i, n in counts.items() if n >= min_count))


def word_types(docs: Iterable[dict], min_count: int = 2) -> tuple[str, ...]:
    """The distinct words of `docs` seen at least `min_count` times, sorted: a deterministic set
    whatever the documents' order. The cap drops the long tail of one-off identifiers and literals
    (most types of a code corpus), which would otherwise be nearly all of what is drawn."""
    counts = Counter(w for d in docs for w in (d["text"] or "").split())
    return tuple(sorted(w for w, n in counts.items() if n >= min_count))


def repeated_line(text: str, key: str = "") -> str | None:
    """The document's first non-blank line, repeated (one a line) to at least the document's length:
    degenerate, boilerplate-like text (a header or an import over and over) whose few tokens a model
    learns to expect everywhere. None when the document is one line (nothing is repeated)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        return None
    return "\n".join([lines[0]] * -(-len(text) // (len(lines[0]) + 1))) + "\n"


def repeated_word(text: str, key: str = "") -> str | None:
    """The document's first word, repeated (one space apart) to at least the document's length:
    the harshest boilerplate. The first words of code documents are a few types (`#`, `import`,
    `from`, `\"\"\"` ...), so the junk piles a mix's token mass onto them, which a model learns
    before anything else. Yet in a probe at half of mix `code_with_junk` it did not hurt 40-step
    proxies on whole documents (held-out bpb 3.00-3.01 at 0.53-0.60 junk against 3.09 at 0.10): at
    that scale its cost is lost in the seed spread, which comes from the few documents a short run
    reads (README, "Does the auto-mixer find what is there?"). None when the document has no word."""
    words = text.split()
    if not words:
        return None
    return " ".join([words[0]] * -(-len(text) // (len(words[0]) + 1))) + "\n"


def reversed_words(text: str, key: str = "") -> str | None:
    """`text` with its words (maximal non-whitespace runs) in reverse order over the same
    whitespace: the corpus's own tokens, the same layout and bytes, but every pair of neighbouring
    words the wrong way round. Unlike a random shuffle, which only blurs which word follows which,
    the reversal is systematic: the same words in the same contexts with the opposite successors,
    so a model that learns which word follows which learns real text's statistics backwards. Yet
    over the 16 proxies of sweep `automix_reversed` (d=32, 120 steps) held-out bpb of the real
    sources rose only 0.16 per unit of junk share, a third of the seed spread at the uniform
    mix's 0.25 (bench/automix_bench.py --junk reversed_words; README). None when the reversal is
    the text itself (fewer than two words, or a palindrome of words)."""
    pieces = _PIECES.split(text)
    slots = [i for i, p in enumerate(pieces) if p and not p.isspace()]
    words = [pieces[i] for i in slots]
    if words == words[::-1]:
        return None
    for slot, word in zip(slots, reversed(words)):
        pieces[slot] = word
    return "".join(pieces)


CYRILLIC = 0x0410  # А: the map's 64 targets are А..я
SHUFFLES = {"words": shuffle_words, "characters": shuffle_characters, "foreign": foreign_characters,
            "repeated_line": repeated_line, "repeated_word": repeated_word, "reversed_words": reversed_words}


def _permuted(items: list[str], key: str) -> list[str] | None:
    """`items` in an order seeded from `key`, never their own order (a permutation that fixes every
    item is rare but not junk: then they are rotated instead); None with fewer than two distinct."""
    if len(set(items)) < 2:
        return None
    order = items[:]
    random.Random(hashlib.sha256(key.encode()).digest()).shuffle(order)
    if order == items:
        first = next(i for i, w in enumerate(items) if w != items[0])
        order = items[first:] + items[:first]
    return order


def junk_rows(docs: Iterable[dict], config: JunkConfig, tokenizer=None) -> tuple[list[dict], dict[str, int]]:
    """Junk rows (REFINED_DOCUMENTS columns) for `docs`, and the documents skipped by reason
    (`uniform_tokens` needs `tokenizer`, a `tokenizers.Tokenizer`)."""
    docs = list(docs)
    if config.shuffle == "uniform_words":
        shuffle = partial(uniform_words, types=word_types(docs, config.min_type_count))
    elif config.shuffle == "uniform_tokens":
        if tokenizer is None:
            raise ValueError(f"junk {config.table}: uniform_tokens needs a tokenizer")
        shuffle = partial(uniform_tokens, tokenizer=tokenizer,
                          types=token_types(docs, tokenizer, config.min_type_count))
    else:
        shuffle = SHUFFLES[config.shuffle]
    reasons = {"uniform_words": "no_words", "uniform_tokens": "no_tokens", "repeated_line": "one_line",
               "repeated_word": "no_words", "reversed_words": "palindrome_of_words"}
    reason = reasons.get(config.shuffle, f"too_few_distinct_{config.shuffle}")
    rows, skipped = [], {reason: 0}
    for doc in docs:
        key = f"{config.salt}\0{config.shuffle}\0{doc['doc_id']}"
        doc_id = hashlib.sha256(key.encode()).hexdigest()[:24]
        text = shuffle(doc["text"] or "", key)
        if text is None:
            skipped[reason] += 1
            continue
        rows.append({**doc, "doc_id": doc_id, "source": f"junk/{doc['source']}", "path": f"shuffled:{doc['path']}",
                     "text": text, "bytes": len(text.encode()),
                     "content_sha256": hashlib.sha256(text.encode()).hexdigest()})
    return rows, skipped


def build_junk_table(lake: Lake, config: JunkConfig, *, run_id: str = "",
                     log: Callable[[str], None] = lambda _: None) -> JunkReport:
    """Write `config.table` from the current snapshots of its sources, or return the snapshot that
    already holds exactly these rows (same sources, same config: nothing is committed)."""
    upstream, docs, skipped = {}, [], {}
    for table in config.sources:
        if not lake.has_table(table):
            raise LakeError(f"junk {config.table}: source {table} does not exist in the lake (materialize it first)")
        pinned = pin_snapshot(lake, table)
        upstream[table] = pinned.snapshot_id
        picked, held = _training_sample(lake, pinned, config)
        skipped[f"heldout:{table}"] = held
        docs += picked
    tokenizer = None
    if config.shuffle == "uniform_tokens":
        from factory.tokenize.bpe import latest_tokenizer, load_tokenizer
        tokenizer = load_tokenizer(latest_tokenizer(lake, config.tokenizer).path)
    rows, reasons = junk_rows(docs, config, tokenizer)
    skipped |= reasons
    if not rows:
        raise LakeError(f"junk {config.table}: no source document of {list(config.sources)} could be shuffled")
    data = pa.Table.from_pylist(rows, schema=REFINED_DOCUMENTS.as_arrow())
    content = config_hash({"config": config.model_dump(mode="json"), "docs": [(r["doc_id"], r["content_sha256"])
                                                                              for r in rows]})
    size = sum(r["bytes"] for r in rows)
    if lake.has_table(config.table) and stamp_of(lake.table(config.table)).get("content-hash") == content:
        snapshot = lake.current_snapshot_id(config.table)
        log(f"{config.table}@{snapshot}: unchanged ({len(rows)} documents), nothing committed")
        return JunkReport(table=config.table, snapshot_id=snapshot, created=False, rows=len(rows), bytes=size,
                          skipped=skipped, upstream=upstream)
    stamp = CommitStamp(asset_key=config.table.replace(".", "/"), config_hash=config_hash(config), run_id=run_id,
                        upstream=upstream, content_hash=content)
    lake.ensure_table(config.table, REFINED_DOCUMENTS)
    commit = lake.commit(config.table, data, stamp, mode="overwrite", lineage=snapshot_record(
        config.table, stamp, config, uri=lake.table(config.table).location(),
        metadata={"rows_out": len(rows), "bytes_out": size, "skipped": skipped}))
    log(f"{config.table}@{commit.snapshot_id}: {len(rows)} junk documents ({config.shuffle}, {size:,} bytes) "
        f"from {', '.join(f'{t}@{s}' for t, s in upstream.items())}")
    return JunkReport(table=config.table, snapshot_id=commit.snapshot_id, created=True, rows=len(rows), bytes=size,
                      skipped=skipped, upstream=upstream)


def _training_sample(lake: Lake, pinned, config: JunkConfig) -> tuple[list[dict], int]:
    """Up to `max_docs_per_source` training documents of a pinned table, in split-hash order (a
    uniform sample whatever the file layout), and how many held-out documents were left out. Ids
    are read first, so only the chosen documents' text is ever held in memory."""
    ranked, held = [], 0
    for batch in stream_snapshot(lake, pinned, ["doc_id"]):
        ids = batch.column("doc_id").to_pylist()
        hashes = doc_hashes(ids)
        out = heldout_mask(hashes, config.heldout_fraction)
        held += int(out.sum())
        ranked += [(float(u), d) for u, d, o in zip(uniform(hashes), ids, out) if not o]
    chosen = {d: i for i, (_, d) in enumerate(sorted(ranked)[:config.max_docs_per_source])}
    rows = []
    for batch in stream_snapshot(lake, pinned, list(REFINED_DOCUMENTS.as_arrow().names)):
        keep = pa.array([d in chosen for d in batch.column("doc_id").to_pylist()])
        rows += batch.filter(keep).to_pylist()
    return sorted(rows, key=lambda r: chosen[r["doc_id"]]), held
