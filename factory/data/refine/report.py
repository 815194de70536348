"""The per-step drop table: what each refinement step kept and dropped, per source.

Read from the lineage rows of the steps' current snapshots (each carries its counts), so the
table describes exactly the data downstream stages read, without rescanning anything.
"""

from __future__ import annotations

from factory.data.refine.config import RefineConfig
from factory.lake import Lake


def drop_table(lake: Lake, pipelines: list[RefineConfig]) -> list[dict]:
    """One row per (source, step) that has been materialized, in pipeline order."""
    rows = []
    for pipeline in pipelines:
        for index, step in enumerate(pipeline.steps):
            table = pipeline.table(index)
            if not lake.has_table(table):
                continue
            records = lake.lineage.resolve(table)
            if not records:
                continue
            meta = records[-1].metadata
            rows.append({
                "source": pipeline.source, "step": step.kind, "table": table,
                "snapshot_id": records[-1].snapshot_id,
                "rows_in": meta.get("rows_in", 0), "rows_out": meta.get("rows_out", 0),
                "bytes_in": meta.get("bytes_in", 0), "bytes_out": meta.get("bytes_out", 0),
                "dropped": meta.get("dropped", {}), "redactions": meta.get("redactions", {}),
            })
    return rows
