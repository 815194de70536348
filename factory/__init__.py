"""The model factory's framework-free core.

Everything a stage does lives here as plain functions over typed configs, so it can be run and
tested without Dagster; the Dagster layer (`assets/`, `resources/`, `sensors/`, `jobs/`) only
wires these functions into an asset graph. This package must never import `dagster` (a test
enforces it).
"""
