"""One SparkSession per process, local by default, a cluster by configuration.

The session's settings come from one function, `session_conf(profile)`, whatever the master:

- everywhere: UTC session time zone, Arrow for pandas UDFs, 8 shuffle partitions, Parquet
  timestamps Iceberg can register (micros, UTC-adjusted), small Arrow batches (a few huge
  documents must not blow a Python worker's memory), and the executors' Python — the profile's
  `python`, else this interpreter — so the Python workers of a standalone or Kubernetes cluster
  run the venv that has pyarrow and pandas, not whatever `python3` a worker's PATH finds;
- loopback masters (`local[*]`, `spark://127.0.0.1:...`): driver host and bind address
  127.0.0.1 (this machine has no other network; a laptop should not expose a driver), no UI, and
  JVMs that compile less (`LOOPBACK_JVM_OPTIONS`: C1 only, serial GC) for the driver and the
  executors: on one machine the jobs are short and the cores few, and C2's and a parallel
  collector's threads took more CPU than the jobs (the refine pipeline's test, 8 tests on a 21-file
  source: 264 s -> 126 s on 2 busy cores);
  other masters get the profile's `driver_host` when it names one;
- local masters only: `spark.driver.memory`, because there the driver *is* the executor; a
  cluster driver holds only plans and counts;
- `object_store="s3a"`: Hadoop's S3A settings generated from the catalog's `S3Config`, for
  cluster images that carry the hadoop-aws jars. `arrow` (the default, and what works here) adds
  nothing: executors reach s3:// through pyarrow (`factory.data.objectstore`).

A profile's own `conf` wins over all of these. Spark cannot load its Iceberg connector here (no jar
registry), so Spark stages write Parquet for the lake's `add_files` commit.
"""

from __future__ import annotations

import os
import sys

from factory.deploy.config import LOOPBACK_JVM_OPTIONS, S3Config, SparkProfile

LOOPBACK = "127.0.0.1"
DEFAULTS = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "1000",
}
LOCAL_DEFAULTS = {"spark.driver.memory": "4g"}
LOOPBACK_DEFAULTS = {"spark.ui.enabled": "false", "spark.driver.extraJavaOptions": LOOPBACK_JVM_OPTIONS,
                     "spark.executor.extraJavaOptions": LOOPBACK_JVM_OPTIONS}


def session_conf(profile: SparkProfile, s3: S3Config | None = None) -> dict[str, str]:
    """Every setting a session for `profile` is built with (see the module docstring)."""
    python = profile.python or sys.executable
    conf = {**DEFAULTS, "spark.pyspark.python": python, "spark.executorEnv.PYSPARK_PYTHON": python}
    if profile.local:
        conf |= LOCAL_DEFAULTS
    if profile.loopback:
        conf |= LOOPBACK_DEFAULTS
    host = profile.driver_host or (LOOPBACK if profile.loopback else None)
    if host:
        conf["spark.driver.host"] = host
        if host == LOOPBACK:  # a remote driver_host may be a NAT address the driver cannot bind
            conf["spark.driver.bindAddress"] = LOOPBACK
    if profile.object_store == "s3a":
        if s3 is None:
            raise ValueError(f"spark.object_store='s3a' for master {profile.master}: the catalog has no `s3` "
                             f"settings to generate Hadoop's S3A configuration from")
        conf |= s3.hadoop_s3a_conf()
    return conf | profile.conf


def spark_session_for(profile: SparkProfile, app_name: str = "model-factory", s3: S3Config | None = None):
    """The process's SparkSession for `profile`, created on first use.

    Later calls return the same session (Spark allows one active session per JVM); asking for a
    different master while one runs is an error rather than a silent reuse — `stop()` it first.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        running = active.sparkContext.master
        if running != profile.master:
            raise RuntimeError(f"a SparkSession for master {running!r} is already running; asked for "
                               f"{profile.master!r} (stop the running one first)")
        return active
    conf = session_conf(profile, s3)
    if profile.loopback:
        # setting (never reading) the process environment: the JVM the builder launches binds here
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    # pyspark's SparkContext takes the Python its executors run from the driver's PYSPARK_PYTHON
    # (not from spark.pyspark.python), for every master: unset, a standalone cluster's executors run
    # whatever `python3` their PATH finds, without the factory's packages
    os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
    builder = SparkSession.builder.master(profile.master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def spark_session(master: str = "local[*]", app_name: str = "model-factory", conf: dict[str, str] | None = None):
    """The process's SparkSession on `master` with extra `conf` (a profile of just those)."""
    return spark_session_for(SparkProfile(master=master, conf=conf or {}), app_name)
