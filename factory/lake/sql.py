"""SQL over the lake: DuckDB with one view per Iceberg table, addressed as `namespace.table`.

`query(lake, sql)` opens an in-memory DuckDB connection, creates a DuckDB schema per Iceberg
namespace and a view per table, runs the query and returns Arrow. It backs `factory sql` and any
code that wants an ad-hoc join over the lake (the lineage table included) without Spark.

Why views over `iceberg_scan(<metadata file>)` rather than a glob over the data files: the scan
follows the table's manifests, so a query sees exactly the committed snapshot — files orphaned by a
crashed or retried commit are never read, and DuckDB prunes files with the manifests' statistics.
Each view pins the metadata file that is current when the connection is opened. A table whose
metadata cannot be read gets no view: queries over the other tables run, and one that names it
fails with its error.

DuckDB's `INSTALL iceberg` downloads the extension, and the factory's machines are offline, so the
avro extension (which iceberg needs to read manifests) and then the iceberg extension are `LOAD`ed
from the files the `duckdb-extension-avro` / `duckdb-extension-iceberg` wheels ship; those wheels
are pinned to the same version as `duckdb`, which is the only version the files load into.

Object storage: a table on `s3://` (a REST catalog's warehouse) is scanned the same way, through
DuckDB's `httpfs` extension (`LOAD`ed from the `duckdb-extension-httpfs` wheel, only when a table
needs it) and one `CREATE SECRET` per bucket built from the table's own FileIO properties (endpoint,
region, keys — what pyiceberg itself reads the table with, including what the REST catalog hands
out). A table on storage DuckDB cannot reach that way (no explicit keys: an SDK credential chain,
or another scheme) falls back to a pyiceberg `scan().to_arrow()` copied into DuckDB: correct, but
it reads the whole table into memory, so keep it to small tables.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from urllib.parse import urlparse

import duckdb
import pyarrow as pa

from factory.lake.catalog import Lake, LakeError, TableUnreadable
from factory.suggest import hint

# Load order matters: iceberg reads manifest lists and manifests through avro.
EXTENSIONS = (("duckdb_extension_avro", "avro"), ("duckdb_extension_iceberg", "iceberg"))
HTTPFS = ("duckdb_extension_httpfs", "httpfs")


class QueryError(LakeError):
    """A query failed: bad SQL, an unknown table or column; the message says which."""


def extension_path(package: str, extension: str) -> Path:
    """The `<extension>.duckdb_extension` file a `duckdb-extension-*` wheel ships for this duckdb."""
    try:
        module = importlib.import_module(package)
    except ImportError:
        raise LakeError(
            f"DuckDB extension package {package} is not installed "
            f"(pip install {package.replace('_', '-')}=={duckdb.__version__})"
        ) from None
    path = Path(module.__file__).parent / "extensions" / f"v{duckdb.__version__}" / f"{extension}.duckdb_extension"
    if not path.is_file():
        raise LakeError(
            f"{path} is missing: {package} does not match duckdb {duckdb.__version__} "
            f"(pip install {package.replace('_', '-')}=={duckdb.__version__})"
        )
    return path


def load_extensions(con: duckdb.DuckDBPyConnection) -> None:
    """LOAD avro, then iceberg, from the wheel-shipped files (never INSTALL: no network)."""
    for package, extension in EXTENSIONS:
        con.execute(f"LOAD {_literal(str(extension_path(package, extension)))}")


def connect(lake: Lake, unreadable: dict[str, str] | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with every lake table as the view `namespace.table`; a table
    whose metadata cannot be read gets no view (its error goes into `unreadable`), so a query over
    the others still runs."""
    con = duckdb.connect(":memory:")
    load_extensions(con)
    buckets: set[str] = set()
    for name in lake.tables():
        namespace, table_name = name.rsplit(".", 1)
        try:
            table = lake.table(name)
        except TableUnreadable as e:
            if unreadable is not None:
                unreadable[name] = str(e)
            continue
        target = f"{_ident(namespace)}.{_ident(table_name)}"
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {_ident(namespace)}")
        metadata = local_metadata_path(table.metadata_location)
        if metadata is None and (secret := s3_secret(table.metadata_location, table.io.properties)) is not None:
            bucket = urlparse(table.metadata_location).netloc
            if not buckets:
                con.execute(f"LOAD {_literal(str(extension_path(*HTTPFS)))}")
            if bucket not in buckets:
                con.execute(f"CREATE SECRET {_ident('s3_' + str(len(buckets)))} ({secret})")
                buckets.add(bucket)
            metadata = table.metadata_location
        if metadata is not None:
            con.execute(f"CREATE VIEW {target} AS SELECT * FROM iceberg_scan({_literal(metadata)})")
        else:
            # Not a local warehouse (see the module docstring): copy the current snapshot in.
            staged = f"__factory_stage_{abs(hash(name))}"
            con.register(staged, table.scan().to_arrow())
            con.execute(f"CREATE TABLE {target} AS SELECT * FROM {staged}")
            con.unregister(staged)
    return con


