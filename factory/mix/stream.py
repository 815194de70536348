"""One logical shard of a mix: its documents, source by source, packed into sequences.

A `SourceCursor` walks the training documents of one source that fall in one logical shard
(`factory.data.split`), epoch after epoch: the pinned snapshot's files in a seeded order per
epoch, each file in record batches of a fixed row count, the shard's documents of a batch in a
seeded order, tokenized together (`encode_batch` runs in Rust threads). Its position is four
integers — epoch, file, batch, row — that mean the same thing after a restart, so resuming
re-reads one record batch and nothing else.

A `LogicalStream` owns one cursor per source, a seeded generator that picks the source of each
sequence by weight, and one packing buffer per source: a sequence is `seq_len + 1` tokens of
consecutive documents of its source (each cut to the source's `max_doc_tokens`, when set), each
followed by eos; the tail of the last document waits in the buffer for that source's next sequence. Filling a sequence from one source keeps the
token share of each source equal to its weight (a sequence is the unit of sampling), and makes
the buffer at most one document's tail. Everything the stream will do next is in its state.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from tokenizers import Tokenizer

from factory.data.split import doc_hashes, heldout_mask, shard_of
from factory.lake.scan import PinnedSnapshot, file_batches
from factory.mix.spec import MixError


class RepetitionCapReached(MixError):
    """A source reached its `max_epochs`; the mix's `on_cap` says whether that is an error."""

    def __init__(self, table: str, cap: float, epochs: float):
        super().__init__(f"source {table} reached its repetition cap: {epochs:.3f} epochs consumed, "
                         f"max_epochs={cap}")
        self.table, self.cap, self.epochs = table, cap, epochs


@dataclass(frozen=True)
class SourceContext:
    """What every cursor of one source shares: the pinned files and how to read them."""

    pinned: PinnedSnapshot
    iceberg_table: object  # pyiceberg Table: its FileIO opens the files
    max_epochs: float | None
    heldout_fraction: float
    max_doc_tokens: int | None = None  # tokens kept from the start of each document; None = all


@dataclass(frozen=True)
class StreamContext:
    """What every stream of one mix version shares."""

    version_id: str
    sources: dict[str, SourceContext]  # in the spec's order
    tokenizer: Tokenizer
    eos_id: int
    seq_tokens: int  # seq_len + 1
    num_shards: int
    seed: int
    batch_rows: int


