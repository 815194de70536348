"""Mix versions: a spec pinned to table snapshots and a tokenizer, stored in `mixes.versions`.

`register_mix_version` is the one way a version comes to exist (the `mix` asset, the CLI, the
synthetic-data sensor and the auto-mixer all call it). It pins each table to its current
snapshot, measures rows and bytes of the training split (held-out documents excluded) and
estimates tokens with the pinned tokenizer, then commits one row per (stage, source) in a single
Iceberg commit and a lineage row `mix/<name>@v<N>` whose upstream are the pinned snapshots and
the tokenizer. Registering an unchanged plan (same spec, same pins, same tokenizer) returns the
existing version and commits nothing.

Versions are immutable; a run that follows a mix by name switches to a newer one at a step
boundary (`factory.mix.loader`).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict
from pyiceberg.expressions import EqualTo

from factory.data.split import doc_hashes, heldout_mask
from factory.data.split import uniform as _uniform
from factory.lake import CommitStamp, Lake, LakeError
from factory.lake.lineage import LineageRecord, table_version_id
from factory.lake.scan import pin_snapshot, stream_snapshot
from factory.lake.schemas import MIX_VERSIONS
from factory.mix.spec import WEIGHT_TOLERANCE, MixError, MixSpec
from factory.tokenize import TokenizerError, bytes_per_token, latest_tokenizer, load_tokenizer
from factory.version import canonical_json, code_version, config_hash, env_lock_hash

MIX_VERSIONS_TABLE = "mixes.versions"
MEASURE_BYTES = 256_000  # training-split bytes tokenized to estimate a source's bytes per token


class PinnedSource(BaseModel):
    """One source of a version, pinned."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    table: str
    snapshot_id: int
    rows: int
    train_rows: int
    bytes: int
    bytes_per_token: float
    token_estimate: int


class MixVersion(BaseModel):
    """An immutable, streamable mix: spec + pins + tokenizer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mix: str
    version: int
    spec: MixSpec
    pins: dict[str, PinnedSource]
    tokenizer_version: str
    tokenizer_path: str
    plan_hash: str
    created_at: dt.datetime

    @property
    def version_id(self) -> str:
        return f"mix/{self.mix}@v{self.version}"

    def stage_at(self, tokens: int) -> tuple[int, dict[str, float]]:
        """(stage index, weights) in force once `tokens` tokens have been consumed."""
        for i, stage in enumerate(self.spec.stages):
            if tokens < stage.until_tokens:
                return i, {t: stage.weights.get(t, 0.0) for t in self.spec.weights}
        return len(self.spec.stages), self.spec.weights


def register_mix_version(
    lake: Lake,
    spec: MixSpec,
    *,
    run_id: str = "",
    asset_key: str = "mix",
    extra_upstream: list[str] | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> tuple[MixVersion, bool]:
    """Pin `spec` and store it as the mix's next version; `(version, created)`."""
    try:
        tokenizer = latest_tokenizer(lake, spec.tokenizer)
    except TokenizerError as e:
        raise MixError(f"mix {spec.name}: {e}") from None
    pins = {}
    for source in spec.sources:
        pins[source.table] = _pin(lake, spec, source.table, tokenizer)
        p = pins[source.table]
        log(f"{source.table}@{p.snapshot_id}: {p.train_rows:,} training rows, ~{p.token_estimate:,} tokens")
    plan = {"spec": spec.model_dump(mode="json"), "tokenizer": tokenizer.version_id,
            "pins": {t: [p.snapshot_id, p.train_rows] for t, p in pins.items()}}
    plan_hash = config_hash(plan)
    previous = mix_versions(lake, spec.name)
    if previous and previous[-1].plan_hash == plan_hash:
        return previous[-1], False
    version = MixVersion(
        mix=spec.name, version=previous[-1].version + 1 if previous else 1, spec=spec, pins=pins,
        tokenizer_version=tokenizer.version_id, tokenizer_path=tokenizer.path, plan_hash=plan_hash,
        created_at=dt.datetime.now(dt.timezone.utc),
    )
    stamp = CommitStamp(asset_key=asset_key, config_hash=config_hash(spec), run_id=run_id, partition=spec.name,
                        upstream={t: p.snapshot_id for t, p in pins.items()}, content_hash=plan_hash)
    lake.commit(MIX_VERSIONS_TABLE, _rows(version), stamp, schema=MIX_VERSIONS, lineage=LineageRecord(
        version_id=version.version_id, kind="mix_version", name=f"mix/{spec.name}",
        uri=f"iceberg://{MIX_VERSIONS_TABLE}?version_id={version.version_id}", content_hash=plan_hash,
        upstream=[table_version_id(t, p.snapshot_id) for t, p in sorted(pins.items())]
        + [tokenizer.version_id] + list(extra_upstream or []),
        config_json=canonical_json(spec), config_hash=config_hash(spec), code_version=code_version(),
        env_lock=env_lock_hash(), asset_key=asset_key, partition=spec.name, run_id=run_id,
        metadata_json=canonical_json({"weights": spec.weights, "seq_len": spec.seq_len,
                                      "token_estimate": sum(p.token_estimate for p in pins.values())}),
    ))
    return version, True


