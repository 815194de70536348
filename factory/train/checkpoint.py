"""Checkpoints of a training run: atomic files on disk, a manifest that vouches for them, a row in
Iceberg that makes them findable.

A checkpoint is `step-<step:08d>.pt` (whatever payload the trainer hands over — model, optimizer,
RNG and loader state — written by `torch.save`) plus `step-<step:08d>.json`, its manifest (sha256,
size, step, tokens, loss). Both are written to a temp file in the same directory, fsynced and
renamed into place, and the manifest goes last: a checkpoint without a manifest, or whose bytes do
not match it, is by definition incomplete. So a run killed at any moment (or a disk that truncated
a file) never resumes from half a checkpoint — `latest_valid` skips it, says why in the run log,
and returns the previous one. The file is hashed while it is written, not read back.

Loading uses `torch.load(weights_only=True)`: a payload holds tensors, dicts, lists, tuples and
Python scalars/str/bytes only. `torch.get_rng_state()` (a ByteTensor), `random.getstate()` and a
numpy `Generator`'s `bit_generator.state` (a dict of ints) load fine; the legacy
`np.random.get_state()` does not (it holds an ndarray) — store a `Generator` state instead.

`record_checkpoint` appends the checkpoint to `train.checkpoints` (which the eval sensor reads
with a cursor) and writes its lineage row (upstream: mix version, tokenizer, previous checkpoint).
The files go first, the table row second, the lineage row last — each step only refers to things
that already exist.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
from pydantic import BaseModel, ConfigDict
from pyiceberg.expressions import EqualTo

from factory.home import run_dir
from factory.lake.catalog import Lake
from factory.lake.commit import CommitStamp
from factory.lake.lineage import LineageRecord
from factory.lake.schemas import TRAIN_CHECKPOINTS
from factory.version import canonical_json, env_lock_hash

CHECKPOINTS_TABLE = "train.checkpoints"
_NAME = re.compile(r"^step-(\d{8,})\.pt$")
_TEMP_GLOB = ".step-*.tmp"  # temp files of unfinished writes: `.step-00000010.pt.<random>.tmp`
_CHUNK = 1 << 20


class CheckpointRef(BaseModel):
    """One complete checkpoint file of a run, as its manifest describes it."""

    model_config = ConfigDict(frozen=True)

    run: str
    step: int
    path: Path
    sha256: str
    bytes: int
    tokens: int
    loss: float | None
    created_at: dt.datetime

    @property
    def checkpoint_id(self) -> str:
        return f"ckpt/{self.run}@{self.step}"

    @property
    def uri(self) -> str:
        return self.path.resolve().as_uri()


def checkpoint_dir(home: Path, run: str) -> Path:
    """Where the checkpoints of `run` live: `<artifacts>/runs/<run>/checkpoints`."""
    return run_dir(home, run) / "checkpoints"


def manifest_path(path: Path) -> Path:
    return path.with_suffix(".json")


# -- writing ------------------------------------------------------------------------------------
class _HashingWriter:
    """A file wrapper that hashes and counts what `torch.save` writes through it."""

    def __init__(self, file):
        self.file, self.sha256, self.bytes = file, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha256.update(data)
        self.bytes += len(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def _atomic_write(
    final: Path, write: Callable[[Any], None], before_rename: Callable[[Path], None] | None
) -> None:
    """`write(file)` into a temp file next to `final`, fsync it, then rename it over `final`."""
    fd, temp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename(final)
        os.replace(temp, final)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _fsync_dir(directory: Path) -> None:
    # the renames are only durable once the directory entry is on disk too
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    directory: Path,
    step: int,
    payload: dict,
    *,
    run: str,
    tokens: int,
    loss: float | None,
    _before_rename: Callable[[Path], None] | None = None,
) -> CheckpointRef:
    """Write `payload` as the checkpoint of `step` in `directory`, atomically, manifest last.

    `_before_rename` is a test seam: it is called with the final path of each file (the `.pt`,
    then the `.json`) after its temp file is written and fsynced, before the rename — the moments
    a kill must not produce a valid-looking checkpoint.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step-{step:08d}.pt"
    hashed: list[_HashingWriter] = []

    def write_payload(f) -> None:
        import torch  # here, not at the top: reading train.checkpoints (`factory lineage`, `evals`) needs no torch

        writer = _HashingWriter(f)
        torch.save(payload, writer)
        hashed.append(writer)

    _atomic_write(path, write_payload, _before_rename)
    ref = CheckpointRef(
        run=run, step=step, path=path, sha256=hashed[0].sha256.hexdigest(), bytes=hashed[0].bytes,
        tokens=tokens, loss=loss, created_at=dt.datetime.now(dt.timezone.utc),
    )
    manifest = ref.model_dump(mode="json", exclude={"path"}) | {"file": path.name}
    _atomic_write(manifest_path(path), lambda f: f.write(canonical_json(manifest).encode()), _before_rename)
    _fsync_dir(directory)
    return ref


