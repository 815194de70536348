"""Data checks over committed refinement tables (run by the Dagster asset checks, or by hand).

They read what was committed — not the step's in-memory result — so a check that passes says
something about the table every downstream consumer will read.
"""

from __future__ import annotations

from factory.data.refine.config import DecontamConfig
from factory.data.refine.decontam import build_index
from factory.lake import Lake


def row_count(lake: Lake, table: str) -> int:
    snapshot = lake.table(table).current_snapshot()
    return int(snapshot.summary["total-records"]) if snapshot else 0


def duplicate_content(lake: Lake, table: str) -> int:
    """Rows whose content hash another row of `table` already has."""
    hashes = lake.table(table).scan(selected_fields=("content_sha256",)).to_arrow().column(0)
    return len(hashes) - len(hashes.unique())


def eval_overlap(lake: Lake, table: str, config: DecontamConfig) -> list[tuple[str, str]]:
    """(doc_id, matched task) of every row sharing an n-gram with the evaluation sets."""
    index = build_index(config.benchmarks, config.ngram)
    hits = []
    for batch in lake.table(table).scan(selected_fields=("doc_id", "text")).to_arrow_batch_reader():
        for doc_id, text in zip(batch.column("doc_id").to_pylist(), batch.column("text").to_pylist()):
            if (match := index.match(text or "")) is not None:
                hits.append((doc_id, match[0]))
    return hits
