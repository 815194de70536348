"""Catalog access: one `Lake` over a pyiceberg catalog, embedded by default, REST at scale.

The embedded default is a `SqlCatalog` on sqlite with a `file://` warehouse, both under
`$FACTORY_HOME/lake`; the same code talks to an Iceberg REST catalog on object storage when the
config says `kind="rest"` (extra `properties` carry `s3.endpoint`, credentials, tokens). Tables are
created from declared schemas (`factory.lake.schemas`), never inferred from whatever a writer
happened to produce.

Opening a REST lake checks both doors before anything is written: the catalog must accept the
credential (loading the catalog already asks it for its config), and the object store must accept
the S3 keys for the warehouse bucket (one HeadBucket). Otherwise a wrong secret key would surface
mid-commit — after the namespace and table were created — as an S3 signature error on some
manifest key. The errors name the deploy profile's field (`catalog.credential`,
`catalog.s3.access_key_id` / `secret_access_key`).

Opening the embedded catalog of a home that was moved or copied (its tables' paths point outside
it: Iceberg stores absolute paths) fails with `HomeMoved`, saying how to fix it (`factory.lake.moved`).

Opening the embedded sqlite catalog refuses a `catalog.db` that is missing, empty or not sqlite
while the warehouse holds tables: sqlite takes a 0-byte file for an empty database, and the next
ingest would create a new table over the old one's directory and orphan its history. The error
names the file and the ways back (`factory lake recover` re-registers each table from its newest
metadata file). A table whose metadata cannot be read fails alone (`TableUnreadable`, naming it);
listing the catalog never loads a table.
"""

from __future__ import annotations

import functools
import re
import uuid
from pathlib import Path
from typing import Callable, Literal

import pyarrow as pa
import requests
import sqlalchemy.exc
from pydantic import BaseModel, ConfigDict, Field
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import (
    ForbiddenError,
    NoSuchTableError,
    OAuthError,
    ServerError,
    UnauthorizedError,
    ValidationError,
)
from pyiceberg.expressions import BooleanExpression
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from factory.home import factory_home, lake_dir
from factory.lake.commit import (
    CommitStamp,
    ParquetFiles,
    TableCommit,
    commit_with_retry,
)
from factory.lake.lineage import HEAL_WINDOW, LineageRecord, LineageStore, stamped_row

# What loading a table raises when its metadata file is missing (OSError), not JSON or not table
# metadata (pyiceberg's ValidationError, ValueError), or a REST catalog cannot read it (ServerError).
UNREADABLE = (OSError, ValueError, ValidationError, ServerError)
SQLITE_MAGIC = b"SQLite format 3\x00"


class LakeError(RuntimeError):
    """A lake operation failed on a named table or input."""


class HomeMoved(LakeError):
    """The embedded catalog of this home was written at another path (moved or copied home);
    the message says which and what to run (`factory.lake.moved`)."""


class TableUnreadable(LakeError):
    """A table is in the catalog but its metadata cannot be read; the other tables still can."""

    def __init__(self, name: str, error: BaseException):
        self.table = name
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
        super().__init__(f"table {name} is unreadable: its metadata cannot be loaded ({detail[:300]}); "
                         f"`factory doctor` checks every table, `factory ingest --force` rebuilds a raw table "
                         f"from its source")


