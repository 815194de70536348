"""Ingestion (`factory.data.ingest`): a source lands in `raw.<name>` with the declared schema, a
stamped snapshot and a lineage row; doc ids are stable; an unchanged source commits nothing; a
changed one commits a new snapshot with its own lineage row. Ends with the real embedded
`python_stdlib` source, capped at 50 files.

Every test runs on both catalogs (`catalog`): real files and a real pyiceberg `SqlCatalog` on
sqlite in `tmp_path`, or an Iceberg REST catalog over S3 on the session's SeaweedFS.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from configs.sources import python_stdlib
from factory.data.ingest import fingerprint, ingest_source, raw_table
from factory.data.readers import read_source
from factory.data.sources import DirectorySource
from factory.lake import Lake
from factory.lake.commit import stamp_of
from factory.lake.schemas import RAW_DOCUMENTS
from factory.version import config_hash

pytestmark = pytest.mark.usefixtures("catalog")


@pytest.fixture
def source(tmp_path) -> DirectorySource:
    root = tmp_path / "src"
    (root / "pkg").mkdir(parents=True)
    (root / "a.py").write_text("def a():\n    return 1\n")
    (root / "pkg" / "b.py").write_text("B = 'b'\n")
    (root / "notes.md").write_text("# notes\n")
    return DirectorySource(name="toy", root=str(root), include=["**/*.py", "*.md"], license="MIT")


def table_rows(lake: Lake, name: str) -> dict[str, dict]:
    return {r["path"]: r for r in lake.table(name).scan().to_arrow().to_pylist()}


def schema_fields(schema) -> list[tuple]:
    return [(f.field_id, f.name, str(f.field_type), f.required) for f in schema.fields]


def test_first_ingest_commits_table_snapshot_and_lineage(lake, source):
    result = ingest_source(lake, source, run_id="run-1")

    assert result.table == raw_table("toy") == "raw.toy"
    assert result.committed and result.previous_snapshot_id is None
    assert (result.documents, result.candidates, result.skipped) == (3, 3, {})
    assert result.languages == {"python": 2, "markdown": 1}
    assert result.bytes == sum(len(Path(source.root, p).read_bytes()) for p in ["a.py", "pkg/b.py", "notes.md"])
    assert result.config_hash == config_hash(source)
    assert [s["path"] for s in result.sample] == ["a.py", "notes.md", "pkg/b.py"]

    table = lake.table("raw.toy")
    assert schema_fields(table.schema()) == schema_fields(RAW_DOCUMENTS)
    assert result.snapshot_id == lake.current_snapshot_id("raw.toy")
    rows = table_rows(lake, "raw.toy")
    assert sorted(rows) == ["a.py", "notes.md", "pkg/b.py"]
    assert rows["pkg/b.py"]["text"] == "B = 'b'\n" and rows["pkg/b.py"]["license"] == "MIT"
    assert rows["a.py"]["ingested_at"].tzinfo is not None

    stamp = stamp_of(table)
    assert stamp["asset-key"] == "raw/toy" and stamp["run-id"] == "run-1"
    assert stamp["config-hash"] == result.config_hash and stamp["content-hash"] == result.fingerprint
    docs, _ = read_source(source)
    assert result.fingerprint == fingerprint(docs)

    [row] = lake.lineage.records()
    assert row.version_id == f"raw.toy@{result.snapshot_id}" and row.kind == "table_snapshot"
    assert row.config_hash == result.config_hash and row.config == source.model_dump(mode="json")
    assert row.code_version == stamp["code-version"] != ""
    assert row.content_hash == result.fingerprint and row.uri == table.location()
    assert row.metadata == {
        "documents": 3, "bytes": result.bytes, "skipped": {}, "read_from": [source.root]
    }


def test_doc_ids_are_stable_across_ingests_and_lakes(tmp_path, source, catalog):
    first = catalog.lake(tmp_path / "lake-one")
    second = catalog.other().lake(tmp_path / "lake-two")
    ingest_source(first, source)
    ingest_source(second, source)
    ids_one = {p: r["doc_id"] for p, r in table_rows(first, "raw.toy").items()}
    ids_two = {p: r["doc_id"] for p, r in table_rows(second, "raw.toy").items()}
    assert ids_one == ids_two and len(set(ids_one.values())) == 3


def test_unchanged_source_commits_nothing(lake, source):
    first = ingest_source(lake, source)
    again = ingest_source(lake, source)

    assert not again.committed
    assert again.snapshot_id == again.previous_snapshot_id == first.snapshot_id
    assert again.fingerprint == first.fingerprint and again.documents == 3
    assert len(lake.table("raw.toy").snapshots()) == 1
    assert len(lake.lineage.records()) == 1


def test_changed_file_commits_new_snapshot_and_lineage_row(lake, source, monkeypatch):
    first = ingest_source(lake, source)
    ids_before = {p: r["doc_id"] for p, r in table_rows(lake, "raw.toy").items()}
    Path(source.root, "pkg", "b.py").write_text("B = 'changed'\n")
    monkeypatch.setenv("FACTORY_CODE_VERSION", "feedface")

    second = ingest_source(lake, source, run_id="run-2")

    assert second.committed and second.snapshot_id != first.snapshot_id
    assert second.previous_snapshot_id == first.snapshot_id
    assert second.fingerprint != first.fingerprint
    rows = table_rows(lake, "raw.toy")
    assert len(rows) == 3 and rows["pkg/b.py"]["text"] == "B = 'changed'\n"  # overwrite, not append
    ids_after = {p: r["doc_id"] for p, r in rows.items()}
    assert ids_after["a.py"] == ids_before["a.py"] and ids_after["notes.md"] == ids_before["notes.md"]
    assert ids_after["pkg/b.py"] != ids_before["pkg/b.py"]

    old, new = lake.lineage.records()
    assert old.snapshot_id == first.snapshot_id
    assert new.version_id == f"raw.toy@{second.snapshot_id}" and new.run_id == "run-2"
    assert new.config_hash == config_hash(source) and new.code_version == "feedface"
    assert stamp_of(lake.table("raw.toy"))["code-version"] == "feedface"
    # history stays in Iceberg: the first snapshot still reads the old text
    old_rows = lake.table("raw.toy").scan(snapshot_id=first.snapshot_id).to_arrow().to_pylist()
    assert {r["path"]: r["text"] for r in old_rows}["pkg/b.py"] == "B = 'b'\n"


def test_removed_file_is_a_change(lake, source):
    first = ingest_source(lake, source)
    Path(source.root, "notes.md").unlink()
    second = ingest_source(lake, source)
    assert second.committed and second.previous_snapshot_id == first.snapshot_id
    assert sorted(table_rows(lake, "raw.toy")) == ["a.py", "pkg/b.py"]


def test_python_stdlib_sample_ingests_real_files(lake):
    source = python_stdlib().model_copy(update={"max_documents": 50})
    result = ingest_source(lake, source)

    assert result.committed and result.candidates > 500  # the whole stdlib was listed, 50 were read
    assert result.documents + result.skipped.get("invalid_utf8", 0) == 50
    assert result.documents >= 45 and result.languages == {"python": result.documents}
    rows = lake.table("raw.python_stdlib").scan().to_arrow()
    assert rows.num_rows == result.documents
    assert set(rows["license"].to_pylist()) == {"PSF-2.0"}
    excluded = [p for p in rows["path"].to_pylist() if p.startswith(("site-packages/", "dist-packages/"))
                or "__pycache__" in p]
    assert excluded == []
    assert all(b <= 1_000_000 for b in rows["bytes"].to_pylist())
    assert ingest_source(lake, source).committed is False  # the same sample again: nothing new
