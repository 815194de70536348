"""Train a byte-level BPE on a deterministic sample of lake tables; save it content-addressed.

Sample: for each source table at its current snapshot, the training-side documents (held-out
ones excluded, `factory.data.split`) whose split hash falls under a rate chosen so that the
expected sample is `sample_bytes_per_source` — the same documents every time for the same
snapshot, streamed batch by batch, never the whole table. Documents are fed to the trainer in
a fixed order, so the same sample gives the same `tokenizer.json`, byte for byte.

Artifact: `$FACTORY_HOME/artifacts/tokenizers/<name>-<sha256[:12]>/tokenizer.json` (a Hugging
Face `tokenizers` file that `PreTrainedTokenizerFast(tokenizer_file=...)` loads) plus
`meta.json` (special-token ids, sampled snapshots, bytes per token per source measured on held-out
documents). A lineage row (kind `tokenizer`) points at the sampled snapshots.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, field_validator
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from factory.data.split import DEFAULT_HELDOUT_FRACTION, doc_hashes, heldout_mask, uniform
from factory.home import artifacts_dir, uri_to_path
from factory.lake import Lake
from factory.lake.lineage import LineageRecord, table_version_id
from factory.lake.scan import pin_snapshot, stream_snapshot
from factory.version import canonical_json, code_version, config_hash, env_lock_hash

# bos/eos/pad plus the three fill-in-the-middle markers (prefix-suffix-middle order, as in
# StarCoder/Code Llama); ids 0..5 in this order, ahead of the byte alphabet.
SPECIAL_TOKENS = {
    "bos": "<|bos|>",
    "eos": "<|eos|>",
    "pad": "<|pad|>",
    "fim_prefix": "<|fim_prefix|>",
    "fim_middle": "<|fim_middle|>",
    "fim_suffix": "<|fim_suffix|>",
}


class TokenizerError(ValueError):
    """A tokenizer could not be trained or found; the message names the input."""


class TokenizerConfig(BaseModel):
    """What to train: vocabulary, special tokens and the sample."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field("default", description="Artifact name: tokenizer/<name> in lineage.")
    vocab_size: int = Field(8192, ge=262, le=262_144, description="Tokens, specials and the 256 bytes included.")
    min_frequency: int = Field(2, ge=1, description="A merge needs this many occurrences in the sample.")
    special_tokens: dict[str, str] = Field(default_factory=lambda: dict(SPECIAL_TOKENS),
                                           description="Role -> token string; bos, eos and pad required.")
    sources: list[str] = Field(description="Tables to sample, e.g. refined.python_stdlib.")
    sample_bytes_per_source: int = Field(4_000_000, gt=0, description="Expected UTF-8 bytes sampled per table.")
    measure_bytes_per_source: int = Field(1_000_000, gt=0, description="Held-out bytes per table to measure bytes/token on.")
    heldout_fraction: float = Field(DEFAULT_HELDOUT_FRACTION, ge=0, lt=1,
                                    description="Documents under this split hash are never sampled.")

    @field_validator("special_tokens")
    @classmethod
    def _roles(cls, v: dict[str, str]) -> dict[str, str]:
        missing = {"bos", "eos", "pad"} - set(v)
        if missing:
            raise ValueError(f"special_tokens needs roles {sorted(missing)}")
        if len(set(v.values())) != len(v):
            raise ValueError("special_tokens: two roles share one token string")
        return v

    @field_validator("sources")
    @classmethod
    def _sources(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("sources: name at least one table")
        if len(set(v)) != len(v):
            raise ValueError("sources: a table is listed twice")
        return v


class TokenizerArtifact(BaseModel):
    """A trained tokenizer on disk and what it was trained on."""

    model_config = ConfigDict(frozen=True)

    name: str
    version_id: str
    path: str = Field(description="Directory holding tokenizer.json and meta.json.")
    content_hash: str
    vocab_size: int
    special_ids: dict[str, int]
    sampled: dict[str, int] = Field(description="Table -> snapshot id sampled.")
    sample_docs: dict[str, int]
    sample_bytes: dict[str, int]
    bytes_per_token: dict[str, float] = Field(description="Measured on held-out documents of each table.")
    seconds: float = 0.0
    new: bool = Field(True, description="False when this exact tokenizer was already in the lake.")

    @property
    def file(self) -> str:
        return os.path.join(self.path, "tokenizer.json")


def train_tokenizer(
    lake: Lake,
    config: TokenizerConfig,
    *,
    run_id: str = "",
    asset_key: str = "tokenizer",
    log: Callable[[str], None] = lambda _: None,
) -> TokenizerArtifact:
    """Sample, train, save content-addressed, and record lineage; returns the artifact."""
    started = time.monotonic()
    pins = {t: pin_snapshot(lake, t) for t in config.sources}
    sample, measure = {}, {}
    for table, pinned in pins.items():
        if pinned.rows == 0:
            raise TokenizerError(f"tokenizer {config.name}: table {table} is empty")
        sample[table], measure[table] = _sample(lake, pinned, config)
        log(f"sampled {len(sample[table]):,} documents ({sum(map(len, sample[table])):,} chars) from {table}")
    texts = [t for table in config.sources for t in sample[table]]
    if not texts:
        raise TokenizerError(f"tokenizer {config.name}: the sample is empty (tables {config.sources})")

    tokenizer = _new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size, min_frequency=config.min_frequency, show_progress=False,
        special_tokens=list(config.special_tokens.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    log(f"trained a {tokenizer.get_vocab_size():,}-token BPE in {time.monotonic() - started:.1f} s")

    blob = tokenizer.to_str().encode()
    digest = hashlib.sha256(blob).hexdigest()
    directory = artifacts_dir(lake.home) / "tokenizers" / f"{config.name}-{digest[:12]}"
    artifact = TokenizerArtifact(
        name=config.name,
        version_id=f"tokenizer/{config.name}@{digest[:12]}",
        path=str(directory),
        content_hash=digest,
        vocab_size=tokenizer.get_vocab_size(),
        special_ids={role: tokenizer.token_to_id(tok) for role, tok in config.special_tokens.items()},
        sampled={t: p.snapshot_id for t, p in pins.items()},
        sample_docs={t: len(s) for t, s in sample.items()},
        sample_bytes={t: sum(len(x.encode()) for x in s) for t, s in sample.items()},
        bytes_per_token={t: bytes_per_token(tokenizer, measure[t] or sample[t][:200]) for t in config.sources},
        seconds=round(time.monotonic() - started, 2),
    )
    _save(directory, blob, artifact)
    if lake.lineage.records(version_id=artifact.version_id):
        log(f"{artifact.version_id} is already in the lake: same sample, same tokenizer")
        return artifact.model_copy(update={"new": False})
    lake.lineage.record(LineageRecord(
        version_id=artifact.version_id, kind="tokenizer", name=f"tokenizer/{config.name}",
        uri=directory.as_uri(), content_hash=digest,
        upstream=[table_version_id(t, s) for t, s in sorted(artifact.sampled.items())],
        config_json=canonical_json(config), config_hash=config_hash(config),
        code_version=code_version(), env_lock=env_lock_hash(), asset_key=asset_key, run_id=run_id,
        metadata_json=canonical_json(artifact.model_dump(exclude={"path", "name", "version_id"})),
    ))
    return artifact


def _new_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sample(lake: Lake, pinned, config: TokenizerConfig) -> tuple[list[str], list[str]]:
    """(training-side sample, held-out measurement set) of one snapshot. Both pick documents by
    hash at a rate aimed at their byte budgets, so neither depends on the table's file layout."""
    total = sum(pc.sum(b.column("bytes")).as_py() or 0
                for b in stream_snapshot(lake, pinned, ["bytes"], batch_rows=65_536))
    rate = min(1.0, config.sample_bytes_per_source / max(total, 1))
    held_rate = min(1.0, config.measure_bytes_per_source / max(total * config.heldout_fraction, 1))
    sample, measure = [], []
    for batch in stream_snapshot(lake, pinned, ["doc_id", "text"]):
        hashes = doc_hashes(batch.column("doc_id").to_pylist())
        held, u = heldout_mask(hashes, config.heldout_fraction), uniform(hashes)
        texts = batch.column("text")
        measure += texts.filter(pa.array(held & (u < held_rate))).to_pylist()
        sample += texts.filter(pa.array(~held & (u < rate))).to_pylist()
    return sample, measure


def _save(directory: Path, blob: bytes, artifact: TokenizerArtifact) -> None:
    """Write into a temp dir and rename: a reader never sees a half-written tokenizer."""
    if (directory / "meta.json").exists():
        return  # content-addressed: the same bytes are already there
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.parent / f".{directory.name}.tmp-{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    (tmp / "tokenizer.json").write_bytes(blob)
    (tmp / "meta.json").write_text(json.dumps(artifact.model_dump(exclude={"path"}), indent=2, sort_keys=True))
    try:
        tmp.rename(directory)
    except OSError:
        if not (directory / "meta.json").exists():
            raise


def bytes_per_token(tokenizer: Tokenizer, texts: list[str]) -> float:
    """UTF-8 bytes per token over `texts` (0.0 for no text)."""
    tokens = sum(len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False))
    return round(sum(len(t.encode()) for t in texts) / tokens, 4) if tokens else 0.0


def load_tokenizer(path: str) -> Tokenizer:
    """A tokenizer from an artifact directory, its `tokenizer.json`, or a `file://` URI of either."""
    p = uri_to_path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.exists():
        raise TokenizerError(f"tokenizer file {file} does not exist")
    return Tokenizer.from_file(str(file))


def latest_tokenizer(lake: Lake, name: str) -> TokenizerArtifact:
    """The newest trained tokenizer called `name`, from lineage."""
    records = lake.lineage.records(kind="tokenizer", name=f"tokenizer/{name}")
    if not records:
        raise TokenizerError(f"no tokenizer named {name!r} in the lake: materialize the tokenizer asset first")
    return artifact_of(records[-1])


def tokenizer_artifact(lake: Lake, version_id: str) -> TokenizerArtifact:
    """The tokenizer `tokenizer/<name>@<hash>`, from its lineage row."""
    records = lake.lineage.records(version_id=version_id)
    if not records or records[-1].kind != "tokenizer":
        raise TokenizerError(f"{version_id}: no such tokenizer in the lake's lineage")
    return artifact_of(records[-1])


def artifact_of(record) -> TokenizerArtifact:
    """A tokenizer lineage row as the artifact it records."""
    name = record.version_id.removeprefix("tokenizer/").split("@")[0]
    path = str(uri_to_path(record.uri)) if record.uri else ""
    return TokenizerArtifact(name=name, version_id=record.version_id, path=path, **record.metadata)