class CatalogConfig(BaseModel):
    """Which Iceberg catalog the factory talks to."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["sql", "rest"] = Field("sql", description="`sql` (embedded sqlite) or `rest`.")
    name: str = Field("factory", description="Catalog name (appears in pyiceberg's logs).")
    uri: str | None = Field(
        None,
        description="SQLAlchemy URL (sql) or REST endpoint (rest); default: sqlite under FACTORY_HOME/lake.",
    )
    warehouse: str | None = Field(
        None, description="Warehouse root URL; default: file:// under FACTORY_HOME/lake/warehouse."
    )
    properties: dict[str, str] = Field(
        default_factory=dict,
        description="Extra catalog/FileIO properties, e.g. s3.endpoint, s3.access-key-id, token.",
    )

    def catalog_properties(self, home: Path) -> dict[str, str]:
        """The property dict pyiceberg's `load_catalog` takes, with embedded defaults filled in."""
        props = {"type": self.kind, **self.properties}
        if self.kind == "sql":
            root = lake_dir(home)
            props["uri"] = self.uri or f"sqlite:///{root / 'catalog.db'}"
            props["warehouse"] = self.warehouse or (root / "warehouse").as_uri()
        else:
            if not self.uri:
                raise LakeError("catalog config: kind='rest' needs `uri` (the REST endpoint)")
            props["uri"] = self.uri
            if self.warehouse:
                props["warehouse"] = self.warehouse
        return props


class Lake:
    """A catalog plus the factory's conventions: declared schemas, stamped commits, lineage."""

    def __init__(self, catalog: Catalog, home: Path):
        self.catalog = catalog
        self.home = home

    @classmethod
    def open(cls, config: CatalogConfig | None = None, home: str | Path | None = None, *,
             recovering: bool = False) -> "Lake":
        """The lake of `config` (default: embedded under `home`). `recovering` skips the check
        that a sqlite catalog is not missing or empty beside a warehouse of tables (`factory lake
        recover` opens it to re-register them)."""
        config = config or CatalogConfig()
        home_path = factory_home(home)
        if config.kind == "sql" and config.uri is None:
            (lake_dir(home_path) / "warehouse").mkdir(parents=True, exist_ok=True)
        props = config.catalog_properties(home_path)
        if config.kind == "rest":
            return cls(_open_rest(config.name, props), home_path)
        db = sqlite_file(props["uri"])
        held = warehouse_tables(props.get("warehouse", ""))
        if db is not None:
            _check_sqlite_file(db, held, recovering)
        if config.uri is None and config.warehouse is None:  # the embedded layout: every path is under home
            from factory.lake.moved import moved_home

            moved = moved_home(home_path)
            if moved is not None:
                raise HomeMoved(str(moved))
        try:
            lake = cls(load_catalog(config.name, **props), home_path)
            empty = bool(held) and not recovering and not lake.tables()
        except sqlalchemy.exc.DatabaseError as e:  # a damaged sqlite file ("file is not a database")
            raise LakeError(f"catalog {props['uri']} cannot be read ({e.orig or e}); {_RECOVERY}") from None
        if empty:
            raise LakeError(f"catalog {props['uri']} lists no tables but its warehouse holds {_listed(held)}: "
                            f"writing now would orphan their history; {_RECOVERY}")
        return lake

    # -- tables ---------------------------------------------------------------------------------
    def table(self, name: str) -> Table:
        """Load `namespace.table`, or fail saying which table is missing or unreadable."""
        if "." not in name:
            raise LakeError(f"table name {name!r} needs a namespace, e.g. raw.{name}")
        try:
            return self.catalog.load_table(name)
        except NoSuchTableError:
            raise LakeError(f"table {name} does not exist in the lake (materialize its asset first)") from None
        except UNREADABLE as e:
            raise TableUnreadable(name, e) from None

    def has_table(self, name: str) -> bool:
        # a name without a namespace (an artifact such as `tokenizer/bpe-1k`) is never a table;
        # pyiceberg would raise "Empty namespace identifier" instead of answering
        if "." not in name:
            return False
        try:
            return self.catalog.table_exists(name)  # loads the table (sqlite catalog)
        except UNREADABLE:
            return True  # it is there, broken: `table()` says how

    def ensure_table(self, name: str, schema: Schema) -> Table:
        """Create `name` with the declared `schema` if it is missing (namespace too)."""
        namespace = name.rsplit(".", 1)[0]
        self.catalog.create_namespace_if_not_exists(namespace)
        try:
            return self.catalog.create_table_if_not_exists(name, schema=schema)
        except UNREADABLE as e:
            raise TableUnreadable(name, e) from None

    def drop_unreadable(self, name: str) -> None:
        """Remove `name` from the catalog so it can be created afresh: its snapshot history is
        gone from the catalog; its files stay where they are, referenced by nothing."""
        self.catalog.drop_table(name)

    def tables(self) -> list[str]:
        """Every `namespace.table` in the catalog, sorted."""
        names = []
        for ns in self.catalog.list_namespaces():
            names += [".".join(ident) for ident in self.catalog.list_tables(ns)]
        return sorted(names)

    def current_snapshot_id(self, name: str) -> int | None:
        snapshot = self.table(name).current_snapshot()
        return snapshot.snapshot_id if snapshot else None

    # -- writes ---------------------------------------------------------------------------------
    def commit(
        self,
        name: str,
        data: pa.Table | ParquetFiles | Callable[[Table], pa.Table | None],
        stamp: CommitStamp,
        *,
        mode: Literal["append", "overwrite"] = "append",
        overwrite_filter: BooleanExpression | None = None,
        schema: Schema | None = None,
        on_files_written: Callable[[], None] | None = None,
        lineage: LineageRecord | None = None,
    ) -> TableCommit:
        """Write `data` to `name` as one atomic, stamped snapshot (retrying concurrent commits).

        `schema` creates the table when it is missing. `overwrite_filter` limits an overwrite to
        matching rows. `on_files_written` runs after the data files are written and before the
        metadata commit — the moment a crash must not matter. `lineage` is the row this snapshot
        gets in `factory.lineage`: it is stamped into the snapshot (with the table snapshots
        behind its upstream, when the stamp names none) and written after the commit by healing
        the table, so a row a crash lost is written by the next commit (`LineageStore.heal`).
        """
        if schema is not None:
            self.ensure_table(name, schema)
        if lineage is not None:
            if not stamp.upstream and lineage.upstream:
                stamp = stamp.model_copy(update={"upstream": self.lineage.upstream_snapshots(lineage.upstream)})
            stamp = stamp.model_copy(update={"lineage": stamped_row(lineage)})
        commit = commit_with_retry(
            functools.partial(self.table, name), name, data, stamp, mode=mode,
            overwrite_filter=overwrite_filter, on_files_written=on_files_written,
        )
        if lineage is not None:
            self.lineage.heal(name, window=HEAL_WINDOW)
        return commit

    def staging_uri(self, name: str) -> str:
        """A fresh directory under the table's data location for files an engine writes before
        they are registered (`ParquetFiles`); unregistered leftovers are orphans, never data."""
        return f"{self.table(name).location()}/data/staged-{uuid.uuid4().hex}"

    @functools.cached_property
    def lineage(self) -> LineageStore:
        """The `factory.lineage` table of this lake."""
        return LineageStore(self)


