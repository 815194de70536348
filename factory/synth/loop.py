"""Closing the synthetic loop without a cycle: which mixes a new synthetic batch
should refresh.

The `synthetic_mix_sensor` keeps, as its cursor, the snapshot it last saw of every
`synthetic.*` table. When a table has a new snapshot, every mix spec that lists the table is due
for a new version — registering it pins the new snapshot, and a training run following that mix
switches to it at its next poll. The mix asset itself commits nothing when the plan is
unchanged, so a repeated request is harmless; run keys name the snapshot anyway.
"""

from __future__ import annotations

import json

from factory.lake import Lake
from factory.mix.spec import MixSpec


def synthetic_tables(lake: Lake) -> list[str]:
    return [t for t in lake.tables() if t.startswith("synthetic.") and not t.endswith("_rejected")]


def mixes_to_refresh(lake: Lake, cursor: str | None, specs: dict[str, MixSpec]) -> tuple[list[tuple[str, str, int]], str]:
    """([(mix, table, snapshot id) due], new cursor) for synthetic tables with a new snapshot."""
    seen = json.loads(cursor) if cursor else {}
    due, now = [], dict(seen)
    for table in synthetic_tables(lake):
        snapshot = lake.current_snapshot_id(table)
        if snapshot is None or seen.get(table) == snapshot:
            continue
        now[table] = snapshot
        due += [(name, table, snapshot) for name, spec in sorted(specs.items())
                if table in {s.table for s in spec.sources}]
    return due, json.dumps(now, sort_keys=True)
