"""Experiment tracking: one `Tracker` interface, one module per backend, fanned out by `MultiTracker`.

| backend (`TrackerConfig.backends`) | module | stores |
|---|---|---|
| `mlflow` | `trackers/mlflow.py` | an MLflow run: sqlite under `$FACTORY_HOME/mlflow`, or a server |
| `neptune` | `trackers/neptune.py` | a Neptune run, offline JSON lines under `$FACTORY_HOME/neptune` |
| `iceberg` | `trackers/iceberg.py` | rows of `train.metrics`, one append per flush |

`BACKENDS` is the registry: the backend's name (spelt once, as `factory.train.config.
TrackerBackend`) to the function that builds it. `build_tracker` is the one place a training
process's tracking environment is interpreted (`resources/tracker.py` writes it): it reads it when
asked, never at import time. Non-finite metric values are dropped by MLflow and Neptune and kept
by Iceberg (each module says why).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from factory import settings
from factory.lake import Lake
from factory.train.config import TrackerConfig
from factory.train.trackers import iceberg, mlflow, neptune
from factory.train.trackers.base import STATUSES, MultiTracker, Tracker, flatten_params
from factory.train.trackers.iceberg import METRICS_TABLE, IcebergMetrics
from factory.train.trackers.mlflow import RUN_TAG, MLflowTracker
from factory.train.trackers.neptune import NeptuneTracker

# name -> builder(config, *, lake, home, run, experiment, env); the keys are exactly TrackerBackend's
# values (a test holds them together)
BACKENDS: dict[str, Callable[..., Tracker]] = {"mlflow": mlflow.build, "neptune": neptune.build,
                                               "iceberg": iceberg.build}


def build_tracker(config: TrackerConfig, lake: Lake | None, home: Path, run: str, *,
                  experiment: str = "factory", environ: Mapping[str, str] | None = None) -> MultiTracker:
    """The trackers `config` asks for, with the training environment's overrides (`environ`,
    default `os.environ` at call time): `FACTORY_TRACKER_BACKENDS` replaces the backend list,
    `FACTORY_MLFLOW_TRACKING_URI` points MLflow at a server, `NEPTUNE_PROJECT` / `NEPTUNE_MODE` /
    `NEPTUNE_API_TOKEN` configure Neptune. Call `start` on the result to open the runs."""
    env = settings.environment() if environ is None else environ
    names = [b.strip() for b in env.get(settings.TRACKER_BACKENDS, "").split(",") if b.strip()]
    trackers = []
    for name in names or config.backends:
        if name not in BACKENDS:
            raise ValueError(f"unknown tracker backend {name!r} (expected one of {', '.join(BACKENDS)})")
        trackers.append(BACKENDS[name](config, lake=lake, home=home, run=run, experiment=experiment, env=env))
    return MultiTracker(trackers, log_every=config.log_every)


__all__ = ["BACKENDS", "METRICS_TABLE", "RUN_TAG", "STATUSES", "IcebergMetrics", "MLflowTracker", "MultiTracker",
           "NeptuneTracker", "Tracker", "build_tracker", "flatten_params"]