_RECOVERY = ("restore the file from a backup, or run `factory lake recover` to re-register every table of the "
             "warehouse from its newest metadata file (history kept), or move the lake directory aside to start empty")


def sqlite_file(uri: str) -> Path | None:
    """The file of a `sqlite:///path` catalog URI (None for other databases and in-memory sqlite)."""
    if not uri.startswith("sqlite:///") or uri.endswith(":memory:"):
        return None
    return Path(uri.removeprefix("sqlite:///"))


def warehouse_tables(warehouse: str) -> dict[str, Path]:
    """`namespace.table` -> newest metadata file of every table directory in a `file://` warehouse
    (what the catalog should list); {} for object storage, which is not listed here."""
    if not warehouse.startswith("file://"):
        return {}
    root = Path(warehouse.removeprefix("file://"))
    found: dict[str, Path] = {}
    for metadata in root.glob("*/*/metadata/*.metadata.json"):
        name = f"{metadata.parents[2].name}.{metadata.parents[1].name}"
        if name not in found or metadata_age(metadata) > metadata_age(found[name]):
            found[name] = metadata
    return found


def metadata_age(path: Path) -> tuple[int, int]:
    """Sort key of a table's metadata files, newest last: written time, then version number (a
    table dropped and re-created in the same directory starts again at version 0)."""
    head = path.name.split("-", 1)[0]  # 00003-<uuid>.metadata.json
    return path.stat().st_mtime_ns, int(head) if head.isdigit() else -1


