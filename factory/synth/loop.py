"""Closing the synthetic loop without a cycle: which mixes a new synthetic batch
should refresh.

The `synthetic_mix_sensor` keeps, as its cursor, the snapshot it last saw of every
`synthetic.*` table. When a table has a new snapshot, every mix spec that lists the table is due
for a new version — registering it pins the new snapshot, and a training run following that mix
switches to it at its next poll.

A mix whose newest registered version already pins that snapshot is not due: it was refreshed
already, whoever registered it (`make demo`'s `dagster asset materialize --select mix`, `factory
mix register`, the UI). That is what a first tick meets (no cursor: every table's snapshot is
new to it), and why opening the UI after the demo queues no mix run. Only the mixes that list a
table with a new snapshot have their versions read. The mix asset itself commits nothing when the
plan is unchanged, so a repeated request would be harmless too; run keys name the snapshot anyway.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from factory.lake import Lake
from factory.mix.spec import MixSpec
from factory.mix.versions import latest_version


@dataclass
class Refresh:
    due: list[tuple[str, str, int]] = field(default_factory=list)  # (mix, table, snapshot id) to register
    current: list[tuple[str, str, int]] = field(default_factory=list)  # already pinned by the newest version
    cursor: str = "{}"


def synthetic_tables(lake: Lake) -> list[str]:
    return [t for t in lake.tables() if t.startswith("synthetic.") and not t.endswith("_rejected")]


def mixes_to_refresh(lake: Lake, cursor: str | None, specs: dict[str, MixSpec]) -> Refresh:
    """The (mix, table, snapshot) pairs a new synthetic snapshot makes due, those already current,
    and the new cursor."""
    seen = json.loads(cursor) if cursor else {}
    out, now, newest = Refresh(), dict(seen), {}
    for table in synthetic_tables(lake):
        snapshot = lake.current_snapshot_id(table)
        if snapshot is None or seen.get(table) == snapshot:
            continue
        now[table] = snapshot
        for name, spec in sorted(specs.items()):
            if table not in {s.table for s in spec.sources}:
                continue
            if name not in newest:
                newest[name] = latest_version(lake, name)
            pin = newest[name].pins.get(table) if newest[name] else None
            current = pin is not None and pin.snapshot_id == snapshot
            (out.current if current else out.due).append((name, table, snapshot))
    out.cursor = json.dumps(now, sort_keys=True)
    return out
