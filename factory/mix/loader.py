"""The streaming loader: a mix version in, fixed-length token batches out, resumable exactly.

Sharding. The training documents of every source are split into `num_shards` logical shards by
a hash of `doc_id`; each shard is a `LogicalStream` with its own seeded state. Data-parallel rank
r of W owns shards r, r+W, ...; its loader workers split those again. A rank's batch takes its
shards round-robin, so every shard contributes exactly `global_batch / num_shards` sequences per
step whatever the world size. That is what makes resumption exact: a checkpoint holds every
shard's state (`merge_states` of all ranks), and a run relaunched on any world size that divides
`num_shards` continues each shard where it stopped — the same sequences, in a different
rank/row order after a world-size change, bit-identical at the same world size.

Workers are threads: the expensive parts (Parquet decoding, `encode_batch`) release the GIL.
Each sequence a worker produces carries its shard's state after it; the loader keeps the state
of the last sequence the trainer actually took, so prefetched sequences never leak into a
checkpoint.

Live mix changes. A loader that follows its mix by name asks `resolve` for the newest version
every `poll_every` steps (the trainer passes a resolver that agrees across ranks) and switches
before the next step: shards keep their positions in sources whose snapshot did not change, a
newly pinned snapshot starts from its beginning, and counts of sequences are kept per version and
source, so the tokens consumed from each source under each version are exact. The switch
(step, from, to) is in the loader state and, when the loader has a run id, in lineage.

Why tokenize on the fly instead of reading pre-tokenized shards: measured by
`bench/loader_bench.py`, one loader worker on this 2-core machine outruns the smoke model's
consumption by far more than the 20x goal, and on-the-fly tokenization is what lets a mix
change (or a new synthetic snapshot join) without re-materializing anything.
"""

from __future__ import annotations

import copy
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from factory.lake import Lake
from factory.lake.lineage import LineageRecord
from factory.lake.scan import pin_snapshot
from factory.mix.spec import MixError
from factory.mix.stream import LogicalStream, RepetitionCapReached, Sequence, SourceContext, StreamContext
from factory.mix.versions import MixVersion, get_version, latest_version, version_problems
from factory.tokenize import load_tokenizer
from factory.version import canonical_json, code_version, env_lock_hash

if TYPE_CHECKING:
    import torch


class LoaderConfig(BaseModel):
    """How a run streams its mix (identity: seed, shards, batch; the rest is execution)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    global_batch: int = Field(gt=0, description="Sequences per optimizer step, all ranks together.")
    num_shards: int = Field(8, gt=0, description="Logical shards; world sizes must divide it, and it must divide global_batch.")
    seed: int = Field(0, description="Seeds source choice and document order.")
    num_workers: int = Field(1, ge=0, description="Producer threads per rank; 0 produces inline.")
    prefetch: int = Field(256, gt=0, description="Sequences each worker may run ahead.")
    follow: bool = Field(False, description="Switch to newer versions of the mix at step boundaries.")
    poll_every: int = Field(50, gt=0, description="Steps between checks for a newer version when following.")
    batch_rows: int = Field(1024, gt=0, description="Rows per Parquet record batch read.")
    weights: dict[str, float] | None = Field(None, description="Replace the version's weights (and stages) with these.")


class MixExhausted(Exception):
    """The stream ended cleanly: a source reached its repetition cap under `on_cap: stop`."""


@dataclass
class Batch:
    """One step's rows for this rank."""

    step: int
    tokens: "torch.Tensor"  # [rows, seq_len + 1] int64
    sources: list[str]
    doc_ids: list[list[str]]
    version_id: str
    stage: int
    # packed fine-tuning batches (factory.posttrain.sft) fill these; None = every target counts, one
    # document per row's attention
    loss_mask: "torch.Tensor | None" = None  # [rows, seq_len] bool: which next-token targets the loss counts
    segments: "torch.Tensor | None" = None  # [rows, seq_len] int64: the packed document of each input position


