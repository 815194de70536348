"""A materialization killed between writing its data files and committing the metadata leaves the
table at its previous snapshot: same snapshot id, same rows, no lineage row — and the next
ingest commits normally on top of it.

Runs on both catalogs (`catalog`: a real pyiceberg `SqlCatalog` on sqlite in `tmp_path`, and an
Iceberg REST catalog over S3 on the session's SeaweedFS), with a real child process that opens
the same lake (the profile in FACTORY_DEPLOY_JSON) and is SIGKILLed mid-commit (~3 s).
"""

from __future__ import annotations

import textwrap

import pytest

from factory.data.ingest import ingest_source
from factory.data.sources import DirectorySource

CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from factory.data.ingest import ingest_source
    from factory.data.sources import DirectorySource
    from factory.deploy import open_lake

    home, root, marker = sys.argv[1], sys.argv[2], Path(sys.argv[3])

    def hang_after_files_written():
        marker.write_text("files written")
        time.sleep(120)  # the parent kills us here, before the metadata commit

    source = DirectorySource(name="toy", root=root)
    ingest_source(open_lake(None, home), source, on_files_written=hang_after_files_written)
    print("committed")  # must never happen
    """
)


pytestmark = pytest.mark.usefixtures("catalog")


def test_killed_ingest_leaves_previous_snapshot(lake, tmp_path, list_stored_files, kill_at_marker):
    root = tmp_path / "src"
    root.mkdir()
    (root / "a.py").write_text("a = 1\n")
    (root / "b.py").write_text("b = 2\n")
    source = DirectorySource(name="toy", root=str(root))
    first = ingest_source(lake, source)
    assert first.committed and first.documents == 2
    files_before = list_stored_files(lake.table("raw.toy"), "data")

    (root / "c.py").write_text("c = 3\n")  # a change, so the child really commits
    marker = tmp_path / "marker"
    out = kill_at_marker(CHILD, str(lake.home), str(root), str(marker), marker=marker)
    assert "committed" not in out

    table = lake.table("raw.toy")
    assert lake.current_snapshot_id("raw.toy") == first.snapshot_id
    assert len(table.snapshots()) == 1
    assert sorted(table.scan().to_arrow()["path"].to_pylist()) == ["a.py", "b.py"]
    assert [r.snapshot_id for r in lake.lineage.records()] == [first.snapshot_id]
    orphans = list_stored_files(lake.table("raw.toy"), "data") - files_before
    assert len(orphans) == 1  # the child did write its data file: it is an orphan, never data

    # the lake is not wedged: the next ingest commits on top of the previous snapshot
    again = ingest_source(lake, source)
    assert again.committed and again.previous_snapshot_id == first.snapshot_id
    assert sorted(lake.table("raw.toy").scan().to_arrow()["path"].to_pylist()) == ["a.py", "b.py", "c.py"]
    assert [r.snapshot_id for r in lake.lineage.records()] == [first.snapshot_id, again.snapshot_id]
