"""Asset-selection jobs: what the UI's launch buttons, CI and schedules run."""

from dagster import AssetSelection, define_asset_job

from assets.refine import dedup_asset_keys

ingest_job = define_asset_job(
    "ingest_job",
    selection=AssetSelection.groups("raw"),
    description="Ingest every embedded source into its raw.* Iceberg table.",
)

dedup_job = define_asset_job(
    "dedup_job",
    selection=AssetSelection.assets(*dedup_asset_keys()),
    description="Exact and near dedup for every source (their normalized inputs must exist).",
)

demo_job = define_asset_job(
    "demo_job",
    selection=AssetSelection.all(),
    description="The main pipeline end to end on the embedded defaults (what `make demo` runs).",
)

jobs = [ingest_job, dedup_job, demo_job]

__all__ = ["dedup_job", "demo_job", "ingest_job", "jobs"]
