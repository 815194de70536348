"""Run one refinement step of a source: read the pinned input, label, write, account, record.

`run_step` is what the `staged/...` and `refined/...` assets call. It reads the previous step's
table at its current snapshot (pinned in the stamp and lineage), applies the step, and commits

1. the kept rows to the step's table — Parquet written by the Spark executors into the table's
   data directory, then registered with one stamped `add_files` commit (the driver never holds
   the corpus). On object storage with `s3` (no S3A jars here) the executors read and write
   those files through pyarrow instead (`factory.data.objectstore`);
2. the dropped rows to `refined.exclusions`, replacing that (source, step)'s previous drops, so
   "what did near dedup remove from site_packages?" is one `factory sql` query;

the step's lineage row stamped into its snapshot and written right after (see `Lake.commit`). Counts (rows and bytes in/out, drops by reason,
redactions by kind) come from one aggregation over the labelled rows.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable

import fsspec
import pyarrow as pa
from pydantic import BaseModel, ConfigDict
from pyiceberg.expressions import And, EqualTo
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from factory.data import objectstore
from factory.data.refine.config import STEP_OUTPUT, RefineConfig
from factory.data.refine.steps import STEPS, split
from factory.deploy.config import S3Config
from factory.lake import CommitStamp, Lake, LakeError, ParquetFiles
from factory.lake.lineage import snapshot_record
from factory.lake.schemas import EXCLUSIONS, REFINED_DOCUMENTS
from factory.version import config_hash

EXCLUSIONS_TABLE = "refined.exclusions"
NOT_REPORTED = ("rows_dropped", "content_hash", "exclusions_hash")  # stats that go into stamps only


class StepReport(BaseModel):
    """What one step did to one source."""

    model_config = ConfigDict(frozen=True)

    source: str
    step: str
    input_table: str
    input_snapshot_id: int
    table: str
    snapshot_id: int | None
    rows_in: int
    rows_out: int
    bytes_in: int
    bytes_out: int
    dropped: dict[str, int]
    dropped_bytes: dict[str, int]
    redactions: dict[str, int]
    exclusions_snapshot_id: int | None
    seconds: float


def read_documents(spark: SparkSession, lake: Lake, table: str, snapshot_id: int,
                   s3: S3Config | None = None) -> DataFrame:
    """The table at `snapshot_id` as a Spark DataFrame, read from its data files in place.

    `s3` (the catalog's object store, when executors reach it through pyarrow) reads s3:// data
    files in the executors (`factory.data.objectstore`); otherwise Spark's own reader (file://, or
    s3:// through S3A where the image has it)."""
    tasks = list(lake.table(table).scan(snapshot_id=snapshot_id).plan_files())
    if any(t.delete_files for t in tasks):
        raise LakeError(f"{table}@{snapshot_id} has delete files, which this reader does not apply")
    paths = [t.file.file_path for t in tasks]
    if not paths:
        schema = lake.table(table).schema().as_arrow()
        return spark.createDataFrame([], _spark_ddl(schema))
    if s3 is not None and objectstore.on_object_store(paths[0]):
        return objectstore.read_parquet(spark, paths, _spark_ddl(lake.table(table).schema().as_arrow()), s3)
    _check_spark_reaches(spark, table, paths[0])
    return spark.read.parquet(*paths)


def _check_spark_reaches(spark: SparkSession, table: str, uri: str) -> None:
    """An s3:// file with neither pyarrow settings nor S3A configured: say so, not "No FileSystem"."""
    if objectstore.on_object_store(uri) and not spark.conf.get("spark.hadoop.fs.s3.impl", None):
        raise LakeError(f"{table}: data files are on object storage ({uri}) but Spark has no S3A file system; "
                        f"pass the catalog's S3Config (spark.object_store='arrow') or configure s3a")


def _spark_ddl(schema: pa.Schema) -> str:
    """Spark DDL for the document schemas' Arrow types (strings, longs, UTC timestamps)."""
    def spark_type(t: pa.DataType) -> str:
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return "string"
        if pa.types.is_int64(t):
            return "long"
        if pa.types.is_timestamp(t):
            return "timestamp"
        raise TypeError(f"no Spark type for Arrow {t}")

    return ", ".join(f"{f.name} {spark_type(f.type)}" for f in schema)


def write_parquet(lake: Lake, table: str, df: DataFrame, columns: list[str],
                  s3: S3Config | None = None) -> ParquetFiles | pa.Table:
    """Write `df` as Parquet under the table's data directory, for a one-commit `add_files`
    (on object storage with `s3`: one file per partition, written by the executors through pyarrow)."""
    uri = lake.staging_uri(table)
    if s3 is not None and objectstore.on_object_store(uri):
        written = objectstore.write_parquet(df.select(*columns), uri, s3)
        if not written:
            return pa.Table.from_pylist([], schema=lake.table(table).schema().as_arrow())
        return ParquetFiles(paths=[path for path, _ in written], rows=sum(rows for _, rows in written))
    _check_spark_reaches(df.sparkSession, table, uri)
    df.select(*columns).write.mode("error").parquet(uri)
    fs, path = fsspec.core.url_to_fs(uri)
    files = sorted(fs.glob(f"{path}/*.parquet"))
    if not files:
        return pa.Table.from_pylist([], schema=lake.table(table).schema().as_arrow())
    return ParquetFiles(paths=[fs.unstrip_protocol(f) for f in files], rows=-1)


def run_step(
    spark: SparkSession,
    lake: Lake,
    pipeline: RefineConfig,
    index: int,
    *,
    run_id: str = "",
    log: Callable[[str], None] = lambda message: None,
    s3: S3Config | None = None,
) -> StepReport:
    """Run step `index` of `pipeline` over the current snapshot of its input table (`s3`: the
    lake's object store, for executors that reach it through pyarrow — `objectstore.executor_s3`)."""
    started = time.perf_counter()
    step = pipeline.steps[index]
    source, input_table, table = pipeline.source, pipeline.table(index - 1), pipeline.table(index)
    snapshot = _pinned(lake, input_table, f"{step.kind} of {source}: input table {input_table} does not exist "
                       f"or is empty (materialize its asset first)")
    upstream = {input_table: snapshot}
    df = read_documents(spark, lake, input_table, snapshot, s3)
    others = None
    for other in getattr(step, "across_sources", []):
        other_table = f"staged.{other}_{STEP_OUTPUT['normalize']}"
        upstream[other_table] = _pinned(lake, other_table, f"exact_dedup.across_sources of {source}: {other_table} "
                                        f"does not exist (materialize staged/{other}_normalized first)")
        frame = read_documents(spark, lake, other_table, upstream[other_table], s3)
        others = frame if others is None else others.unionByName(frame)

    log(f"{source}: {step.kind} over {input_table}@{snapshot}")
    labelled = STEPS[step.kind](df, step, others).persist()
    try:
        stats = _stats(labelled, count_redactions=step.kind == "redact")
        kept, dropped = split(labelled)
        stamp = CommitStamp(asset_key=table.replace(".", "/"), config_hash=config_hash(step), run_id=run_id,
                            upstream=upstream, content_hash=stats["content_hash"])
        lake.ensure_table(table, REFINED_DOCUMENTS)
        report = StepReport(
            source=source, step=step.kind, input_table=input_table, input_snapshot_id=snapshot, table=table,
            snapshot_id=None, exclusions_snapshot_id=None, seconds=0.0,
            **{k: v for k, v in stats.items() if k not in NOT_REPORTED},
        )
        commit = lake.commit(
            table, _with_rows(write_parquet(lake, table, kept, list(REFINED_DOCUMENTS.as_arrow().names), s3),
                              stats["rows_out"]),
            stamp, mode="overwrite",
            lineage=snapshot_record(table, stamp, step, uri=lake.table(table).location(),
                                    metadata=report.model_dump(include={"rows_in", "rows_out", "bytes_in", "bytes_out",
                                                                        "dropped", "redactions"})),
        )
        lake.ensure_table(EXCLUSIONS_TABLE, EXCLUSIONS)
        excluded = dropped.select(
            "source", F.lit(step.kind).alias("step"), F.col("drop_reason").alias("reason"),
            F.col("drop_detail").alias("detail"), "doc_id", "path", "bytes", "text",
        )
        exclusions = lake.commit(
            EXCLUSIONS_TABLE,
            _with_rows(write_parquet(lake, EXCLUSIONS_TABLE, excluded, list(EXCLUSIONS.as_arrow().names), s3),
                       stats["rows_dropped"]),
            stamp.model_copy(update={"asset_key": f"{table.replace('.', '/')}:exclusions",
                                     "content_hash": stats["exclusions_hash"]}),
            mode="overwrite", overwrite_filter=And(EqualTo("source", source), EqualTo("step", step.kind)),
        )
    finally:
        labelled.unpersist()

    report = report.model_copy(update={"snapshot_id": commit.snapshot_id,
                                       "exclusions_snapshot_id": exclusions.snapshot_id,
                                       "seconds": round(time.perf_counter() - started, 2)})
    log(f"{source}: {step.kind} kept {report.rows_out}/{report.rows_in}, dropped {report.dropped}")
    return report


def _pinned(lake: Lake, table: str, missing: str) -> int:
    """The current snapshot id of `table`, or LakeError(`missing`) when it has none."""
    snapshot = lake.current_snapshot_id(table) if lake.has_table(table) else None
    if snapshot is None:
        raise LakeError(missing)
    return snapshot


def _with_rows(data: ParquetFiles | pa.Table, rows: int) -> ParquetFiles | pa.Table:
    return data.model_copy(update={"rows": rows}) if isinstance(data, ParquetFiles) else data


def _stats(labelled: DataFrame, count_redactions: bool) -> dict:
    """Rows/bytes in and out, drops by reason, redactions by kind, and the content hashes of the
    kept and the dropped rows — one aggregation job. A content hash is the row count and the sum of
    each row's 64-bit hash of (doc_id, text, drop reason), as a decimal so it cannot overflow:
    independent of row and file order, as executors write in no fixed order."""
    digest = F.xxhash64("doc_id", "text", F.coalesce("drop_reason", F.lit(""))).cast("decimal(38,0)")
    by_reason = labelled.groupBy("drop_reason").agg(
        F.count("*").alias("rows"), F.coalesce(F.sum("bytes"), F.lit(0)).alias("bytes"),
        F.coalesce(F.sum(digest), F.lit(0)).alias("digest"),
    ).collect()
    redactions: dict[str, int] = {}
    rows = labelled.where(F.col("redactions") != "{}").groupBy("redactions").count().collect() if count_redactions else []
    for row in rows:
        for kind, n in json.loads(row["redactions"]).items():
            redactions[kind] = redactions.get(kind, 0) + n * row["count"]
    kept = next((r for r in by_reason if r["drop_reason"] is None), None)
    dropped = {r["drop_reason"]: r["rows"] for r in by_reason if r["drop_reason"] is not None}
    return {
        "rows_in": sum(r["rows"] for r in by_reason),
        "rows_out": kept["rows"] if kept else 0,
        "rows_dropped": sum(dropped.values()),
        "bytes_in": sum(r["bytes"] for r in by_reason),
        "bytes_out": kept["bytes"] if kept else 0,
        "dropped": dict(sorted(dropped.items())),
        "dropped_bytes": {r["drop_reason"]: r["bytes"] for r in by_reason if r["drop_reason"] is not None},
        "redactions": dict(sorted(redactions.items())),
        "content_hash": _digest([kept] if kept else []),
        "exclusions_hash": _digest([r for r in by_reason if r["drop_reason"] is not None]),
    }


def _digest(groups) -> str:
    rows, total = sum(r["rows"] for r in groups), sum(int(r["digest"]) for r in groups)
    return hashlib.sha256(f"{rows}:{total}".encode()).hexdigest()[:24]