class MixLoader:
    """Batches of one rank; `state_dict()` after a step resumes right after it."""

    def __init__(
        self,
        lake: Lake,
        mix: MixVersion | str,
        config: LoaderConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
        state: dict | None = None,
        resolve: Callable[[], MixVersion | None] | None = None,
        run_id: str = "",
    ):
        _check_layout(config, rank, world_size)
        self.lake, self.config, self.rank, self.world_size, self.run_id = lake, config, rank, world_size, run_id
        if state is not None:
            _check_state(state, config)
            mix = state["version"]
        self.version = get_version(lake, mix) if isinstance(mix, str) else mix
        self.resolve = resolve or (lambda: latest_version(lake, self.version.mix))
        self.shards = list(range(rank, config.num_shards, world_size))
        state = state or {"step": 0, "tokens": 0, "history": [], "shards": {}, "base": [0, 0]}
        self.step, self.tokens, self.history = state["step"], state["tokens"], list(state["history"])
        self._base = tuple(state["base"])  # (step, tokens) when the current version took over
        saved = {int(k): v for k, v in state["shards"].items()}  # JSON turns the keys into strings
        missing = [s for s in self.shards if s not in saved]
        if self.step > 0 and missing:
            raise MixError(f"loader state at step {self.step} has no position for shards {missing}: resume from "
                           "merge_states() of every rank's state_dict(), not one rank's")
        self._taken = {s: saved.get(s) for s in self.shards}  # state after the last taken sequence
        self._ctx = self._context(self.version)
        self._start()

    # -- the public surface ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        while True:
            try:
                yield self.next_batch()
            except MixExhausted:
                return

    def __enter__(self) -> "MixLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def tokenizer(self):
        """The version's tokenizer (a `tokenizers.Tokenizer`)."""
        return self._ctx.tokenizer

    def next_batch(self) -> Batch:
        """This rank's rows for the next step (switching versions first when one is due)."""
        if self.config.follow and self.step % self.config.poll_every == 0:
            newest = self.resolve()
            if newest is not None and newest.version > self.version.version:
                self.switch_to(newest)
        rows = self.config.global_batch // self.world_size
        stage, _ = self._weights_at_step(self.step)
        taken: dict[int, dict] = {}
        seqs: list[Sequence] = []
        for i in range(rows):
            shard = self.shards[i % len(self.shards)]
            seq = self._take(shard)
            taken[shard] = seq.state
            seqs.append(seq)
        self._taken.update(taken)
        import torch  # here, not at import: the CLI and the Dagster layer import this module

        batch = Batch(
            step=self.step,
            tokens=torch.from_numpy(np.stack([s.tokens for s in seqs]).astype(np.int64)),
            sources=[s.table for s in seqs], doc_ids=[s.doc_ids for s in seqs],
            version_id=self.version.version_id, stage=stage,
        )
        self.step += 1
        self.tokens += self.config.global_batch * self._ctx.seq_tokens
        return batch

    @staticmethod
    def merge_states(states: list[dict]) -> dict:
        """`merge_states` of every rank's `state_dict()` (the checkpointer asks the loader it holds)."""
        return merge_states(states)

    def state_dict(self) -> dict:
        """This rank's part of the loader state; `merge_states` joins all ranks' parts."""
        return {
            "version": self.version.version_id, "step": self.step, "tokens": self.tokens,
            "history": copy.deepcopy(self.history), "base": list(self._base),
            "num_shards": self.config.num_shards, "global_batch": self.config.global_batch,
            "seed": self.config.seed,
            "shards": {s: copy.deepcopy(self._taken[s]) for s in self.shards if self._taken[s] is not None},
        }

    def switch_to(self, version: MixVersion) -> None:
        """Stream `version` from the next step on (call between steps)."""
        if version.mix != self.version.mix:
            raise MixError(f"cannot switch from mix {self.version.mix} to another mix ({version.mix})")
        if version.tokenizer_version != self.version.tokenizer_version:
            raise MixError(f"{version.version_id} uses tokenizer {version.tokenizer_version}, the run uses "
                           f"{self.version.tokenizer_version}: a live switch cannot change the tokenizer")
        self._stop()
        previous = self.version
        self.version, self._ctx = version, self._context(version)
        self._base = (self.step, self.tokens)
        self.history.append({"step": self.step, "from": previous.version_id, "to": version.version_id})
        if self.run_id and self.rank == 0:
            self._record_switch(previous, version)
        self._start()

    def close(self) -> None:
        self._stop()

    # -- weights by step ------------------------------------------------------------------------
    def _weights_at_step(self, step: int) -> tuple[int, dict[str, float]]:
        base_step, base_tokens = self._base
        tokens = base_tokens + (step - base_step) * self.config.global_batch * self._ctx.seq_tokens
        if self.config.weights is not None:
            return 0, {t: self.config.weights.get(t, 0.0) for t in self.version.spec.weights}
        return self.version.stage_at(tokens)

    def _weights_for_sequence(self, i: int) -> dict[str, float]:
        """Weights for a shard's i-th sequence: every shard gives global_batch/num_shards
        sequences per step, so the i-th belongs to step i // that."""
        return self._weights_at_step(i // (self.config.global_batch // self.config.num_shards))[1]

    # -- producing ------------------------------------------------------------------------------
    def _context(self, version: MixVersion) -> StreamContext:
        problems = [p for ps in version_problems(self.lake, version).values() for p in ps]
        if problems:
            raise MixError(f"{version.version_id} cannot be streamed: " + "; ".join(problems))
        tokenizer = load_tokenizer(version.tokenizer_path)
        eos = tokenizer.token_to_id("<|eos|>")
        if eos is None:
            raise MixError(f"tokenizer {version.tokenizer_version} has no <|eos|> token")
        sources = {}
        for s in version.spec.sources:
            pin = version.pins[s.table]
            sources[s.table] = SourceContext(pin_snapshot(self.lake, s.table, pin.snapshot_id),
                                             self.lake.table(s.table), s.max_epochs, version.spec.heldout_fraction,
                                             s.max_doc_tokens)
        return StreamContext(version.version_id, sources, tokenizer, eos, version.spec.seq_len + 1,
                             self.config.num_shards, self.config.seed, self.config.batch_rows)

    def _start(self) -> None:
        streams = {s: LogicalStream(s, self._ctx, self._taken[s]) for s in self.shards}
        self._stop_event = threading.Event()
        self._inline: dict[int, Iterator] = {}
        self._queues: dict[int, queue.Queue] = {}
        self._threads: list[threading.Thread] = []
        workers = min(self.config.num_workers, len(self.shards))
        if workers == 0:
            self._inline = {s: self._produce([streams[s]]) for s in self.shards}
            return
        for w in range(workers):
            mine = [streams[s] for j, s in enumerate(self.shards) if j % workers == w]
            q: queue.Queue = queue.Queue(maxsize=self.config.prefetch)
            for st in mine:
                self._queues[st.shard] = q
            t = threading.Thread(target=self._work, args=(mine, q), daemon=True, name=f"mix-loader-{w}")
            t.start()
            self._threads.append(t)

    def _produce(self, streams: list[LogicalStream]) -> Iterator[Sequence | BaseException]:
        while True:
            for st in streams:
                try:
                    yield st.next_sequence(self._weights_for_sequence)
                except Exception as e:  # handed to the trainer's thread, raised there
                    yield e
                    return

    def _work(self, streams: list[LogicalStream], q: queue.Queue) -> None:
        for item in self._produce(streams):
            while not self._stop_event.is_set():
                try:
                    q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self._stop_event.is_set():
                return

    def _take(self, shard: int) -> Sequence:
        item = next(self._inline[shard]) if self._inline else self._queues[shard].get()
        if isinstance(item, RepetitionCapReached) and self.version.spec.on_cap == "stop":
            raise MixExhausted(str(item))
        if isinstance(item, BaseException):
            raise item
        assert item.shard == shard, f"loader produced shard {item.shard} where {shard} was due"
        return item

    def _stop(self) -> None:
        if not hasattr(self, "_stop_event"):
            return
        self._stop_event.set()
        for q in {id(q): q for q in self._queues.values()}.values():
            while not q.empty():
                q.get_nowait()
        for t in self._threads:
            t.join(timeout=30)
        self._threads, self._queues, self._inline = [], {}, {}

    def _record_switch(self, previous: MixVersion, version: MixVersion) -> None:
        self.lake.lineage.record(LineageRecord(
            version_id=f"run/{self.run_id}/mix-switch@{self.step}", kind="mix_switch",
            name=f"run/{self.run_id}", upstream=[previous.version_id, version.version_id],
            config_json=canonical_json({"step": self.step, "from": previous.version_id, "to": version.version_id}),
            code_version=code_version(), env_lock=env_lock_hash(), asset_key="training_run", run_id=self.run_id,
            metadata_json=canonical_json({"step": self.step, "tokens": self.tokens}),
        ))


def agreed_resolver(lake: Lake, mix: str) -> Callable[[], MixVersion | None]:
    """A `resolve` for data-parallel runs: rank 0 asks the lake, every rank gets its answer, so
    all ranks switch versions at the same step (each asking for itself could straddle a commit)."""
    import torch.distributed as dist

    def resolve() -> MixVersion | None:
        if not (dist.is_available() and dist.is_initialized()):
            return latest_version(lake, mix)
        box = [latest_version(lake, mix) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    return resolve


def _check_layout(config: LoaderConfig, rank: int, world_size: int) -> None:
    if not 0 <= rank < world_size:
        raise MixError(f"loader: rank {rank} is outside world size {world_size}")
    if config.num_shards % world_size:
        raise MixError(f"loader: world size {world_size} must divide num_shards={config.num_shards}")
    if config.global_batch % config.num_shards:
        raise MixError(f"loader: num_shards={config.num_shards} must divide global_batch={config.global_batch}")


def _check_state(state: dict, config: LoaderConfig) -> None:
    for key in ("num_shards", "global_batch", "seed"):
        if state.get(key) != getattr(config, key):
            raise MixError(f"loader state was saved with {key}={state.get(key)}, the config says "
                           f"{getattr(config, key)}: resuming would not continue the same stream")


def merge_states(states: list[dict]) -> dict:
    """One loader state from every rank's `state_dict()` (what a checkpoint stores)."""
    first = states[0]
    for s in states[1:]:
        for key in ("version", "step", "num_shards", "global_batch", "seed"):
            if s[key] != first[key]:
                raise MixError(f"loader states disagree on {key}: {first[key]} vs {s[key]}")
    merged = copy.deepcopy(first)
    merged["shards"] = {int(k): copy.deepcopy(v) for s in states for k, v in s["shards"].items()}
    return merged


def accounting(state: dict) -> dict:
    """From a merged state: {"versions": {version: {table: {sequences, tokens}}}, "epochs": {table: passes}}."""
    versions: dict = {}
    epochs: dict[str, list[float]] = {}
    for shard in state["shards"].values():
        for version, per_source in shard["counts"].items():
            for table, c in per_source.items():
                total = versions.setdefault(version, {}).setdefault(table, {"sequences": 0, "tokens": 0})
                total["sequences"] += c["sequences"]
                total["tokens"] += c["tokens"]
        for table, cursor in shard["cursors"].items():
            epochs.setdefault(table, []).append(cursor["epochs"])
    return {"versions": versions, "epochs": {t: round(sum(e) / len(e), 6) for t, e in epochs.items()}}
