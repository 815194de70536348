"""Typed Dagster resources: thin, lazily-built clients over the framework-free core."""

from dagster import PipesSubprocessClient

from factory.home import CHECKOUT
from resources.experiments import ExperimentsResource
from resources.inference import InferenceResource, SandboxResource
from resources.lake import LakeResource
from resources.spark import SparkResource
from resources.tracker import TrackerResource


def default_resources() -> dict:
    """Embedded defaults: sqlite catalog under FACTORY_HOME, Spark local[*], MLflow on sqlite,
    training processes launched locally through Pipes. No env read here."""
    return {
        "lake": LakeResource(),
        "experiments": ExperimentsResource(),
        "spark": SparkResource(),
        "tracker": TrackerResource(),
        "inference": InferenceResource(),
        "sandbox": SandboxResource(),
        # training.launcher 'kubernetes': the asset builds a PipesK8sClient itself (resources.k8s_training)
        # a stopped run worker forwards SIGINT to the trainer, which then checkpoints the step in
        # progress (factory.train.preempt): wait the default preemption grace and a margin, not 20 s
        "pipes_subprocess_client": PipesSubprocessClient(cwd=str(CHECKOUT), termination_timeout_seconds=90),
    }


__all__ = ["ExperimentsResource", "InferenceResource", "LakeResource", "SandboxResource", "SparkResource", "TrackerResource", "default_resources"]
