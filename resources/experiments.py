"""`ExperimentsResource`: where the experiment sensor and the sweep schedules read their files.

Defaults to the checkout's `configs/experiments` and `configs/sweeps`; `FACTORY_EXPERIMENTS_DIR`
(read when the sensor ticks, never at import) or the fields point them elsewhere — a team's
shared experiments repository, or an empty directory for a factory that should queue nothing.
"""

from pathlib import Path

from dagster import ConfigurableResource

from factory.experiments.registry import EXPERIMENTS_DIR, SWEEPS_DIR
from factory import settings


class ExperimentsResource(ConfigurableResource):
    experiments_dir: str = ""
    """Experiment files; empty = $FACTORY_EXPERIMENTS_DIR, else configs/experiments."""
    sweeps_dir: str = ""
    """Sweep files; empty = configs/sweeps."""

    def experiments_path(self) -> Path:
        return Path(self.experiments_dir or settings.experiments_dir() or EXPERIMENTS_DIR)

    def sweeps_path(self) -> Path:
        return Path(self.sweeps_dir or SWEEPS_DIR)
