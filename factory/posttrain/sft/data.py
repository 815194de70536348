"""Fine-tuning data: instruction/response examples built from synthetic rows, and packed batches of them.

**Examples** (`sft.examples`): a dataset turns each row of its source table into a conversation.
`porting` asks for a program that solves a word problem and answers with the program the synthetic
pipeline generated and the sandbox checked (it computes the stated answer). `podium` answers each
decisive Podium battle's prompt with the response its voter chose (`podium.preferences`). Every example keeps its
provenance: source table and snapshot, the synthetic row's id, seed, agent chain and verdicts.
`build_examples` rebuilds a dataset from the source's current snapshot in one overwrite commit with its
lineage row (upstream: that snapshot), and does nothing when the dataset was already built from it;
the returned version (`sft.examples@<snapshot>`) is what a run trains on and its checkpoints point to.

**Packing** (`pack`): examples are encoded in the chat format (factory.tokenize.chat), shuffled per
epoch by the seed, and laid end to end into rows of seq_len + 1 tokens; an example never straddles two
rows, the rest of a row is padding. Each row carries its segments (which example each position
belongs to: attention stays inside an example, `Transformer.forward`'s doc_ids) and the loss mask
(targets inside an assistant answer). An example longer than a row is left out and counted, never
truncated: half an answer would teach the model to stop mid-program.

**Split**: an example is held out when the hash of its id falls under `heldout_fraction`
(factory.data.split), so the split is stable across rebuilds and seeds.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
from pyiceberg.expressions import EqualTo

from factory.lake import Lake
from factory.lake.commit import CommitStamp
from factory.lake.lineage import SNAPSHOT, LineageRecord, table_version_id
from factory.lake.schemas import SFT_EXAMPLES
from factory.version import canonical_json, env_lock_hash

EXAMPLES_TABLE = "sft.examples"


@dataclass(frozen=True)
class Dataset:
    source: str  # the table its examples come from
    to_messages: Callable[[dict], list[dict]]  # a source row -> the conversation
    provenance: Callable[[dict], dict]  # a source row -> source_id, seed_id, agent_chain, verdicts


def _porting_messages(row: dict) -> list[dict]:
    fields = json.loads(row["fields"])
    return [{"role": "user", "content": "Write a Python program that solves this problem and asserts its answer.\n"
                                        + fields["question"]},
            {"role": "assistant", "content": row["text"]}]


def _synthetic_provenance(row: dict) -> dict:
    return {"source_id": row["doc_id"], "seed_id": row["seed_id"], "agent_chain": row["agent_chain"],
            "verdicts": row["verdicts"]}


def _podium_messages(row: dict) -> list[dict]:
    return [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["chosen"]}]


def _podium_provenance(row: dict) -> dict:
    return {"source_id": row["battle_id"], "seed_id": "", "agent_chain": [row["chosen_export"]],
            "verdicts": json.dumps({"user": row["user"], "chosen_over": row["rejected_export"]}, sort_keys=True)}


# `podium`: the answers people chose in Podium's battles (podium.preferences), each with its battle,
# its voter and the export it beat.
DATASETS: dict[str, Dataset] = {"porting": Dataset("synthetic.porting", _porting_messages, _synthetic_provenance),
                                "podium": Dataset("podium.preferences", _podium_messages, _podium_provenance)}


@dataclass(frozen=True)
class ExamplesVersion:
    dataset: str
    version_id: str  # sft.examples@<snapshot>
    snapshot_id: int
    rows: int
    new: bool


def build_examples(lake: Lake, dataset: str, *, run_id: str = "", asset_key: str = "sft_run") -> ExamplesVersion:
    """`dataset`'s examples from its source's current snapshot (module docstring)."""
    spec = DATASETS[dataset]
    source = lake.table(spec.source)
    snapshot = source.current_snapshot()
    if snapshot is None:
        raise ValueError(f"dataset {dataset}: {spec.source} has no snapshot yet")
    built = _built_from(lake, dataset)
    if built is not None and built[0] == snapshot.snapshot_id:
        return ExamplesVersion(dataset, table_version_id(EXAMPLES_TABLE, built[1]), built[1], built[2], new=False)
    now = dt.datetime.now(dt.timezone.utc)
    rows, seen = [], set()
    for row in source.scan(snapshot_id=snapshot.snapshot_id).to_arrow().to_pylist():
        messages = spec.to_messages(row)
        prompt = next(m["content"] for m in messages if m["role"] == "user")
        response = next(m["content"] for m in messages if m["role"] == "assistant")
        example_id = hashlib.sha256(f"{dataset}\0{prompt}\0{response}".encode()).hexdigest()[:24]
        if example_id in seen:
            continue
        seen.add(example_id)
        rows.append({"dataset": dataset, "example_id": example_id, "messages": json.dumps(messages), "prompt": prompt,
                     "response": response, "source_table": spec.source, "source_snapshot": snapshot.snapshot_id,
                     **spec.provenance(row), "created_at": now})
    if not rows:
        raise ValueError(f"dataset {dataset}: {spec.source}@{snapshot.snapshot_id} holds no rows")
    rows.sort(key=lambda r: r["example_id"])
    upstream = [table_version_id(spec.source, snapshot.snapshot_id)]
    config = canonical_json({"dataset": dataset, "source": spec.source})
    stamp = CommitStamp(asset_key=asset_key, config_hash=hashlib.sha256(config.encode()).hexdigest()[:16],
                        run_id=run_id, upstream=lake.lineage.upstream_snapshots(upstream))
    lake.ensure_table(EXAMPLES_TABLE, SFT_EXAMPLES)
    lineage = LineageRecord(
        version_id=table_version_id(EXAMPLES_TABLE, SNAPSHOT), kind="sft_examples", name=EXAMPLES_TABLE,
        uri=lake.table(EXAMPLES_TABLE).location(), upstream=upstream, config_json=config,
        config_hash=stamp.config_hash, code_version=stamp.code_version, env_lock=env_lock_hash(),
        asset_key=asset_key, run_id=run_id, metadata_json=canonical_json({"dataset": dataset, "examples": len(rows)}))
    commit = lake.commit(EXAMPLES_TABLE, pa.Table.from_pylist(rows, schema=SFT_EXAMPLES.as_arrow()), stamp,
                         mode="overwrite", overwrite_filter=EqualTo("dataset", dataset), lineage=lineage)
    return ExamplesVersion(dataset, table_version_id(EXAMPLES_TABLE, commit.snapshot_id), commit.snapshot_id,
                           len(rows), new=True)


def _built_from(lake: Lake, dataset: str) -> tuple[int, int, int] | None:
    """(source snapshot, sft.examples snapshot, rows) of the dataset as it stands, or None."""
    if not lake.has_table(EXAMPLES_TABLE):
        return None
    table = lake.table(EXAMPLES_TABLE)
    snapshot = table.current_snapshot()
    if snapshot is None:
        return None
    got = table.scan(row_filter=EqualTo("dataset", dataset), selected_fields=("source_snapshot",)).to_arrow()
    if got.num_rows == 0:
        return None
    return got.column("source_snapshot")[0].as_py(), snapshot.snapshot_id, got.num_rows


def read_examples(lake: Lake, version_id: str, dataset: str, *, heldout_fraction: float, heldout: bool) -> list[dict]:
    """The train (or held-out) examples of `dataset` at `version_id`, in example_id order."""
    from factory.data.split import doc_hashes, heldout_mask

    snapshot = int(version_id.rpartition("@")[2])
    rows = lake.table(EXAMPLES_TABLE).scan(snapshot_id=snapshot, row_filter=EqualTo("dataset", dataset)) \
        .to_arrow().to_pylist()
    rows.sort(key=lambda r: r["example_id"])
    held = heldout_mask(doc_hashes([r["example_id"] for r in rows]), heldout_fraction)
    return [r for r, h in zip(rows, held) if bool(h) == heldout]


# -- packing -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Packed:
    tokens: np.ndarray  # [rows, seq_len + 1] int64
    loss_mask: np.ndarray  # [rows, seq_len] bool: target t+1 of position t counts
    segments: np.ndarray  # [rows, seq_len] int64: example index of each input position (-1 = padding)
    example_ids: list[list[str]]
    dropped: int  # examples longer than a row


def encode_examples(tokenizer, examples: list[dict]):
    from factory.tokenize.chat import encode_chat

    return [encode_chat(tokenizer, json.loads(e["messages"])) for e in examples]


def pack(encoded: list, ids: list[str], seq_len: int, pad_id: int, order: list[int] | None = None) -> Packed:
    """Lay the encoded examples (in `order`) end to end into rows of seq_len + 1 tokens (module docstring)."""
    width = seq_len + 1
    rows: list[list[int]] = []
    current: list[int] = []
    used = dropped = 0
    for i in order if order is not None else range(len(encoded)):
        n = len(encoded[i].ids)
        if n > width:
            dropped += 1
            continue
        if used + n > width:
            rows.append(current)
            current, used = [], 0
        current.append(i)
        used += n
    if current:
        rows.append(current)
    tokens = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=bool)
    segments = np.full((len(rows), width), -1, dtype=np.int64)
    for r, members in enumerate(rows):
        at = 0
        for i in members:
            e = encoded[i]
            tokens[r, at:at + len(e.ids)] = e.ids
            mask[r, at:at + len(e.ids)] = e.mask
            segments[r, at:at + len(e.ids)] = i
            at += len(e.ids)
    # the loss at input position t predicts token t + 1: count it when token t + 1 is an answer token
    # (an example's first token is <|bos|>, never counted, so no target crosses into the next example)
    return Packed(tokens, mask[:, 1:], segments[:, :-1], [[ids[i] for i in m] for m in rows], dropped)


class SFTLoader:
    """Batches of packed rows for one rank, epoch after epoch (each reshuffled by the seed); the mix
    loader's protocol (factory.train.trainer.FineTune). State: the step and the examples version, so a
    resumed run continues with the next batch of the same data."""

    def __init__(self, lake: Lake, version: ExamplesVersion, tokenizer, *, dataset: str, seq_len: int,
                 global_batch: int, seed: int, heldout_fraction: float, rank: int = 0, world_size: int = 1,
                 state: dict | None = None):
        from factory.tokenize.bpe import SPECIAL_TOKENS

        if state is not None and state.get("version") != version.version_id:
            raise ValueError(f"the checkpoint's loader read {state.get('version')}, not {version.version_id}: "
                             "a resumed run must continue on the examples it started with")
        self.version = version
        examples = read_examples(lake, version.version_id, dataset, heldout_fraction=heldout_fraction, heldout=False)
        if not examples:
            raise ValueError(f"{version.version_id}: dataset {dataset} has no training examples")
        self.encoded = encode_examples(tokenizer, examples)
        self.ids = [e["example_id"] for e in examples]
        self.seq_len, self.seed, self.pad = seq_len, seed, tokenizer.token_to_id(SPECIAL_TOKENS["pad"])
        if global_batch % world_size:
            raise ValueError(f"global_batch={global_batch} must be a multiple of the world size {world_size}")
        self.global_batch, self.rank, self.world = global_batch, rank, world_size
        self.step = int(state["step"]) if state else 0
        self._packed: tuple[int, Packed] | None = None  # the epoch in use
        self._rows: list[int] = []  # rows of epochs 0, 1, ... (each shuffle packs a little differently)
        self.dropped = self._epoch(0).dropped
        if not len(self._epoch(0).tokens):
            raise ValueError(f"{version.version_id}: every example is longer than seq_len={seq_len} + 1 tokens")

    def _epoch(self, epoch: int) -> Packed:
        if self._packed is None or self._packed[0] != epoch:
            order = list(range(len(self.encoded)))
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
            self._packed = (epoch, pack(self.encoded, self.ids, self.seq_len, self.pad, order))
        return self._packed[1]

    def _row(self, index: int) -> tuple[Packed, int]:
        """Row `index` of the stream of epochs."""
        epoch = 0
        while True:
            if epoch == len(self._rows):
                self._rows.append(len(self._epoch(epoch).tokens))
            if index < self._rows[epoch]:
                return self._epoch(epoch), index
            index -= self._rows[epoch]
            epoch += 1

    def next_batch(self):
        import torch

        from factory.mix.loader import Batch

        per_rank = self.global_batch // self.world
        first = self.step * self.global_batch + self.rank * per_rank
        picked = [self._row(first + k) for k in range(per_rank)]
        self.step += 1
        return Batch(step=self.step, tokens=torch.from_numpy(np.stack([p.tokens[r] for p, r in picked])),
                     sources=[self.version.dataset] * per_rank, doc_ids=[p.example_ids[r] for p, r in picked],
                     version_id=self.version.version_id, stage=0,
                     loss_mask=torch.from_numpy(np.stack([p.loss_mask[r] for p, r in picked])),
                     segments=torch.from_numpy(np.stack([p.segments[r] for p, r in picked])))

    def state_dict(self) -> dict:
        return {"step": self.step, "version": self.version.version_id}

    @staticmethod
    def merge_states(states: list[dict]) -> dict:
        return states[0]  # every rank walks the same rows in lockstep

    def close(self) -> None:
        pass
