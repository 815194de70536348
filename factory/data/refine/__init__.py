"""The refinement chain: pure Spark steps from `raw.<source>` to `refined.<source>`.

Each step is a function `DataFrame -> DataFrame` that labels every row with a drop reason (null
for rows it keeps) — `split` turns that into (kept, dropped). `pipeline.run_step` runs one step of
a source's validated `RefineConfig`: reads the previous step's pinned snapshot, writes the kept
rows to the step's table and the dropped ones (with step, reason and detail) to
`refined.exclusions`, and records lineage. Steps: normalize, exact dedup, near dedup (MinHash +
LSH + connected components), quality filters, secrets/PII redaction, decontamination.
"""
