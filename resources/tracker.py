"""`TrackerResource`: where a training run reports its metrics, as the environment of its process.

Training runs in a subprocess (torchrun via Dagster Pipes), so this resource builds no client:
`env()` returns the variables `factory.train.tracking.build_tracker` reads in that process, with
`EnvVar`s resolved when a run asks. Embedded default: MLflow on sqlite under `$FACTORY_HOME/mlflow`
plus `train.metrics` in Iceberg. At scale, e.g.

    TrackerResource(backends=["mlflow", "neptune", "iceberg"],
                    mlflow_tracking_uri=EnvVar("MLFLOW_TRACKING_URI"),
                    neptune_project="lab/factory", neptune_mode="async",
                    neptune_api_token=EnvVar("NEPTUNE_API_TOKEN"))
"""


from typing import Optional

from dagster import ConfigurableResource
from pydantic import field_validator

from factory.train import tracking

BACKENDS = ("mlflow", "neptune", "iceberg")


class TrackerResource(ConfigurableResource):
    """Tracking backends and their settings for training subprocesses."""

    backends: list[str] = ["mlflow", "iceberg"]
    mlflow_tracking_uri: Optional[str] = None
    neptune_project: str = "factory/offline"
    neptune_mode: str = "offline"
    neptune_api_token: Optional[str] = None

    @field_validator("backends")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        unknown = [b for b in value if b not in BACKENDS]
        if unknown:
            raise ValueError(f"unknown tracker backends {unknown}; choose from {list(BACKENDS)}")
        return value

    def env(self) -> dict[str, str]:
        """Environment variables for the training process; unset settings are left out."""
        values = {
            tracking.ENV_BACKENDS: ",".join(self.backends),
            tracking.ENV_MLFLOW_URI: self.mlflow_tracking_uri,
        }
        if "neptune" in self.backends:
            values |= {
                tracking.ENV_NEPTUNE_PROJECT: self.neptune_project,
                tracking.ENV_NEPTUNE_MODE: self.neptune_mode,
                tracking.ENV_NEPTUNE_TOKEN: self.neptune_api_token,
            }
        return {key: value for key, value in values.items() if value}
