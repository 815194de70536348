"""`SparkResource`: one SparkSession per process, `local[*]` unless a master URL is configured."""


from typing import Optional

from dagster import ConfigurableResource

from factory.data.spark import spark_session


class SparkResource(ConfigurableResource):
    """`master` is `local[*]` on a laptop, `spark://host:7077` or `k8s://...` on a cluster."""

    master: str = "local[*]"
    app_name: str = "model-factory"
    conf: Optional[dict[str, str]] = None

    def session(self):
        return spark_session(self.master, self.app_name, self.conf)
