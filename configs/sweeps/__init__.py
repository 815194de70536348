"""Sweeps as code: every module here holds functions annotated `-> SweepConfig` — a base
experiment plus a grid or random search over its fields, within a budget.

Launch one with `factory sweep launch NAME` (queues one tagged run per cell in Dagster), from the
UI (its schedule `sweep_NAME`: start it, or evaluate it once), or on its cron. Results:
`factory sweep results NAME` and the `sweeps/results` asset (`sweeps.results` in the lake).
"""
