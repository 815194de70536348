"""Spark executors reading and writing the lake's `s3://` data files through pyarrow.

Spark reaches object storage through Hadoop's S3A, whose jars (hadoop-aws, the AWS SDK) are in no
registry this machine can reach. pyarrow's `S3FileSystem` is already in every executor's Python
(pandas UDFs need pyarrow), so with `spark.object_store="arrow"` the refinement chain moves its
data files through Python tasks instead:

- read: the driver plans the Iceberg scan (pyiceberg) and hands the data-file list to Spark, one
  file per partition; each task opens its file with `S3FileSystem` and yields Arrow batches cast
  to the table's Spark schema (`mapInArrow`). The driver never holds the rows.
- write: each partition of the DataFrame is written by its task as one Parquet file under the
  table's staging URI, and the task returns `(path, rows)`; the driver collects only those
  pairs for the one-commit `add_files` (`ParquetFiles`). A retried task writes a new file name
  (the attempt id is in it) and only the successful attempt's path is returned, so a failed
  attempt leaves an orphan in the staging directory, never a registered duplicate.

Credentials are resolved on the driver from the catalog's `S3Config` and travel inside the task
closure as an `ArrowS3` (executors have no profile and read no environment); its `repr` hides
the keys. `file://` locations never come here: they keep Spark's own Parquet reader and writer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlparse

import pyarrow as pa

from factory.deploy.config import DeployConfig, S3Config

SCHEMES = ("s3", "s3a", "s3n")
READ_BATCH_ROWS = 1000  # as spark.sql.execution.arrow.maxRecordsPerBatch: huge documents stay bounded


def on_object_store(uri: str) -> bool:
    return urlparse(uri).scheme in SCHEMES


def executor_s3(profile: DeployConfig) -> S3Config | None:
    """The S3 settings executors use through pyarrow: the catalog's, when the profile's Spark
    reaches object storage that way (`object_store="arrow"`); None = Spark's own file systems."""
    return profile.catalog.s3 if profile.spark.object_store == "arrow" else None


@dataclass(frozen=True)
class ArrowS3:
    """Resolved, picklable settings for pyarrow's `S3FileSystem` inside a Spark task."""

    endpoint: str | None
    region: str
    access_key: str | None = field(repr=False)
    secret_key: str | None = field(repr=False)
    path_style: bool = True

    @classmethod
    def of(cls, s3: S3Config, where: str = "catalog.s3") -> "ArrowS3":
        key, secret = s3.keys(where)
        return cls(endpoint=s3.endpoint, region=s3.region, access_key=key, secret_key=secret,
                   path_style=s3.path_style)

    def filesystem(self, timeout_s: float = 60, attempts: int = 3):
        from pyarrow import fs

        return fs.S3FileSystem(endpoint_override=self.endpoint, access_key=self.access_key,
                               secret_key=self.secret_key, region=self.region,
                               force_virtual_addressing=not self.path_style, connect_timeout=min(10, timeout_s),
                               request_timeout=timeout_s,
                               retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=attempts))


def fs_path(uri: str) -> str:
    """`s3://bucket/key` -> `bucket/key`, the path pyarrow's S3 file system takes."""
    parsed = urlparse(uri)
    if parsed.scheme not in SCHEMES or not parsed.netloc:
        raise ValueError(f"{uri!r} is not an s3://bucket/key URI")
    return f"{parsed.netloc}{parsed.path}".rstrip("/")


def read_parquet(spark, paths: list[str], ddl: str, s3: S3Config):
    """The Parquet files `paths` (s3:// URIs) as a DataFrame of schema `ddl`, read by the executors."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_string

    schema: StructType = _parse_datatype_string(ddl)
    target = to_arrow_schema(schema, timezone="UTC")
    store = ArrowS3.of(s3)

    def read(batches):
        import pyarrow.parquet as pq

        filesystem = store.filesystem()
        for batch in batches:
            for uri in batch.column(0).to_pylist():
                with filesystem.open_input_file(fs_path(uri)) as f:
                    for chunk in pq.ParquetFile(f).iter_batches(batch_size=READ_BATCH_ROWS, columns=target.names):
                        yield pa.RecordBatch.from_arrays(
                            [chunk.column(name).cast(t.type) for name, t in zip(target.names, target)], schema=target)

    files = spark.sparkContext.parallelize([(p,) for p in paths], numSlices=max(1, len(paths)))
    return spark.createDataFrame(files, "path string").mapInArrow(read, schema)


def write_parquet(df, uri: str, s3: S3Config) -> list[tuple[str, int]]:
    """Write each partition of `df` as one Parquet file under `uri` (s3://) from its task;
    `(path, rows)` of the files written, in path order (empty partitions write nothing)."""
    store, base = ArrowS3.of(s3), fs_path(uri)
    scheme = urlparse(uri).scheme

    def write(batches):
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        task = TaskContext.get()
        name = f"part-{task.partitionId():05d}-{task.taskAttemptId()}.parquet"
        filesystem, writer, out, rows = store.filesystem(), None, None, 0
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                if writer is None:
                    out = filesystem.open_output_stream(f"{base}/{name}")
                    writer = pq.ParquetWriter(out, batch.schema)
                writer.write_batch(batch)
                rows += batch.num_rows
        finally:
            if writer is not None:
                writer.close()
            if out is not None:
                out.close()
        if rows:
            yield pa.RecordBatch.from_pylist([{"path": f"{scheme}://{base}/{name}", "rows": rows}],
                                             schema=pa.schema([("path", pa.string()), ("rows", pa.int64())]))

    return sorted((r["path"], r["rows"]) for r in df.mapInArrow(write, "path string, rows long").collect())
