"""`raw/<source>`: one asset per embedded source, each writing Iceberg table `raw.<source>`.

Reads the whole source, then commits one overwrite snapshot with lineage; an unchanged source
commits nothing and the metadata says so. Run config is small: lift the demo caps
(`full_corpus: true`) or set a document cap.
"""


from typing import Optional

from dagster import AssetsDefinition, Config, MaterializeResult, MetadataValue, asset

from assets._metadata import display
from configs.sources import EMBEDDED, embedded_source
from factory.data.ingest import IngestResult, ingest_source
from factory.deploy.kube.placement import op_tags
from resources.lake import LakeResource


class RawSourceConfig(Config):
    full_corpus: bool = False
    """Lift the demo's caps and ingest the whole source."""
    max_documents: Optional[int] = None
    """Override the source's deterministic document cap."""
    allow_shrink: bool = False
    """Commit even when the source drops more than its `max_shrink` of the table's rows."""


def raw_assets() -> list[AssetsDefinition]:
    return [_raw_asset(name) for name in EMBEDDED]


def _raw_asset(name: str) -> AssetsDefinition:
    @asset(
        name=name,
        key_prefix=["raw"],
        group_name="raw",
        op_tags=op_tags("refine"),
        kinds={"iceberg", "python"},
        description=f"Iceberg table `raw.{name}`: {EMBEDDED[name].__doc__} Config: configs/sources.py.",
    )
    def _asset(context, config: RawSourceConfig, lake: LakeResource) -> MaterializeResult:
        source = embedded_source(name, full=config.full_corpus)
        if config.max_documents is not None:
            source = type(source).model_validate({**source.model_dump(), "max_documents": config.max_documents})
        result = ingest_source(
            lake.lake(),
            source,
            asset_key=f"raw/{name}",
            run_id=context.run_id,
            allow_shrink=config.allow_shrink,
            progress=_every_tenth(lambda done, total: context.log.info(f"raw.{name}: read {done}/{total}")),
        )
        context.log.info(_summary(result))
        return MaterializeResult(metadata=_metadata(result, lake.lake().table(result.table).location()))

    return _asset


def _every_tenth(log):
    """Wrap a progress callback so a run log gets ~10 lines per source, not one per batch."""
    last = [-1]

    def progress(done: int, total: int) -> None:
        tenth = 10 * done // max(total, 1)
        if tenth != last[0]:
            last[0] = tenth
            log(done, total)

    return progress


def _summary(r: IngestResult) -> str:
    status = "new snapshot" if r.committed else "unchanged: nothing committed"
    return f"{r.table}: {status} {r.snapshot_id}, {r.documents} documents, {r.bytes / 1e6:.1f} MB, skipped {r.skipped}"


def _metadata(r: IngestResult, location: str) -> dict:
    sample = "\n\n".join(f"**{s['path']}** ({s['language']})\n```\n{s['head']}\n```" for s in r.sample)
    return display({
        "table": r.table,
        "status": "new snapshot" if r.committed else "unchanged: nothing committed",
        "snapshot_id": str(r.snapshot_id),
        "previous_snapshot_id": str(r.previous_snapshot_id),
        "dagster/row_count": r.documents,
        "bytes": r.bytes,
        "candidates": r.candidates,
        "skipped": MetadataValue.json(r.skipped),
        "skipped_examples": MetadataValue.json(r.skipped_examples),
        "languages": MetadataValue.json(r.languages),
        "fingerprint": r.fingerprint,
        "config_hash": r.config_hash,
        "seconds": r.seconds,
        "location": MetadataValue.path(location),
        "lineage": MetadataValue.md(f"`factory lineage {r.table}`"),
        "sample": MetadataValue.md(sample or "(empty)"),
    })
