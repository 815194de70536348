"""Typed Dagster resources: thin, lazily-built clients over the framework-free core."""

from resources.lake import LakeResource
from resources.spark import SparkResource


def default_resources() -> dict:
    """Embedded defaults: sqlite catalog under FACTORY_HOME, Spark local[*]. No env read here."""
    return {"lake": LakeResource(), "spark": SparkResource()}


__all__ = ["LakeResource", "SparkResource", "default_resources"]
