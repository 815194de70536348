"""One SparkSession per process, local by default, a cluster by configuration.

Locally Spark binds to loopback (`SPARK_LOCAL_IP=127.0.0.1`: this machine has no other network,
and a laptop should not expose a driver), runs `local[*]`, and keeps its UI off. A cluster is a
master URL (`spark://...`, `k8s://...`) plus `conf` — the refinement code does not change.
Spark cannot load its Iceberg connector here (no jar registry), so Spark stages hand Arrow to the
lake's commit path (`DataFrame.toArrow()`) or write Parquet for `add_files`.
"""

from __future__ import annotations

import os
import sys

LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "4g",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}
# Wherever Spark runs: Parquet timestamps Iceberg can register (micros, UTC-adjusted), and
# Arrow batches small enough that a few huge documents do not blow a Python worker's memory.
ALWAYS = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "1000",
}


def spark_session(master: str = "local[*]", app_name: str = "model-factory", conf: dict[str, str] | None = None):
    """The process's SparkSession, created on first use with `master` and `conf`.

    Later calls return the same session (Spark allows one active session per JVM); asking for a
    different master while one runs is an error rather than a silent reuse.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        running = active.sparkContext.master
        if running != master:
            raise RuntimeError(f"a SparkSession for master {running!r} is already running; asked for {master!r}")
        return active
    settings = {**ALWAYS, **(LOCAL_DEFAULTS if master.startswith("local") else {})}
    settings.update(conf or {})
    if master.startswith("local"):
        # Python workers must run this interpreter (the venv), not whatever `python3` PATH finds.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings.setdefault("spark.driver.host", "127.0.0.1")
        settings.setdefault("spark.driver.bindAddress", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
