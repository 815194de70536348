"""The refinement chain on a real Spark standalone cluster on loopback, against `local[2]`.

A module-scoped fixture starts a master and two workers (1 core, 1g each) with pyspark's own
`bin/spark-class` on free 127.0.0.1 ports, waits until both workers have registered, and stops
them by PID. The whole six-step chain over the toy corpus of `tests/data/refine/test_pipeline.py`
(21 files: duplicates, an empty and a generated file, planted secrets and a HumanEval solution) runs
once on `local[2]` and once on `spark://127.0.0.1:<port>`, each into its own embedded lake; every
step must keep the same doc ids with the same text and redaction labels, and drop the same
documents for the same reasons. One SparkSession per process: the local session is stopped before
the cluster's, and the cluster's is stopped at module end so later tests get local sessions.

The same chain runs a third time on the cluster into an Iceberg REST catalog over S3 (the
session's SeaweedFS, a fresh warehouse bucket): the executors read and write the s3:// data files
through pyarrow (no S3A jars here) and must decide exactly as `local[2]` did.

The first three tests are unit tests (no JVM): the session settings a `spark://` master gets, the
executors' S3 settings, and `SparkResource` following the active profile. The others are in the
`slow` tier (a JDK, three Spark daemons, SeaweedFS for the REST one, and two sessions): ~2.5 min on an idle 2-core machine, more under load.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import time
import uuid
from pathlib import Path

import pytest

from factory.data.ingest import ingest_source
from configs.deploy import loopback
from factory.data.objectstore import ArrowS3, executor_s3, fs_path
from factory.data.refine.pipeline import EXCLUSIONS_TABLE, run_step
from factory.data.sources import DirectorySource
from factory.data.spark import session_conf, spark_session
from factory.deploy import open_lake
from factory.deploy.config import LOOPBACK_JVM_OPTIONS, S3Config, Secret, SparkProfile
from factory.deploy.seaweed import create_warehouse
from factory.deploy.spark_cluster import start_spark_cluster
from factory.lake import Lake, LakeError


def _toy_corpus():
    """The refinement tests' toy source and pipeline (tests/ is not a package: load by path)."""
    path = Path(__file__).parents[1] / "data" / "refine" / "test_pipeline.py"
    spec = importlib.util.spec_from_file_location("_refine_toy_corpus", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOY = _toy_corpus()
TIMINGS: dict[str, float] = {}


def test_a_standalone_master_gets_executor_python_utc_and_a_loopback_driver():
    s3 = S3Config(endpoint="http://127.0.0.1:8333", access_key_id=Secret(env="NO_SUCH_VAR_K", default="k"),
                  secret_access_key=Secret(env="NO_SUCH_VAR_S", default="s"))
    conf = session_conf(SparkProfile(master="spark://127.0.0.1:7077", conf={"spark.executor.memory": "1g"}))
    assert conf["spark.pyspark.python"] == conf["spark.executorEnv.PYSPARK_PYTHON"] == sys.executable
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert conf["spark.sql.execution.arrow.pyspark.enabled"] == "true"
    assert conf["spark.sql.parquet.outputTimestampType"] == "TIMESTAMP_MICROS"
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.executor.memory"] == "1g" and "spark.driver.memory" not in conf  # local only
    assert session_conf(SparkProfile(master="local[2]"))["spark.driver.memory"] == "4g"
    assert conf["spark.driver.extraJavaOptions"] == conf["spark.executor.extraJavaOptions"] == LOOPBACK_JVM_OPTIONS
    assert session_conf(SparkProfile(master="local[2]"))["spark.driver.extraJavaOptions"] == LOOPBACK_JVM_OPTIONS

    remote = session_conf(SparkProfile(master="spark://spark-master:7077", python="/opt/venv/bin/python",
                                       driver_host="10.0.0.5"))
    assert remote["spark.pyspark.python"] == "/opt/venv/bin/python" and remote["spark.driver.host"] == "10.0.0.5"
    assert "spark.driver.bindAddress" not in remote and "spark.ui.enabled" not in remote
    assert "spark.executor.extraJavaOptions" not in remote  # a real cluster keeps its JVMs as they are

    s3a = session_conf(SparkProfile(master="spark://127.0.0.1:7077", object_store="s3a"), s3=s3)
    assert s3a["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:8333"
    assert s3a["spark.hadoop.fs.s3a.access.key"] == "k" and s3a["spark.hadoop.fs.s3a.secret.key"] == "s"
    assert s3a["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert "spark.hadoop.fs.s3a.endpoint" not in conf  # arrow (the default) adds no Hadoop settings
    with pytest.raises(ValueError, match="object_store='s3a'.*no `s3` settings"):
        session_conf(SparkProfile(master="spark://127.0.0.1:7077", object_store="s3a"))


def test_the_spark_resource_follows_the_active_profile_and_its_own_fields_override(monkeypatch):
    from resources import SparkResource

    monkeypatch.delenv("FACTORY_DEPLOY_JSON", raising=False)
    monkeypatch.setenv("FACTORY_DEPLOY", "loopback")
    profile = SparkResource().spark_profile()
    assert profile.master == "spark://127.0.0.1:7077" and profile.conf["spark.cores.max"] == "2"
    pinned = SparkResource(master="local[2]", conf={"spark.executor.memory": "2g"}).spark_profile()
    assert pinned.master == "local[2]" and pinned.conf == {"spark.executor.memory": "2g", "spark.cores.max": "2"}
    monkeypatch.delenv("FACTORY_DEPLOY")
    assert SparkResource().spark_profile().master == "local[*]"  # embedded

def test_executors_get_resolved_s3_settings_only_for_the_arrow_object_store():
    profile = loopback()
    s3 = executor_s3(profile)
    assert s3 == profile.catalog.s3
    assert executor_s3(profile.derive(spark=profile.spark.model_copy(update={"object_store": "s3a"}))) is None
    store = ArrowS3.of(s3)
    assert (store.endpoint, store.access_key, store.path_style) == ("http://127.0.0.1:8333", "factory", True)
    assert "factory-loopback-secret" not in repr(store)  # task closures may be logged
    assert fs_path("s3://warehouse/refined/toy/data/staged-1") == "warehouse/refined/toy/data/staged-1"
    with pytest.raises(ValueError, match="is not an s3://bucket/key URI"):
        fs_path("file:///tmp/x")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = time.monotonic()
    cluster = start_spark_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1, memory="1g")
    TIMINGS["cluster_start_s"] = round(time.monotonic() - started, 1)
    try:
        yield cluster
    finally:
        _stop_session()
        cluster.stop()
        assert not any(s.alive() for s in [cluster.master, *cluster.workers])
        print(f"\nspark cluster timings: {TIMINGS}")


def _stop_session() -> None:
    from pyspark.sql import SparkSession

    if (active := SparkSession.getActiveSession()) is not None:
        active.stop()


def session(master: str):
    """A session on `master`, stopping a running session on another master first."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and active.sparkContext.master != master:
        active.stop()
    return spark_session(master, app_name="refine-cluster-test")


def run_chain(spark, home: Path, lake: Lake | None = None, s3=None) -> dict:
    """Ingest the toy source into `lake` (default: a fresh embedded one at `home`) and run every
    step (`s3`: executors reach the data files through pyarrow); what each step decided."""
    (home / "src").mkdir(parents=True)
    TOY.write_source(home / "src")
    lake = lake or Lake.open(home=home)
    ingest_source(lake, DirectorySource(name="toy", root=str(home / "src"), include=["**/*.py", "*.md"]))
    started = time.monotonic()
    reports = [run_step(spark, lake, TOY.PIPELINE, i, run_id="cluster-test", s3=s3)
               for i in range(len(TOY.PIPELINE.steps))]
    seconds = time.monotonic() - started
    kept = {}
    for i, step in enumerate(TOY.PIPELINE.steps):
        rows = lake.table(TOY.PIPELINE.table(i)).scan(selected_fields=("doc_id", "content_sha256", "redactions"))
        kept[step.kind] = sorted(tuple(r.values()) for r in rows.to_arrow().to_pylist())
    excluded = lake.table(EXCLUSIONS_TABLE).scan(selected_fields=("step", "doc_id", "reason", "detail"))
    return {
        "kept": kept,
        "dropped": sorted(tuple(r.values()) for r in excluded.to_arrow().to_pylist()),
        "reports": [(r.step, r.rows_in, r.rows_out, r.dropped, r.redactions) for r in reports],
        "seconds": round(seconds, 1),
    }


@pytest.mark.slow
def test_the_cluster_registers_two_workers_on_loopback(cluster):
    state = cluster.state()
    assert state["aliveworkers"] == 2 and state["cores"] == 2
    assert cluster.url == f"spark://127.0.0.1:{cluster.port}" and len(cluster.pids) == 3
    assert all(w["host"] == "127.0.0.1" and w["state"] == "ALIVE" for w in state["workers"])


@pytest.fixture(scope="module")
def local_chain(tmp_path_factory):
    """The chain on `local[2]` into an embedded lake: the reference every cluster run must match."""
    result = run_chain(session("local[2]"), tmp_path_factory.mktemp("local"))
    TIMINGS["chain_local2_s"] = result["seconds"]
    return result


@pytest.fixture(scope="module")
def cluster_spark(cluster, local_chain):
    """The session on the standalone cluster (after the local reference, which needs its own)."""
    started = time.monotonic()
    spark = session(cluster.url)
    TIMINGS["cluster_session_s"] = round(time.monotonic() - started, 1)
    return spark


def assert_same_decisions(on_cluster: dict, local: dict) -> None:
    assert on_cluster["reports"] == local["reports"]
    assert [(step, rows_out) for step, _, rows_out, _, _ in on_cluster["reports"]] == [
        (step, TOY.ROWS[TOY.PIPELINE.table(i)]) for i, step in enumerate(TOY.DROPS)]
    assert {step: dict(dropped) for step, _, _, dropped, _ in on_cluster["reports"]} == TOY.DROPS
    assert on_cluster["kept"] == local["kept"]
    assert on_cluster["dropped"] == local["dropped"] and len(on_cluster["dropped"]) == 5


@pytest.mark.slow
def test_the_chain_on_the_cluster_decides_like_local(cluster, cluster_spark, local_chain, tmp_path):
    assert cluster_spark.sparkContext.master == cluster.url
    assert cluster_spark.conf.get("spark.pyspark.python") == sys.executable
    on_cluster = run_chain(cluster_spark, tmp_path)
    TIMINGS["chain_standalone_s"] = on_cluster["seconds"]
    # the work ran in the workers' executors (one core each), not in the driver
    assert sum(app["cores"] for app in cluster.state()["activeapps"]) == 2
    assert_same_decisions(on_cluster, local_chain)


@pytest.mark.slow
def test_the_chain_on_the_cluster_over_rest_and_s3_decides_like_local(cluster_spark, local_chain, rest_profile,
                                                                       tmp_path):
    """Executors read and write the s3:// data files through pyarrow (no S3A here)."""
    profile = create_warehouse(rest_profile, f"t-{uuid.uuid4().hex[:16]}")
    s3 = executor_s3(profile)
    assert s3 is not None and profile.spark.object_store == "arrow"
    on_s3 = run_chain(cluster_spark, tmp_path, lake=open_lake(profile, tmp_path), s3=s3)
    TIMINGS["chain_standalone_rest_s3_s"] = on_s3["seconds"]
    assert_same_decisions(on_s3, local_chain)

    lake = open_lake(profile, tmp_path)
    files = [t.file.file_path for t in lake.table(TOY.PIPELINE.table(5)).scan().plan_files()]
    assert files and all(f.startswith("s3://") for f in files)
    # the executors' own files (Spark's writer would name them part-<n>-<uuid>-c000.snappy.parquet)
    assert all("/data/staged-" in f and re.fullmatch(r"part-\d{5}-\d+\.parquet", Path(f).name) for f in files)
    # without the pyarrow settings, Spark (no S3A jars) is told so, naming the table
    with pytest.raises(LakeError, match=r"raw\.toy: data files are on object storage .* no S3A"):
        run_step(cluster_spark, lake, TOY.PIPELINE, 0)


EXECUTOR_PROBE = """
from factory.data.spark import spark_session
spark = spark_session({master!r}, app_name="executor-python-probe")
def probe(_):
    import sys
    import factory  # the factory's own package: what a refinement UDF unpickles
    yield sys.prefix
print("EXECUTOR_PREFIX", spark.sparkContext.parallelize([0], 1).mapPartitions(probe).collect()[0])
spark.stop()
"""


@pytest.mark.slow
def test_executors_run_the_drivers_venv_in_a_fresh_driver(cluster, tmp_path):
    """A driver process that never ran a local session and has no PYSPARK_PYTHON: the executors
    must still run this venv (pyspark takes the executors' Python from the driver's environment, so
    a fresh `make demo` on the cluster failed with "No module named 'factory'" in every UDF)."""
    import os
    import subprocess

    _stop_session()  # a standalone app takes every free core: this process's session would starve the probe's
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    done = subprocess.run([sys.executable, "-c", EXECUTOR_PROBE.format(master=cluster.url)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(l for l in done.stdout.splitlines() if l.startswith("EXECUTOR_PREFIX"))
    assert line.split(" ", 1)[1] == sys.prefix
