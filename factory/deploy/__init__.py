"""Deployment profiles: one validated `DeployConfig` selects every engine (see `config.py`)."""

from factory.deploy.config import DeployConfig, DeployError, Secret
from factory.deploy.profiles import catalog_config, load_profile, open_lake, profile_env, profile_names

__all__ = ["DeployConfig", "DeployError", "Secret", "catalog_config", "load_profile", "open_lake", "profile_env",
           "profile_names"]