class SourceCursor:
    """The training documents of one source in one shard, in a seeded order, epoch after epoch."""

    def __init__(self, table: str, shard: int, ctx: StreamContext, state: dict | None = None):
        self.table, self.shard, self.ctx = table, shard, ctx
        self.src = ctx.sources[table]
        if not self.src.pinned.files:
            raise MixError(f"source {table}@{self.src.pinned.snapshot_id} has no data files")
        state = state or {"epoch": 0, "file": 0, "batch": 0, "row": 0}
        self.epoch, self.file, self.batch, self.row = state["epoch"], state["file"], state["batch"], state["row"]
        self._docs: _LazyDocs | None = None  # documents of the current record batch
        # size of that batch (rows of all shards, this shard's documents), kept in the state so the
        # epoch count is a function of the position, loaded or not
        self._record_rows, self._batch_docs = state.get("batch_size", (0, 0))
        self._batches = None  # record batches of the current file, positioned after `batch`
        self._order_cache: tuple[int, np.ndarray] | None = None
        # a pass watched from its first row that yields nothing proves the shard has no documents
        self._pass_docs, self._whole_pass = 0, (self.file, self.batch, self.row) == (0, 0, 0)

    def state(self) -> dict:
        return {"snapshot_id": self.src.pinned.snapshot_id, "epoch": self.epoch, "file": self.file,
                "batch": self.batch, "row": self.row, "batch_size": (self._record_rows, self._batch_docs),
                "epochs": round(self.epochs(), 6)}

    def epochs(self) -> float:
        """Passes over the source (this shard's view of it), fractional to a record batch."""
        files = self.src.pinned.files
        total = sum(f.rows for f in files) or 1
        before = sum(files[i].rows for i in self._order()[: self.file])
        within = self._record_rows * self.row / self._batch_docs if self._batch_docs else 0
        return self.epoch + min(before + self.batch * self.ctx.batch_rows + within, total) / total

    def next_doc(self) -> tuple[str, np.ndarray]:
        """(doc_id, tokens + eos) of the next document."""
        cap = self.src.max_epochs
        while True:
            if cap is not None and self.epochs() >= cap:
                raise RepetitionCapReached(self.table, cap, self.epochs())
            if self._docs is None and not self._load():
                self._next_file()
                continue
            if self.row < len(self._docs):
                doc = self._docs[self.row]
                self.row += 1
                self._pass_docs += 1
                return doc
            self._docs, self.batch, self.row, self._record_rows, self._batch_docs = None, self.batch + 1, 0, 0, 0

    def _order(self) -> np.ndarray:
        """This epoch's file order (seeded by epoch, source and shard)."""
        if self._order_cache is None or self._order_cache[0] != self.epoch:
            rng = np.random.default_rng([self.ctx.seed, _crc(self.table), self.shard, self.epoch])
            self._order_cache = (self.epoch, rng.permutation(len(self.src.pinned.files)))
        return self._order_cache[1]

    def _next_file(self) -> None:
        self._batches, self.file, self.batch, self.row, self._record_rows, self._batch_docs = None, self.file + 1, 0, 0, 0, 0
        if self.file < len(self.src.pinned.files):
            return
        if self._whole_pass and self._pass_docs == 0:
            raise MixError(f"source {self.table} has no training documents in logical shard "
                           f"{self.shard} of {self.ctx.num_shards}: use fewer shards or add data")
        self.epoch, self.file, self._pass_docs, self._whole_pass = self.epoch + 1, 0, 0, True

    def _load(self) -> bool:
        """Read the record batch at the position (on resume: seek from the file start); False
        when the file has no batch there."""
        if self._batches is None:
            file = self.src.pinned.files[self._order()[self.file]]
            self._batches = file_batches(self.src.iceberg_table, file, ["doc_id", "text"], self.ctx.batch_rows)
            for _ in range(self.batch):
                next(self._batches, None)
        record = next(self._batches, None)
        if record is None:
            return False
        ids = record.column("doc_id").to_pylist()
        self._record_rows = record.num_rows
        hashes = doc_hashes(ids)
        mine = ~heldout_mask(hashes, self.src.heldout_fraction) & (shard_of(hashes, self.ctx.num_shards) == self.shard)
        picked = np.flatnonzero(mine)
        rng = np.random.default_rng([self.ctx.seed, _crc(self.table), self.shard, self.epoch, self.file, self.batch])
        picked = picked[rng.permutation(len(picked))]
        self._docs = _LazyDocs([ids[i] for i in picked], record.column("text").take(picked), self.ctx,
                               self.src.max_doc_tokens)
        self._batch_docs = len(self._docs)
        return True


class _LazyDocs:
    """A record batch's documents, tokenized a few at a time as they are reached: a shard pays
    for what it streams (startup and a resume tokenize one chunk, not the whole batch), while
    `encode_batch` still spreads each chunk over threads."""

    CHUNK = 8

    def __init__(self, ids: list[str], texts, ctx: StreamContext, max_tokens: int | None = None):
        self.ids, self.texts, self.ctx, self.max_tokens = ids, texts, ctx, max_tokens
        self.tokens: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[str, np.ndarray]:
        if i >= len(self.tokens):
            # resuming mid-batch tokenizes from the position, not from the batch start
            self.tokens += [None] * (i - len(self.tokens))
            chunk = self.texts.slice(i, self.CHUNK).to_pylist()
            eos = np.array([self.ctx.eos_id], dtype=np.int32)
            self.tokens += [np.concatenate([np.asarray(e.ids[:self.max_tokens], dtype=np.int32), eos])
                            for e in self.ctx.tokenizer.encode_batch(chunk, add_special_tokens=False)]
        return self.ids[i], self.tokens[i]


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


