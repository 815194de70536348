"""Is this home where its catalog was written? A moved or copied FACTORY_HOME, said plainly.

Iceberg stores absolute paths: the sqlite catalog's `metadata_location` of every table, and inside
the metadata the table's `location`, its manifest lists, manifests and data files; lineage rows and
`train.checkpoints` hold `file://` URIs of artifacts too. So a home cannot be moved or copied as a
directory. Moved, its tables are not found; copied, the copy's catalog still points into the
original, so reading the copy reads the original and writing it would change the original's tables.

Relocating in place would mean rewriting every metadata file, manifest list and manifest (Avro) of
every table and every stored URI; instead the embedded lake refuses to open a home whose catalog
points outside it, and `factory doctor` reports it, both with the exact command that fixes it: move
it back, or put a symlink at the old path (the stored paths then resolve to the new place, which is
why a path counts as inside the home when it *resolves* there).

Read with the standard library's sqlite3, read-only, so the check costs one query and writes nothing.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from factory.home import lake_dir, uri_to_path

_WAREHOUSE = "/lake/warehouse/"  # where a home keeps its tables (factory.home.lake_dir / warehouse)


@dataclass(frozen=True)
class Moved:
    """A home whose catalog was written elsewhere: `written_at` is that other home."""

    home: Path
    written_at: Path
    table: str
    location: str

    @property
    def copied(self) -> bool:
        """The original is still there: this is a copy (moved homes leave nothing behind)."""
        return self.written_at.exists()

    def detail(self) -> str:
        seen = f"table {self.table} is at {self.location}"
        if self.copied:
            return (f"FACTORY_HOME {self.home} is a copy of {self.written_at}: its catalog's tables still point into "
                    f"the original ({seen}), so reading here reads the original and writing here would change it; "
                    f"Iceberg stores absolute paths, so a home cannot be copied")
        return (f"FACTORY_HOME {self.home} was moved from {self.written_at}: its catalog's tables point there ({seen}); "
                f"Iceberg stores absolute paths, so a home cannot be moved as a directory")

    def fix(self) -> str:
        if self.copied:
            return (f"use the original (--home {self.written_at}, or export FACTORY_HOME={self.written_at}); for a "
                    f"second home start an empty one and rebuild it (FACTORY_HOME=<new dir> make demo)")
        return f"move it back: mv {self.home} {self.written_at}; or keep it here: ln -s {self.home} {self.written_at}"

    def __str__(self) -> str:
        return f"{self.detail()}. Fix: {self.fix()}"


def recorded_locations(db: Path) -> list[tuple[str, str]]:
    """(table, metadata_location) of every table a sqlite catalog file lists, read only; [] when
    the file is missing, empty or not a catalog yet (opening the lake reports those itself)."""
    if not db.is_file() or db.stat().st_size == 0:
        return []
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = con.execute("select table_namespace, table_name, metadata_location from iceberg_tables").fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return []
    return [(f"{namespace}.{name}", location) for namespace, name, location in rows if location]


def moved_home(home: Path) -> Moved | None:
    """Where the embedded catalog of `home` was written, when that is not `home` (None: it is here,
    or the catalog lists no table). Only for the embedded layout: catalog.db beside its warehouse."""
    warehouse = (lake_dir(home) / "warehouse").resolve()
    for table, location in recorded_locations(lake_dir(home) / "catalog.db"):
        path = uri_to_path(location)
        if not location.startswith("file://") or path.resolve().is_relative_to(warehouse):
            continue
        before, found, _ = str(path).partition(_WAREHOUSE)
        return Moved(home=home, written_at=Path(before) if found else path.parent, table=table, location=location)
    return None
