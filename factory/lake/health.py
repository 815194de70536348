"""Is a table whole? Read what its current snapshot needs, and put a lost catalog back.

`table_damage(lake, name)` loads the table's metadata, reads the current snapshot's manifest list
and checks that every manifest it lists is present with the length the list recorded. The number
of data files the list counts (added + existing, per data manifest) is compared with the snapshot
summary's `total-data-files`, because a manifest list cut at an entry boundary reads without an
error, one manifest short. That is two small reads per table and a stat per manifest, whatever
the table's history: what `factory doctor` does by default.

`full=True` (`factory doctor --full`, and before a forced ingest drops a table) also reads every
manifest and checks each live data file: present, the size its manifest entry recorded, and a
Parquet footer that parses with the recorded row count, the files counted again from the
manifests' entries. Only footers are read, not every page, so it costs one small read per data file
(seconds on a lake with a long history of small commits); a file damaged in the middle with its
size and footer intact is not found (a scan of the table would be).

`Damage.structural` says whether the table's own metadata (metadata file, manifest list, a
manifest) is broken. Then no commit can build on the table — an overwrite must read the manifests
to know what it replaces — and a rebuild drops it from the catalog and creates it again
(`Lake.drop_unreadable`: the snapshot history is lost, the files stay, referenced by nothing).
Missing or corrupt data files alone are replaced by an ordinary overwrite, which drops whole files
by their manifest entries without opening them, and the history is kept.

`recover_catalog(lake)` registers every table of a `file://` warehouse that the catalog does not
list, from its newest metadata file that parses — the way back from a lost or emptied `catalog.db`.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import pyarrow.parquet as pq
from pyiceberg.exceptions import ValidationError
from pyiceberg.io import load_file_io
from pyiceberg.manifest import DataFileContent, ManifestContent
from pyiceberg.serializers import FromInputFile

from factory.lake.catalog import UNREADABLE, Lake, LakeError, TableUnreadable, metadata_age, warehouse_tables

# What reading damaged Avro or Parquet bytes raises (measured by truncating manifest lists and
# manifests at 60 points each: UnicodeDecodeError, EOFError, zlib.error, ValueError; pyarrow's
# ArrowInvalid is a ValueError, a missing file an OSError).
CORRUPT = (*UNREADABLE, EOFError, SystemError, zlib.error, struct.error)
MAX_LISTED = 5


@dataclass(frozen=True)
class Damage:
    """What is wrong with one table (nothing: `ok`)."""

    table: str
    problems: list[str] = field(default_factory=list)
    structural: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        shown = self.problems[:MAX_LISTED]
        more = f"; and {len(self.problems) - MAX_LISTED} more" if len(self.problems) > MAX_LISTED else ""
        return "; ".join(shown) + more


def table_damage(lake: Lake, name: str, *, full: bool = False, table=None) -> Damage:
    """What is unreadable in `name`'s current snapshot: its metadata, manifest list and manifests'
    presence, or with `full` every manifest and data file too (see the module docstring). `table`:
    the loaded table, when the caller has it."""
    if table is None:
        try:
            table = lake.table(name)
        except TableUnreadable as e:
            return Damage(name, [str(e)], structural=True)
    snapshot = table.current_snapshot()
    if snapshot is None:
        return Damage(name)
    try:
        manifests = snapshot.manifests(table.io)
    except CORRUPT as e:
        return Damage(name, [f"manifest list {snapshot.manifest_list} is unreadable ({_short(e)})"], True)
    summary = snapshot.summary.additional_properties if snapshot.summary else {}
    expected = summary.get("total-data-files")
    if not full:
        return _listed_damage(table, name, snapshot, manifests, expected)
    files = []
    for manifest in manifests:
        try:
            entries = manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        except CORRUPT as e:
            return Damage(name, [f"manifest {manifest.manifest_path} is unreadable ({_short(e)})"], True)
        files += [e.data_file for e in entries if e.data_file.content == DataFileContent.DATA]
    if expected is not None and int(expected) != len(files):
        return Damage(name, [f"manifest list {snapshot.manifest_list} lists {len(files)} data files where the "
                             f"snapshot has {expected} (truncated)"], True)
    problems = [p for p in (_data_file_problem(table, f) for f in files) if p]
    return Damage(name, problems)


def _listed_damage(table, name: str, snapshot, manifests, expected) -> Damage:
    """The manifest list's view: each manifest present at its recorded length, the files it counts."""
    for manifest in manifests:
        try:
            source = table.io.new_input(manifest.manifest_path)
            size = len(source) if source.exists() else None
        except CORRUPT as e:
            return Damage(name, [f"manifest {manifest.manifest_path} is unreadable ({_short(e)})"], True)
        if size is None:
            return Damage(name, [f"manifest {manifest.manifest_path} is missing"], True)
        if size != manifest.manifest_length:
            return Damage(name, [f"manifest {manifest.manifest_path} is {size} bytes where the manifest list says "
                                 f"{manifest.manifest_length}"], True)
    data = [m for m in manifests if m.content == ManifestContent.DATA]
    if expected is None or any(m.added_files_count is None or m.existing_files_count is None for m in data):
        return Damage(name)  # nothing to count against (an old writer)
    counted = sum(m.added_files_count + m.existing_files_count for m in data)
    if int(expected) != counted:
        return Damage(name, [f"manifest list {snapshot.manifest_list} counts {counted} data files where the "
                             f"snapshot has {expected} (truncated)"], True)
    return Damage(name)


def _data_file_problem(table, data_file) -> str | None:
    path = data_file.file_path
    try:
        source = table.io.new_input(path)
        if not source.exists():
            return f"data file {path} is missing"
        size = len(source)
        if size != data_file.file_size_in_bytes:
            return f"data file {path} is {size} bytes where its manifest says {data_file.file_size_in_bytes}"
        with source.open() as stream:
            rows = pq.ParquetFile(stream).metadata.num_rows
    except CORRUPT as e:
        return f"data file {path} is unreadable ({_short(e)})"
    if rows != data_file.record_count:
        return f"data file {path} holds {rows} rows where its manifest says {data_file.record_count}"
    return None


def recover_catalog(lake: Lake) -> dict[str, str]:
    """Register each warehouse table the catalog lacks; `name -> metadata file` of those registered."""
    held = warehouse_tables(lake.catalog.properties.get("warehouse", ""))
    listed = set(lake.tables())
    registered = {}
    for name, newest in sorted(held.items()):
        if name in listed:
            continue
        metadata = _newest_readable(lake, newest)
        if metadata is None:
            raise LakeError(f"table {name}: no metadata file under {newest.parent} parses; it cannot be re-registered")
        lake.catalog.create_namespace_if_not_exists(name.rsplit(".", 1)[0])
        lake.catalog.register_table(name, metadata)
        registered[name] = metadata
    return registered


def _newest_readable(lake: Lake, newest) -> str | None:
    """The newest metadata file beside `newest` (itself included) that parses as table metadata."""
    candidates = sorted(newest.parent.glob("*.metadata.json"), key=metadata_age, reverse=True)
    for path in candidates:
        uri = path.as_uri()
        try:
            FromInputFile.table_metadata(load_file_io(lake.catalog.properties, location=uri).new_input(uri))
        except (OSError, ValueError, ValidationError):
            continue
        return uri
    return None


def _short(error: BaseException) -> str:
    text = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {text[:200]}" if text else type(error).__name__