def local_metadata_path(location: str) -> str | None:
    """The local path of a `file://` (or bare path) metadata location; None for object storage."""
    if location.startswith("file://"):
        return location.removeprefix("file://")
    return location if location.startswith("/") else None


def s3_secret(location: str, io: dict[str, str]) -> str | None:
    """The body of a DuckDB `CREATE SECRET` for the bucket of an `s3://` `location`, from the
    table's FileIO properties; None when DuckDB cannot read it with explicit keys."""
    parsed = urlparse(location)
    key, secret = io.get("s3.access-key-id"), io.get("s3.secret-access-key")
    if parsed.scheme not in ("s3", "s3a") or not key or not secret:
        return None
    fields = {"TYPE": "s3", "KEY_ID": _literal(key), "SECRET": _literal(secret),
              "REGION": _literal(io.get("s3.region") or io.get("client.region") or "us-east-1"),
              "SCOPE": _literal(f"s3://{parsed.netloc}")}
    if token := io.get("s3.session-token"):
        fields["SESSION_TOKEN"] = _literal(token)
    if endpoint := io.get("s3.endpoint"):
        url = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        fields |= {"ENDPOINT": _literal(url.netloc), "USE_SSL": str(url.scheme == "https").lower()}
    virtual = io.get("s3.force-virtual-addressing", "false").lower() == "true"
    fields["URL_STYLE"] = _literal("vhost" if virtual else "path")
    return ", ".join(f"{k} {v}" for k, v in fields.items())


def query(lake: Lake, sql: str) -> pa.Table:
    """Run `sql` over the lake and return the result as Arrow; `QueryError` names what is wrong."""
    unreadable: dict[str, str] = {}
    con = connect(lake, unreadable)
    try:
        relation = con.sql(sql)  # None for statements without a result (CREATE, SET, ...)
        return relation.to_arrow_table() if relation is not None else pa.table({})
    except duckdb.CatalogException as exc:
        message = _catalog_message(str(exc), sql, lake.tables())
        broken = next((e for name, e in unreadable.items() if message.startswith(f"unknown table {name} ")), None)
        raise QueryError(broken or message) from None
    except duckdb.Error as exc:
        raise QueryError(f"query failed: {str(exc).strip()}") from None
    finally:
        con.close()


def _catalog_message(message: str, sql: str, tables: list[str]) -> str:
    missing = re.search(r'Table with name "?([^"\s!]+)"? does not exist', message)
    if missing is None:
        known = ", ".join(tables) or "none yet: ingest or materialize something first"
        return f"query failed: {_first_line(message)} (tables in the lake: {known})"
    name = missing.group(1)
    if "." not in name:
        # DuckDB names only the last part of `raw.nope`; recover the qualified name from the query.
        qualified = re.search(rf'([A-Za-z_][\w]*|"[^"]+")\s*\.\s*"?{re.escape(name)}"?\b', sql)
        if qualified:
            name = f"{qualified.group(1).strip(chr(34))}.{name}"
    if not tables:
        return f"unknown table {name} (no tables yet: ingest or materialize something first)"
    return f"unknown table {name} ({hint(name, tables)}`factory tables` lists all {len(tables)})"


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else message


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
