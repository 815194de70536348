"""`train.incidents`: one row per thing that went wrong in a run and what was done about it.

The guards (a non-finite step skipped or stopped, a spike warned, skipped or rolled back) and the
replica checker (parameters or gradients that differ between ranks) write here, so a run's
history says not only what the loss was (`train.metrics`) but why a step is missing from it.
Each row is its own commit: incidents are rare, and one must be durable before the run acts on
it (an error stops the process right after). The commit's stamp names the snapshots behind the
run's newest checkpoint, so an incident joins the lineage of the state it happened to.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa

from factory.health import metrics as health
from factory.lake import CommitStamp, Lake, TableCommit
from factory.lake.schemas import TRAIN_INCIDENTS
from factory.train.trackers.iceberg import commit_stamp

INCIDENTS_TABLE = "train.incidents"


def record_incident(lake: Lake, run: str, step: int, kind: str, detail: dict,
                    *, stamp: CommitStamp | None = None) -> TableCommit:
    """Append one row to `train.incidents` (replica_mismatch, nonfinite, spike, rollback, ...);
    `detail` is stored as sorted-key JSON."""
    row = {"run": run, "step": int(step), "kind": kind, "detail": json.dumps(detail, sort_keys=True, default=str),
           "created_at": datetime.now(timezone.utc)}
    data = pa.Table.from_pylist([row], schema=TRAIN_INCIDENTS.as_arrow())
    stamp = stamp or commit_stamp(INCIDENTS_TABLE, lake, run_upstream(lake, run))
    commit = lake.commit(INCIDENTS_TABLE, data, stamp, schema=TRAIN_INCIDENTS)
    health.incident(run, kind)  # factory_train_incidents_total{run, kind}, once the row is durable
    return commit


def run_upstream(lake: Lake, run: str) -> list[str]:
    """The versions a run's state comes from, by its newest checkpoint row: that checkpoint, then
    what it was trained from (mix version, tokenizer); [] before the run's first checkpoint."""
    newest = lake.lineage.records(kind="checkpoint", name=f"run/{run}")[-1:]
    return [newest[0].version_id, *newest[0].upstream] if newest else []