def _pin(lake: Lake, spec: MixSpec, table: str, tokenizer) -> PinnedSource:
    where = f"mix {spec.name}: source {table}"
    if not lake.has_table(table):
        raise MixError(f"{where} does not exist in the lake (materialize it first)")
    try:
        pinned = pin_snapshot(lake, table)
    except LakeError as e:
        raise MixError(f"{where}: {e}") from None
    rows = train_rows = train_bytes = 0
    for batch in stream_snapshot(lake, pinned, ["doc_id", "bytes"], batch_rows=65_536):
        keep = ~heldout_mask(doc_hashes(batch.column("doc_id").to_pylist()), spec.heldout_fraction)
        rows += batch.num_rows
        train_rows += int(keep.sum())
        train_bytes += pc.sum(batch.column("bytes").filter(pa.array(keep))).as_py() or 0
    if rows == 0:
        raise MixError(f"{where} is empty at snapshot {pinned.snapshot_id}")
    if train_rows == 0:
        raise MixError(f"{where} has {rows} rows, all in the held-out split: nothing to train on")
    bpt = tokenizer.bytes_per_token.get(table) or _measure(lake, pinned, spec, tokenizer, train_bytes)
    return PinnedSource(table=table, snapshot_id=pinned.snapshot_id, rows=rows, train_rows=train_rows,
                        bytes=train_bytes, bytes_per_token=bpt, token_estimate=int(train_bytes / max(bpt, 1e-9)))


def _measure(lake: Lake, pinned, spec: MixSpec, tokenizer, train_bytes: int) -> float:
    """Bytes per token on ~MEASURE_BYTES of training documents picked by hash (not file order,
    so the estimate does not depend on how the table's files happen to be laid out)."""
    rate = min(1.0, MEASURE_BYTES / max(train_bytes, 1))
    sample = []
    for batch in stream_snapshot(lake, pinned, ["doc_id", "text"]):
        hashes = doc_hashes(batch.column("doc_id").to_pylist())
        pick = ~heldout_mask(hashes, spec.heldout_fraction) & (_uniform(hashes) < rate)
        sample += batch.column("text").filter(pa.array(pick)).to_pylist()
    return bytes_per_token(load_tokenizer(tokenizer.path), sample)


def _rows(v: MixVersion) -> pa.Table:
    plan_json = v.model_dump_json()
    stages = [(s.until_tokens, s.weights) for s in v.spec.stages] + [(None, v.spec.weights)]
    rows = []
    for i, (until, weights) in enumerate(stages):
        for source in v.spec.sources:
            p = v.pins[source.table]
            rows.append({
                "mix": v.mix, "version": v.version, "version_id": v.version_id, "stage": i,
                "until_tokens": until, "source": source.table, "weight": float(weights.get(source.table, 0.0)),
                "snapshot_id": p.snapshot_id, "rows": p.rows, "train_rows": p.train_rows, "bytes": p.bytes,
                "token_estimate": p.token_estimate, "max_epochs": source.max_epochs, "seq_len": v.spec.seq_len,
                "tokenizer": v.tokenizer_version, "plan_hash": v.plan_hash, "plan_json": plan_json,
                "created_at": v.created_at,
            })
    return pa.Table.from_pylist(rows, schema=MIX_VERSIONS.as_arrow())


def mix_versions(lake: Lake, mix: str) -> list[MixVersion]:
    """Every version of `mix`, oldest first (empty when none or no table yet)."""
    if not lake.has_table(MIX_VERSIONS_TABLE):
        return []
    t = lake.table(MIX_VERSIONS_TABLE)
    rows = t.scan(row_filter=EqualTo("mix", mix), selected_fields=("version", "plan_json")).to_arrow()
    plans = {v: p for v, p in zip(rows.column("version").to_pylist(), rows.column("plan_json").to_pylist())}
    return [MixVersion.model_validate(json.loads(plans[v])) for v in sorted(plans)]


def latest_version(lake: Lake, mix: str) -> MixVersion | None:
    versions = mix_versions(lake, mix)
    return versions[-1] if versions else None


def get_version(lake: Lake, ref: str) -> MixVersion:
    """A version by id (`mix/<name>@v<N>`, `<name>@v<N>`) or the newest of a mix name."""
    name, _, number = ref.removeprefix("mix/").partition("@v")
    versions = mix_versions(lake, name)
    if not versions:
        raise MixError(f"mix {name!r} has no registered version (materialize the mix asset for it)")
    if not number:
        return versions[-1]
    found = [v for v in versions if str(v.version) == number]
    if not found:
        raise MixError(f"mix {name!r} has no version {number} (versions 1..{versions[-1].version})")
    return found[0]


def version_problems(lake: Lake, v: MixVersion) -> dict[str, list[str]]:
    """What is wrong with a stored version, by check: weights, snapshots, empty sources."""
    problems: dict[str, list[str]] = {"weights_sum_to_one": [], "pinned_snapshots_exist": [], "no_empty_source": []}
    stages = [s.weights for s in v.spec.stages] + [v.spec.weights]
    for i, weights in enumerate(stages):
        total = sum(weights.values())
        if abs(total - 1) > WEIGHT_TOLERANCE or any(w < 0 for w in weights.values()):
            problems["weights_sum_to_one"].append(f"stage {i}: weights {weights} sum to {total:.6g}")
    for table, p in v.pins.items():
        if not lake.has_table(table):
            problems["pinned_snapshots_exist"].append(f"{table} no longer exists")
        elif lake.table(table).snapshot_by_id(p.snapshot_id) is None:
            problems["pinned_snapshots_exist"].append(f"{table}@{p.snapshot_id} no longer exists")
        if p.train_rows == 0:
            problems["no_empty_source"].append(f"{table}@{p.snapshot_id} has no training rows")
    return problems
