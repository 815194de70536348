"""Asset-selection jobs: what the UI's launch buttons, CI and schedules run."""

from dagster import AssetSelection, define_asset_job

ingest_job = define_asset_job(
    "ingest_job",
    selection=AssetSelection.groups("raw"),
    description="Ingest every embedded source into its raw.* Iceberg table.",
)

demo_job = define_asset_job(
    "demo_job",
    selection=AssetSelection.all(),
    description="The main pipeline end to end on the embedded defaults (what `make demo` runs).",
)

jobs = [ingest_job, demo_job]

__all__ = ["demo_job", "ingest_job", "jobs"]
