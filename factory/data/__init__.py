"""Data in: source configs, readers for each source kind, and ingestion into `raw.*` tables."""