# -- reading ------------------------------------------------------------------------------------
def _read(path: Path) -> tuple[CheckpointRef | None, str | None]:
    """(ref, None) for a complete checkpoint file, else (None, why it is not)."""
    manifest = manifest_path(path)
    if not manifest.exists():
        return None, f"no manifest {manifest.name} (the write did not finish)"
    try:
        meta = json.loads(manifest.read_text())
        ref = CheckpointRef(path=path, **{k: v for k, v in meta.items() if k != "file"})
    except (OSError, ValueError) as e:  # pydantic's ValidationError is a ValueError
        return None, f"unreadable manifest {manifest.name}: {e}"
    named = _NAME.match(path.name)
    if named is None or int(named[1]) != ref.step:
        return None, f"manifest {manifest.name} is for step {ref.step}, not for {path.name}"
    try:
        size = path.stat().st_size
        if size != ref.bytes:
            return None, f"size mismatch: {size} bytes on disk, manifest says {ref.bytes} (truncated?)"
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    except OSError as e:
        return None, f"unreadable: {e}"
    if digest.hexdigest() != ref.sha256:
        return None, f"sha256 mismatch: file {digest.hexdigest()[:16]}…, manifest {ref.sha256[:16]}… (corrupt bytes)"
    return ref, None


def validate(path: Path) -> str | None:
    """None when the checkpoint at `path` (the `.pt`) is complete and intact, else the reason."""
    return _read(Path(path))[1]


def _by_step_newest_first(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    found = [(int(m[1]), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def latest_valid(directory: Path, log: Callable[[str], None]) -> CheckpointRef | None:
    """The newest intact checkpoint in `directory`; each newer broken one is reported to `log`
    (the run log) with its reason and skipped. None when there is no intact checkpoint."""
    for path in _by_step_newest_first(Path(directory)):
        ref, reason = _read(path)
        if ref is not None:
            return ref
        log(f"checkpoint {path} is not usable: {reason}; falling back to the previous one")
    return None


def load_checkpoint(ref: CheckpointRef) -> dict:
    """The payload of `ref`, on CPU, through the weights-only unpickler (no arbitrary code)."""
    import torch

    return torch.load(ref.path, weights_only=True, map_location="cpu")


def prune(directory: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` intact checkpoints; return what was deleted.

    Everything older than the newest intact checkpoint that is not among the kept ones goes —
    broken checkpoints included — and so do temp files of unfinished writes older than it.
    Broken checkpoints *newer* than it stay: one may be a save in progress (file renamed, manifest
    not yet), and `latest_valid` keeps reporting them. A manifest is deleted before its file, so
    a prune interrupted halfway leaves an incomplete checkpoint, never a wrong one.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last={keep_last}: the newest intact checkpoint is always kept")
    directory = Path(directory)
    kept: list[Path] = []
    doomed: list[Path] = []
    for path in _by_step_newest_first(directory):
        if len(kept) == keep_last:
            doomed.append(path)  # older than every kept one: no need to hash it
        elif validate(path) is None:
            kept.append(path)
        elif kept:
            doomed.append(path)
    if not kept:
        return []
    deleted: list[Path] = []
    for path in doomed:
        for p in (manifest_path(path), path):
            if p.exists():
                p.unlink()
                deleted.append(p)
    newest = kept[0].stat().st_mtime
    for temp in sorted(directory.glob(_TEMP_GLOB)):
        if temp.stat().st_mtime < newest:
            temp.unlink()
            deleted.append(temp)
    return deleted


# -- the lake -----------------------------------------------------------------------------------
def record_checkpoint(
    lake: Lake,
    ref: CheckpointRef,
    *,
    experiment: str,
    mix_version: str,
    config_hash: str,
    eval_every: int,
    upstream: list[str],
    run_id: str = "",
    asset_key: str = "training_run",
) -> None:
    """Append `ref` to `train.checkpoints` and write its lineage row (kind `checkpoint`).

    `upstream` is what the checkpoint was trained from: the mix version id, the tokenizer version
    id and the previous checkpoint id (absent for the first one).
    """
    stamp = CommitStamp(asset_key=asset_key, config_hash=config_hash, run_id=run_id, content_hash=ref.sha256,
                        upstream=lake.lineage.upstream_snapshots(list(upstream)))
    row = {
        "checkpoint_id": ref.checkpoint_id, "run": ref.run, "experiment": experiment, "step": ref.step,
        "tokens": ref.tokens, "uri": ref.uri, "sha256": ref.sha256, "bytes": ref.bytes, "loss": ref.loss,
        "mix_version": mix_version, "config_hash": config_hash, "eval_every": eval_every,
        "code_version": stamp.code_version, "created_at": ref.created_at,
    }
    data = pa.Table.from_pylist([row], schema=TRAIN_CHECKPOINTS.as_arrow())
    lake.commit(CHECKPOINTS_TABLE, data, stamp, schema=TRAIN_CHECKPOINTS, lineage=LineageRecord(
        version_id=ref.checkpoint_id, kind="checkpoint", name=f"run/{ref.run}", uri=ref.uri,
        content_hash=ref.sha256, upstream=list(upstream), config_hash=config_hash,
        code_version=stamp.code_version, env_lock=env_lock_hash(), asset_key=asset_key, run_id=run_id,
        created_at=ref.created_at,
        metadata_json=canonical_json({"step": ref.step, "tokens": ref.tokens, "loss": ref.loss,
                                      "bytes": ref.bytes, "experiment": experiment}),
    ))


def checkpoints(lake: Lake, run: str | None = None) -> list[dict]:
    """Rows of `train.checkpoints` (of `run`, or of every run), ordered by step."""
    if not lake.has_table(CHECKPOINTS_TABLE):
        return []
    table = lake.table(CHECKPOINTS_TABLE)
    rows = (table.scan(row_filter=EqualTo("run", run)) if run else table.scan()).to_arrow().to_pylist()
    return sorted(rows, key=lambda r: (r["step"], r["run"], r["created_at"]))
