"""`TrackerResource`: where a training run reports its metrics, as the environment of its process.

Training runs in a subprocess (torchrun via Dagster Pipes), so this resource builds no client:
`env()` returns the variables `factory.train.trackers.build_tracker` reads in that process. The
settings come from the deployment profile's `tracker` section (MLflow on sqlite under
`$FACTORY_HOME/mlflow` plus `train.metrics` in Iceberg by default; an MLflow server, Neptune at
scale); a field set here overrides the profile for this resource, e.g. in a test
`TrackerResource(backends=["iceberg"])`.
"""


from typing import Optional

from dagster import ConfigurableResource
from pydantic import field_validator

from factory import settings
from factory.deploy import load_profile
from factory.train.trackers import BACKENDS


class TrackerResource(ConfigurableResource):
    """Tracking backends and their settings for training subprocesses (None = the profile's)."""

    backends: Optional[list[str]] = None
    mlflow_tracking_uri: Optional[str] = None
    neptune_project: Optional[str] = None
    neptune_mode: Optional[str] = None
    neptune_api_token: Optional[str] = None
    deploy: Optional[str] = None
    """Deployment profile whose `tracker` section fills the unset fields; None = the active one."""

    @field_validator("backends")
    @classmethod
    def _known(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        unknown = [b for b in value or [] if b not in BACKENDS]
        if unknown:
            raise ValueError(f"unknown tracker backends {unknown}; choose from {list(BACKENDS)}")
        return value

    def env(self) -> dict[str, str]:
        """Environment variables for the training process; unset settings are left out."""
        profile = load_profile(self.deploy).tracker
        backends = self.backends if self.backends is not None else profile.backends
        values = {
            settings.TRACKER_BACKENDS: ",".join(backends),
            settings.MLFLOW_URI: self.mlflow_tracking_uri or profile.mlflow_tracking_uri,
        }
        if "neptune" in backends:
            token = self.neptune_api_token or (profile.neptune_api_token.resolve("tracker.neptune_api_token")
                                               if profile.neptune_api_token else None)
            values |= {
                settings.NEPTUNE_PROJECT: self.neptune_project or profile.neptune_project,
                settings.NEPTUNE_MODE: self.neptune_mode or profile.neptune_mode,
                settings.NEPTUNE_TOKEN: token,
            }
        return {key: value for key, value in values.items() if value}
