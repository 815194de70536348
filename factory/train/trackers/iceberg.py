"""`iceberg`: metric rows in `train.metrics`, so loss curves join with lineage in SQL.

Rows are buffered and committed by `flush()` in ONE append: a snapshot per step would bury the
table in metadata. Non-finite values are kept: a double column holds NaN and Inf faithfully, so
`train.metrics` is the record of what the run really saw (with `train.incidents` saying what the
guards did about it), while the MLflow and Neptune backends drop them.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Sequence

import pyarrow as pa

from factory.lake import CommitStamp, Lake, TableCommit
from factory.lake.schemas import TRAIN_METRICS
from factory.train.config import TrackerConfig
from factory.train.trackers.base import Tracker, check_status

METRICS_TABLE = "train.metrics"


def build(config: TrackerConfig, *, lake: Lake | None, run: str, **_) -> "IcebergMetrics":
    if lake is None:
        raise ValueError("tracker backend 'iceberg' needs a lake")
    return IcebergMetrics(lake, run)


def commit_stamp(table: str, lake: Lake | None = None, upstream: Sequence[str] = (), **fields: str) -> CommitStamp:
    """The stamp of a `train.*` commit: the table snapshots behind the run's `upstream` versions
    (its mix version and tokenizer, or its newest checkpoint) when a lake can resolve them."""
    ids = [u for u in upstream if u]
    snapshots = lake.lineage.upstream_snapshots(ids) if lake is not None and ids else {}
    return CommitStamp(**{"asset_key": table.replace(".", "/"), "config_hash": "", **fields}, upstream=snapshots)


class IcebergMetrics(Tracker):
    """Metric rows for `train.metrics`, buffered in memory and committed by `flush()` as one append.

    The trainer flushes when it checkpoints (and `finish` flushes, whatever the status, so a failed
    run keeps its curve up to the failure). `max_rows` is a safety net for runs that never
    checkpoint: a full buffer flushes itself. Non-finite values are kept (see the module docstring).
    """

    def __init__(self, lake: Lake, run: str, *, stamp: CommitStamp | None = None, max_rows: int = 100_000):
        self.lake = lake
        self.run = run
        self.given_stamp = stamp
        self.stamp = stamp or commit_stamp(METRICS_TABLE)
        self.max_rows = max_rows
        self.rows: list[dict] = []
        self.commits: list[TableCommit] = []

    def start(self, run: str, params: dict, tags: dict) -> None:
        self.run = run
        if self.given_stamp is None:  # the trainer's params are its plan: the mix version and tokenizer it reads
            self.stamp = commit_stamp(METRICS_TABLE, self.lake, [tags.get("mix") or params.get("mix_version", ""),
                                                           params.get("tokenizer", "")],
                                config_hash=str(params.get("config_hash", "")), run_id=str(tags.get("run_id", "")))

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        now = datetime.now(timezone.utc)
        self.rows += [{"run": self.run, "step": int(step), "name": name, "value": float(value), "created_at": now}
                      for name, value in metrics.items()]
        if len(self.rows) >= self.max_rows:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        data = pa.Table.from_pylist(self.rows, schema=TRAIN_METRICS.as_arrow())
        self.commits.append(self.lake.commit(METRICS_TABLE, data, self.stamp, schema=TRAIN_METRICS))
        self.rows = []

    def finish(self, status: str = "FINISHED") -> None:
        check_status(status)
        self.flush()
