"""The lakehouse: Iceberg tables in a catalog, one stamped commit path, and the lineage table.

`Lake` is the one entry point (open it from a `CatalogConfig`); `commit` is the one way data gets
into a table; `LineageStore` reads and writes `factory.lineage`.
"""

from factory.lake.catalog import CatalogConfig, HomeMoved, Lake, LakeError, TableUnreadable
from factory.lake.commit import CommitStamp, ParquetFiles, TableCommit
from factory.lake.lineage import LineageRecord, LineageStore

__all__ = [
    "CatalogConfig",
    "CommitStamp",
    "HomeMoved",
    "Lake",
    "LakeError",
    "LineageRecord",
    "LineageStore",
    "ParquetFiles",
    "TableCommit",
    "TableUnreadable",
]
