"""Held-out documents of a mix version's sources: what bits-per-byte and code completion read.

The split is decided upstream, once, by `factory.data.split` (a salted hash of `doc_id` below the
mix's `heldout_fraction`): the loader never streams these documents, and evals read only these.
Documents are read from the *pinned* snapshot of the version the checkpoint trained on, ordered
by that same hash, so the eval set is fixed for a version whatever the file layout, and a
"first n" subset is a uniform sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from factory.data.split import doc_hashes, heldout_mask, uniform
from factory.lake import Lake
from factory.lake.lineage import table_version_id
from factory.lake.scan import pin_snapshot, stream_snapshot


@dataclass(frozen=True)
class HeldoutDoc:
    doc_id: str
    path: str
    text: str


@dataclass(frozen=True)
class HeldoutSet:
    table: str
    snapshot_id: int
    docs: list[HeldoutDoc]

    @property
    def version_id(self) -> str:
        return table_version_id(self.table, self.snapshot_id)


def heldout_docs(lake: Lake, mix_version: str, table: str, limit: int | None = None) -> HeldoutSet:
    """Held-out documents of `table` as pinned by `mix_version`, in hash order, at most `limit`."""
    from factory.mix import MixError, get_version

    version = get_version(lake, mix_version)
    if table not in version.pins:
        raise MixError(f"{mix_version} has no source {table} (sources: {sorted(version.pins)})")
    pinned = pin_snapshot(lake, table, version.pins[table].snapshot_id)
    found: list[tuple[float, HeldoutDoc]] = []
    for batch in stream_snapshot(lake, pinned, ["doc_id", "path", "text"]):
        ids = batch.column("doc_id").to_pylist()
        hashes = doc_hashes(ids)
        keep = np.flatnonzero(heldout_mask(hashes, version.spec.heldout_fraction))
        order = uniform(hashes)
        paths, texts = batch.column("path"), batch.column("text")
        found += [(float(order[i]), HeldoutDoc(ids[i], paths[i].as_py(), texts[i].as_py())) for i in keep]
    docs = [d for _, d in sorted(found, key=lambda x: (x[0], x[1].doc_id))]
    return HeldoutSet(table, pinned.snapshot_id, docs[:limit] if limit else docs)


def mix_sources(lake: Lake, mix_version: str) -> list[str]:
    from factory.mix import get_version

    return sorted(get_version(lake, mix_version).pins)