def _check_sqlite_file(db: Path, held: dict[str, Path], recovering: bool) -> None:
    """Refuse a catalog file that is not sqlite, or missing/empty beside a warehouse of tables."""
    size = db.stat().st_size if db.exists() else None
    if size:
        with db.open("rb") as f:
            if f.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
                raise LakeError(f"catalog {db} is not a sqlite database ({size} bytes); {_RECOVERY}")
    elif held and not recovering:
        state = "missing" if size is None else "empty (0 bytes)"
        raise LakeError(f"catalog {db} is {state} but its warehouse holds {_listed(held)}: writing now would "
                        f"orphan their history; {_RECOVERY}")


def _listed(held: dict[str, Path]) -> str:
    names = sorted(held)
    return f"{len(names)} tables ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"


KEYS_FIELD = "catalog.s3.access_key_id / catalog.s3.secret_access_key"
UNREACHABLE = re.compile(r"NETWORK_CONNECTION|Could not connect|Connection refused|curlCode: 7")


def object_store_unreachable(error: OSError) -> bool:
    """Whether pyarrow's S3 error says nothing answered (as opposed to a refusal of the keys)."""
    return bool(UNREACHABLE.search(str(error)))


def _open_rest(name: str, props: dict[str, str]) -> Catalog:
    """A REST catalog whose credential and object-store keys were both accepted (module docstring)."""
    uri = props["uri"]
    sigv4 = props.get("rest.sigv4-enabled", "false").lower() == "true"
    try:
        catalog = load_catalog(name, **props)
    except requests.exceptions.ConnectionError:
        raise LakeError(f"catalog.uri: the REST catalog at {uri} does not answer (is it running? "
                        f"`factory deploy check` asks every engine; `make cluster-up` starts the loopback ones)") from None
    except OAuthError as e:
        raise LakeError(f"catalog.credential: the REST catalog at {uri} refused the OAuth2 client "
                        f"credential ({e})") from None
    except (UnauthorizedError, ForbiddenError) as e:
        field = (f"{KEYS_FIELD} (SigV4 signs REST requests with them)" if sigv4
                 else "catalog.token" if "token" in props else "catalog.credential")
        raise LakeError(f"{field}: the REST catalog at {uri} refused the request ({e})") from None
    warehouse = props.get("warehouse", "")
    if warehouse.startswith(("s3://", "s3a://")) and props.get("s3.access-key-id"):
        _check_bucket(props, warehouse)
    return catalog


def _check_bucket(props: dict[str, str], warehouse: str) -> None:
    from pyarrow import fs
    from pyiceberg.io.pyarrow import PyArrowFileIO

    io = PyArrowFileIO(props)
    scheme, bucket, _ = io.parse_location(warehouse)
    endpoint = props.get("s3.endpoint", "AWS")
    try:
        info = io.fs_by_scheme(scheme, bucket).get_file_info(bucket)
    except OSError as e:
        if object_store_unreachable(e):
            raise LakeError(f"catalog.s3.endpoint: the object store at {endpoint} does not answer") from None
        raise LakeError(f"{KEYS_FIELD}: the object store at {endpoint} refused the keys for bucket "
                        f"{bucket} ({str(e).strip()})") from None
    if info.type == fs.FileType.NotFound:
        raise LakeError(f"catalog.warehouse: bucket {bucket} does not exist at {endpoint}")
