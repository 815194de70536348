"""The loopback cluster: the production engines, for real, on 127.0.0.1.

    make cluster-up                          # SeaweedFS (S3 + Iceberg REST), Spark master + 2 workers
    FACTORY_DEPLOY=loopback make demo        # the whole demo on them
    make cluster-down                        # stop them by PID

The credentials are throwaways for servers bound to loopback (`make cluster-up` gives SeaweedFS
the same ones); a real cluster's profile names only the variables (`Secret(env=...)`).
"""

from configs.deploy.embedded import embedded
from factory.deploy import DeployConfig
from factory.deploy.config import CatalogProfile, DagsterProfile, PostgresConfig, S3Config, Secret, SparkProfile

S3_PORT, REST_PORT = 8333, 8181
SPARK_PORT, SPARK_UI_PORT = 7077, 8090
ACCESS_KEY = Secret(env="FACTORY_S3_ACCESS_KEY", default="factory")
SECRET_KEY = Secret(env="FACTORY_S3_SECRET_KEY", default="factory-loopback-secret")
POSTGRES_PORT = 5433  # not 5432: a system cluster from Debian's package may hold that one
POSTGRES_PASSWORD = Secret(env="FACTORY_DAGSTER_PG_PASSWORD", default="factory-loopback-secret")


def loopback() -> DeployConfig:
    s3 = S3Config(endpoint=f"http://127.0.0.1:{S3_PORT}", access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)
    return DeployConfig(
        name="loopback",
        description="Iceberg REST catalog + S3 (SeaweedFS) and a Spark standalone cluster on 127.0.0.1",
        catalog=CatalogProfile(kind="rest", uri=f"http://127.0.0.1:{REST_PORT}", warehouse="s3://warehouse", s3=s3,
                               sigv4=True),
        spark=SparkProfile(master=f"spark://127.0.0.1:{SPARK_PORT}", object_store="arrow",
                           conf={"spark.executor.memory": "1g", "spark.cores.max": "2"}),
    )


def loopback_postgres() -> DeployConfig:
    """The embedded engines, with the Dagster instance on the loopback PostgreSQL (`make cluster-up`)."""
    return embedded().derive(
        name="loopback_postgres", description="embedded engines; Dagster runs, events and schedules in PostgreSQL on "
                                              f"127.0.0.1:{POSTGRES_PORT}",
        dagster=DagsterProfile(storage="postgres", postgres=PostgresConfig(port=POSTGRES_PORT,
                                                                            password=POSTGRES_PASSWORD)))
