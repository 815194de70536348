"""The per-step drop table: what each refinement step kept and dropped, per source.

Read from the lineage rows of the steps' current snapshots (each carries its counts), so the
table describes exactly the data downstream stages read, without rescanning anything.
"""

from __future__ import annotations

from factory.data.refine.config import RefineConfig
from factory.lake import Lake


def drop_table(lake: Lake, pipelines: list[RefineConfig]) -> list[dict]:
    """One row per (source, step) that has been materialized, in pipeline order."""
    by_version = {r.version_id: r for r in lake.lineage.records()}  # read once, not per table
    rows = []
    for pipeline in pipelines:
        for index, step in enumerate(pipeline.steps):
            table = pipeline.table(index)
            record = by_version.get(f"{table}@{lake.current_snapshot_id(table)}") if lake.has_table(table) else None
            if record is None:
                continue
            meta = record.metadata
            rows.append({
                "source": pipeline.source, "step": step.kind, "table": table,
                "snapshot_id": record.snapshot_id,
                "rows_in": meta.get("rows_in", 0), "rows_out": meta.get("rows_out", 0),
                "bytes_in": meta.get("bytes_in", 0), "bytes_out": meta.get("bytes_out", 0),
                "dropped": meta.get("dropped", {}), "redactions": meta.get("redactions", {}),
            })
    return rows
