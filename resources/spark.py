"""`SparkResource`: one SparkSession per process, on the deployment profile's Spark.

The master, executor Python, driver host and extra settings come from the active profile's
`spark` section (`load_profile()`, read when a run first asks for a session, never at import);
the resource's own fields, when set, override them (`master="local[2]"` in a test). The session
settings themselves are built in `factory.data.spark.session_conf`.
"""


from typing import Optional

from dagster import ConfigurableResource

from factory.data.spark import spark_session_for
from factory.deploy import DeployError, load_profile
from factory.deploy.check import probe_spark_master
from factory.deploy.config import SparkProfile


class SparkResource(ConfigurableResource):
    """`master` (`local[*]`, `spark://host:7077`, `k8s://...`) and `conf` override the profile's."""

    master: Optional[str] = None
    app_name: str = "model-factory"
    conf: Optional[dict[str, str]] = None
    deploy: Optional[str] = None
    """Deployment profile (configs/deploy name or .yaml/.json file); None = the active one."""

    def spark_profile(self) -> SparkProfile:
        spark = load_profile(self.deploy).spark
        changes = {k: v for k, v in {"master": self.master, "conf": {**spark.conf, **(self.conf or {})}}.items() if v}
        return SparkProfile.model_validate({**spark.model_dump(), **changes})

    def session(self):
        profile, spark = load_profile(self.deploy), self.spark_profile()
        # a master that does not answer fails the step now, naming the field, instead of after
        # Spark's minute of retries ("All masters are unresponsive")
        probe = probe_spark_master(spark.master)
        if not probe.ok:
            raise DeployError(f"deploy profile {profile.name}: {probe.field}: {probe.detail}")
        return spark_session_for(spark, self.app_name, s3=profile.catalog.s3)
