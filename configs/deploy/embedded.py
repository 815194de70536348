"""The embedded profile: nothing to install by hand, nothing listening on the network.

    make demo                      # FACTORY_DEPLOY unset = embedded
"""

from factory.deploy import DeployConfig


def embedded() -> DeployConfig:
    return DeployConfig(name="embedded", description="sqlite catalog under FACTORY_HOME, Spark local[*], torchrun on "
                        "this node, vLLM in-process, MLflow and Dagster on sqlite")
