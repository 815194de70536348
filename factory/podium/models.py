"""The exports Podium offers, read from lineage, with their eval scores."""

from __future__ import annotations

from dataclasses import dataclass, field

from factory.infer.export import ExportError, ExportRef, find_export
from factory.lake import Lake
from factory.podium.store import PodiumError


@dataclass(frozen=True)
class ModelEntry:
    export_id: str
    run: str
    step: int
    checkpoint_id: str
    created_at: object
    sha256: str
    scores: dict[str, float] = field(default_factory=dict)  # "suite/task/metric" -> value, newest eval


def list_models(lake: Lake) -> list[ModelEntry]:
    """Every export in lineage (its newest record), newest first, with its eval scores."""
    newest = {}
    for record in lake.lineage.records(kind="export"):
        if record.version_id not in newest or record.created_at >= newest[record.version_id].created_at:
            newest[record.version_id] = record
    scores: dict[str, dict[str, float]] = {}
    if lake.has_table("evals.results"):
        from factory.evals.results import results

        for row in sorted(results(lake), key=lambda r: r["created_at"]):
            scores.setdefault(row["export_id"], {})[f"{row['suite']}/{row['task']}/{row['metric']}"] = row["value"]
    entries = []
    for version_id, record in newest.items():
        run, _, step = version_id.removeprefix("export/").rpartition("@")
        checkpoint = next((u for u in record.upstream if u.startswith("ckpt/")), "")
        entries.append(ModelEntry(version_id, run, int(step), checkpoint, record.created_at, record.content_hash or "",
                                  scores.get(version_id, {})))
    return sorted(entries, key=lambda e: e.created_at, reverse=True)


class Exports:
    """`find_export`, remembered per id (an export directory is content-addressed: it never changes)."""

    def __init__(self, lake: Lake):
        self.lake = lake
        self._known: dict[str, ExportRef] = {}

    def get(self, export_id: str) -> ExportRef:
        if export_id not in self._known:
            if not export_id.startswith("export/"):
                raise PodiumError(f"export {export_id!r}: not an export id (export/<run>@<step>)", 404)
            try:
                self._known[export_id] = find_export(self.lake, export_id)
            except ExportError as e:
                raise PodiumError(str(e), 404) from None
        return self._known[export_id]
