"""The one commit path (`factory.lake.commit`): stamped summaries, schema conformance, overwrite,
and concurrent writers that must not lose a row.

Every test runs on both catalogs (`catalog`: a real pyiceberg `SqlCatalog` on sqlite in
`tmp_path`, and `[rest]` an Iceberg REST catalog over S3 on the session's SeaweedFS). The
concurrency test starts 4 real Python processes (~10–20 s on 2 cores), which open the same lake
from the profile handed down in FACTORY_DEPLOY_JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from factory.lake import CommitStamp
from factory.lake.commit import stamp_of

pytestmark = pytest.mark.usefixtures("catalog")
from factory.version import env_lock_hash

SCHEMA = Schema(
    NestedField(1, "v", LongType(), required=True),
    NestedField(2, "tag", StringType(), required=False),
)


def rows(*values: int, tag: str = "x") -> pa.Table:
    return pa.table({"v": list(values), "tag": [tag] * len(values)})


def test_commit_stamps_snapshot_summary(lake, monkeypatch):
    monkeypatch.setenv("FACTORY_CODE_VERSION", "abc123-dirty")
    stamp = CommitStamp(
        asset_key="refined/python_stdlib",
        partition="2026-01-01",
        run_id="run-42",
        config_hash="cfg0123456789abc",
        upstream={"raw.python_stdlib": 111, "raw.package_docs": 222},
        content_hash="deadbeefcafe",
    )
    commit = lake.commit("refined.python_stdlib", rows(1, 2, 3), stamp, schema=SCHEMA)

    assert commit.table == "refined.python_stdlib"
    assert commit.rows == 3 and commit.attempts == 1 and commit.committed
    assert commit.previous_snapshot_id is None
    assert commit.snapshot_id == lake.current_snapshot_id("refined.python_stdlib")
    assert stamp_of(lake.table("refined.python_stdlib")) == {
        "asset-key": "refined/python_stdlib",
        "partition": "2026-01-01",
        "run-id": "run-42",
        "code-version": "abc123-dirty",
        "env-lock": env_lock_hash(),
        "config-hash": "cfg0123456789abc",
        "upstream-snapshots": '{"raw.package_docs": 222, "raw.python_stdlib": 111}',
        "content-hash": "deadbeefcafe",
    }
    assert json.loads(stamp_of(lake.table("refined.python_stdlib"))["upstream-snapshots"]) == stamp.upstream


def test_each_snapshot_keeps_its_own_stamp(lake):
    first = lake.commit("t.events", rows(1), CommitStamp(asset_key="a", config_hash="h1", run_id="r1"), schema=SCHEMA)
    second = lake.commit("t.events", rows(2), CommitStamp(asset_key="a", config_hash="h2", run_id="r2"))

    assert second.previous_snapshot_id == first.snapshot_id != second.snapshot_id
    table = lake.table("t.events")
    assert stamp_of(table, first.snapshot_id)["run-id"] == "r1"
    assert stamp_of(table, second.snapshot_id)["run-id"] == "r2"
    assert stamp_of(table)["config-hash"] == "h2"  # current snapshot by default
    assert sorted(table.scan().to_arrow()["v"].to_pylist()) == [1, 2]


def test_overwrite_replaces_rows_in_one_snapshot(lake):
    stamp = CommitStamp(asset_key="a", config_hash="h")
    first = lake.commit("t.state", rows(1, 2, 3), stamp, mode="overwrite", schema=SCHEMA)
    second = lake.commit("t.state", rows(7, 8), stamp, mode="overwrite")

    table = lake.table("t.state")
    assert sorted(table.scan().to_arrow()["v"].to_pylist()) == [7, 8]
    assert second.previous_snapshot_id == first.snapshot_id
    # time travel still sees the first version
    assert sorted(table.scan(snapshot_id=first.snapshot_id).to_arrow()["v"].to_pylist()) == [1, 2, 3]


def test_data_that_does_not_fit_the_schema_fails_naming_table_and_columns(lake):
    stamp = CommitStamp(asset_key="a", config_hash="h")
    good = lake.commit("t.strict", rows(1), stamp, schema=SCHEMA)

    with pytest.raises(ValueError, match=r"t\.strict: .*missing \['tag'\], unexpected \['extra'\]"):
        lake.commit("t.strict", pa.table({"v": [2], "extra": ["?"]}), stamp)
    with pytest.raises(ValueError, match=r"t\.strict: data does not match the table schema"):
        lake.commit("t.strict", pa.table({"v": ["not a number"], "tag": ["x"]}), stamp)

    assert lake.current_snapshot_id("t.strict") == good.snapshot_id
    assert lake.table("t.strict").scan().to_arrow()["v"].to_pylist() == [1]


def test_missing_table_is_named(lake):
    from factory.lake import LakeError

    with pytest.raises(LakeError, match=r"table raw\.nope does not exist"):
        lake.commit("raw.nope", rows(1), CommitStamp(asset_key="a", config_hash="h"))


def test_conflicting_commit_is_retried_on_fresh_metadata(lake, lake_at):
    """A second writer commits while the first sits between data files and metadata commit: the
    first loses that round (`CommitFailedException` inside), reloads, and lands on top of it."""
    lake.commit("t.race", rows(0), CommitStamp(asset_key="a", config_hash="h"), schema=SCHEMA)
    other = lake_at(lake.home)  # an independent catalog connection, like another process
    interloper = []

    def commit_in_between():
        if not interloper:
            stamp = CommitStamp(asset_key="b", config_hash="h")
            interloper.append(other.commit("t.race", rows(99, tag="other"), stamp))

    mine = CommitStamp(asset_key="a", config_hash="h", run_id="mine")
    commit = lake.commit("t.race", rows(1), mine, on_files_written=commit_in_between)

    assert commit.attempts == 2
    assert commit.previous_snapshot_id == interloper[0].snapshot_id  # built on the winner's commit
    table = lake.table("t.race")
    assert sorted(table.scan().to_arrow()["v"].to_pylist()) == [0, 1, 99]
    assert len(table.snapshots()) == 3
    assert stamp_of(table)["run-id"] == "mine"


def test_commit_gives_up_when_conflicts_outlast_the_retry_budget(lake, lake_at, monkeypatch):
    from pyiceberg.exceptions import CommitFailedException

    import factory.lake.commit as commit_module

    first = lake.commit("t.race", rows(0), CommitStamp(asset_key="a", config_hash="h"), schema=SCHEMA)
    other = lake_at(lake.home)
    monkeypatch.setattr(commit_module, "RETRY_FOR_S", 0.0)

    def always_lose():
        other.commit("t.race", rows(99), CommitStamp(asset_key="b", config_hash="h"))

    with pytest.raises(CommitFailedException, match=r"t\.race: gave up after 1 concurrent-commit conflicts"):
        lake.commit("t.race", rows(1), CommitStamp(asset_key="a", config_hash="h"), on_files_written=always_lose)
    values = sorted(lake.table("t.race").scan().to_arrow()["v"].to_pylist())
    assert values == [0, 99] and lake.current_snapshot_id("t.race") != first.snapshot_id


# -- concurrency ---------------------------------------------------------------------------------

WRITERS, APPENDS = 4, 25

WRITER = textwrap.dedent(
    """
    import json, os, sys, time
    import pyarrow as pa
    from factory.deploy import open_lake
    from factory.lake import CommitStamp

    home, table, writer, appends, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    lake = open_lake(None, home)  # the profile in FACTORY_DEPLOY_JSON
    while not os.path.exists(go):  # start together, so the writers really contend
        time.sleep(0.01)
    attempts = []
    for i in range(appends):
        value = writer * 1000 + i
        stamp = CommitStamp(asset_key="test/concurrent", config_hash="h", run_id=f"w{writer}", content_hash=str(value))
        commit = lake.commit(table, pa.table({"v": [value], "tag": [f"w{writer}"]}), stamp)
        attempts.append(commit.attempts)
    print(json.dumps({"writer": writer, "attempts": attempts}))
    """
)


@pytest.mark.slow
def test_concurrent_appends_from_processes_lose_nothing(lake, tmp_path):
    name = "t.concurrent"
    lake.ensure_table(name, SCHEMA)
    go = tmp_path / "go"
    env = {**os.environ, "FACTORY_CODE_VERSION": "test"}  # skip git in every child
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(lake.home), name, str(w), str(APPENDS), str(go)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for w in range(WRITERS)
    ]
    try:
        time.sleep(0.5)
        go.touch()
        outputs = [p.communicate(timeout=150) for p in procs]  # > RETRY_FOR_S: a starved writer gives up first
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    attempts = [a for out, _ in outputs for a in json.loads(out)["attempts"]]

    table = lake.table(name)
    values = sorted(table.scan().to_arrow()["v"].to_pylist())
    expected = sorted(w * 1000 + i for w in range(WRITERS) for i in range(APPENDS))
    assert values == expected  # all 100 rows, each exactly once
    snapshots = table.snapshots()
    assert len(snapshots) == WRITERS * APPENDS  # one snapshot per append, none lost or doubled
    # every snapshot carries its own writer's stamp, and each value was committed exactly once
    stamped = sorted(int(stamp_of(table, s.snapshot_id)["content-hash"]) for s in snapshots)
    assert stamped == expected
    assert len(attempts) == WRITERS * APPENDS and all(a >= 1 for a in attempts)