@dataclass
class Sequence:
    """One packed training row and where it came from."""

    shard: int
    tokens: np.ndarray
    table: str
    doc_ids: list[str]
    state: dict = field(repr=False)  # the stream's state after this sequence


class LogicalStream:
    """Sequences of one logical shard: source by weight, packed with eos between documents."""

    def __init__(self, shard: int, ctx: StreamContext, state: dict | None = None):
        self.shard, self.ctx = shard, ctx
        state = state or {}
        self.rng = np.random.default_rng([ctx.seed, shard])
        if "rng" in state:
            self.rng.bit_generator.state = copy.deepcopy(state["rng"])
        cursors = state.get("cursors", {})
        self.cursors = {t: SourceCursor(t, shard, ctx, _same_snapshot(cursors.get(t), src))
                        for t, src in ctx.sources.items()}
        self.buffers = {t: np.asarray(state.get("buffers", {}).get(t, []), dtype=np.int32) for t in ctx.sources}
        self.carry = {t: state.get("carry", {}).get(t) for t in ctx.sources}
        self.counts: dict[str, dict[str, dict[str, int]]] = copy.deepcopy(state.get("counts", {}))
        self.produced: int = state.get("produced", 0)
        # state of sources a newer version dropped, kept so accounting and positions survive
        self.retired: dict = copy.deepcopy(state.get("retired", {}))
        for t, s in cursors.items():
            if t not in ctx.sources:
                self.retired[t] = s

    def next_sequence(self, weights_at: Callable[[int], dict[str, float]]) -> Sequence:
        """The next sequence; `weights_at(i)` gives the weights for this stream's i-th sequence."""
        weights = weights_at(self.produced)
        tables = list(self.ctx.sources)
        w = np.array([weights.get(t, 0.0) for t in tables], dtype=np.float64)
        cum = np.cumsum(w) / w.sum()
        table = tables[min(int(np.searchsorted(cum, self.rng.random(), side="right")), len(tables) - 1)]
        parts, n = [self.buffers[table]], len(self.buffers[table])
        doc_ids = [self.carry[table]] if n else []
        cursor = self.cursors[table]
        while n < self.ctx.seq_tokens:
            doc_id, tokens = cursor.next_doc()
            parts.append(tokens)
            doc_ids.append(doc_id)
            n += len(tokens)
        packed = np.concatenate(parts)
        self.buffers[table] = packed[self.ctx.seq_tokens:].copy()
        self.carry[table] = doc_ids[-1] if len(self.buffers[table]) else None
        c = self.counts.setdefault(self.ctx.version_id, {}).setdefault(table, {"sequences": 0, "tokens": 0})
        c["sequences"] += 1
        c["tokens"] += self.ctx.seq_tokens
        self.produced += 1
        return Sequence(self.shard, packed[: self.ctx.seq_tokens], table, doc_ids, self.state())

    def state(self) -> dict:
        return {
            "rng": copy.deepcopy(self.rng.bit_generator.state),
            "cursors": {**self.retired, **{t: c.state() for t, c in self.cursors.items()}},
            "buffers": {t: b.tolist() for t, b in self.buffers.items()},  # plain ints: torch.load(weights_only)
            "carry": dict(self.carry),
            "counts": copy.deepcopy(self.counts),
            "produced": self.produced,
            "retired": copy.deepcopy(self.retired),
        }


def _same_snapshot(state: dict | None, src: SourceContext) -> dict | None:
    """A cursor continues only on the snapshot it was reading; a newly pinned one starts over."""
    if state and state["snapshot_id"] == src.pinned.snapshot_id:
        return {k: state[k] for k in ("snapshot_id", "epoch", "file", "batch", "row", "batch_size")}
    return None
