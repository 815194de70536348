"""Factory-health metrics in Prometheus: how the factory runs, not how good its models are.

Purpose: the trainer, the sandbox pool, the inference engines and the lake's commit path write a
few counters, gauges and histograms (`factory.health.metrics`); `factory metrics serve` exports
them on 127.0.0.1 for Prometheus, and the Dagster layer adds the run queue
(`resources/run_queue_metrics.py`). Dashboards (`factory.health.dashboards`) and alert rules
(`deploy/prometheus/rules.yml`) read exactly these series (a test checks the names).

Design:
- One switch, here: metrics are on when `FACTORY_METRICS=1` (`enabled()`). Off, every hook is a
  dictionary lookup and a return; nothing is imported, no file is written.
- Multiprocess mode: torchrun ranks, Dagster run workers and the training subprocess each write
  their own memory-mapped files into one directory (`metrics_dir()`:
  `PROMETHEUS_MULTIPROC_DIR`, else `FACTORY_HOME/metrics/prom`), and the exporter merges them at
  scrape time. The first process that turns metrics on exports the directory into its
  environment, and `child_env()` gives the two variables to a process started from scratch
  (`make ui`'s session, tests), so every process of one factory writes to the same place.
- Metric objects are created on first use, never at import (house rule: no env reads at import).

Why multiprocess rather than a server per process: a run has N ranks and the Dagster daemon starts
a worker per run; one exporter with one scrape target is what a loopback Prometheus (and a pod's
annotation) can find.
"""

from __future__ import annotations

from pathlib import Path

from factory import settings

PROM_SUBDIR = Path("metrics") / "prom"


def enabled() -> bool:
    """Whether this process records factory-health metrics (`FACTORY_METRICS`)."""
    return settings.metrics_on()


def metrics_dir(home: str | Path | None = None) -> Path:
    """The multiprocess directory: `PROMETHEUS_MULTIPROC_DIR`, else `<FACTORY_HOME>/metrics/prom`
    (`home` wins over both when given: a command with an explicit --home)."""
    from factory.home import factory_home

    if home is None and (explicit := settings.prometheus_dir()):
        return Path(explicit)
    return factory_home(home) / PROM_SUBDIR


def child_env(home: str | Path | None = None) -> dict[str, str]:
    """The variables that turn metrics on in a process started from scratch, writing to this
    factory's directory: hand them to `subprocess.Popen(env=...)` explicitly."""
    return {settings.METRICS: "1", settings.PROMETHEUS_DIR: str(metrics_dir(home))}


__all__ = ["child_env", "enabled", "metrics_dir"]
