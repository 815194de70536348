"""SparkResource starts one real local SparkSession per process, on loopback, and Spark output
reaches the lake through Arrow (Spark's own Iceberg connector cannot be fetched here).
Marked `spark`: needs a JDK; ~15 s for the session start."""

import os

import pytest

from factory.lake import CommitStamp, Lake
from resources import SparkResource

pytestmark = pytest.mark.spark


def test_one_local_session_on_loopback_feeds_the_lake(tmp_path):
    resource = SparkResource(master="local[2]")
    spark = resource.session()
    assert spark is resource.session()
    assert spark.sparkContext.master == "local[2]"
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert spark.conf.get("spark.driver.host") == "127.0.0.1"

    df = spark.createDataFrame([(i, f"doc {i}") for i in range(10)], "n long, text string")
    arrow = df.where("n % 2 = 0").toArrow()
    lake = Lake.open(home=tmp_path)
    lake.ensure_table("scratch.even", _schema())
    commit = lake.commit("scratch.even", arrow, CommitStamp(asset_key="test/spark", config_hash="x"))
    assert commit.rows == 5
    assert sorted(lake.table("scratch.even").scan().to_arrow().column("n").to_pylist()) == [0, 2, 4, 6, 8]

    with pytest.raises(RuntimeError, match="already running"):
        SparkResource(master="local[1]").session()


def _schema():
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    return Schema(NestedField(1, "n", LongType(), required=False), NestedField(2, "text", StringType(), required=False))
