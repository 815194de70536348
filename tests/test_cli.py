"""The `factory` command line: sql, lineage, tables, ingest, doctor and experiment register, on a
small lake in tmp_path.

The lake is built once per catalog from a tiny directory source (six files, ingested twice so
the raw table has history), a derived `refined.tiny` snapshot and a tokenizer artifact row, so
lineage has something upstream and downstream. `lake_home` is parametrized: `[sql]`, the
embedded sqlite catalog with a `file://` warehouse (no server), and `[rest]` (marked `rest`), an
Iceberg REST catalog over S3 — a warehouse bucket of the session's SeaweedFS on free loopback
ports, its profile handed to the commands in FACTORY_DEPLOY_JSON. Commands run in-process through
`factory.cli.main([...])` (exit code + captured output; `--home` only, the catalog comes from the
profile) and through the real console script in a subprocess with FACTORY_HOME and the profile
in its environment. The sql, lineage and tables tests run on both catalogs; ingest, doctor and
the pipe tests, which build or need no shared lake, on the embedded one. `doctor` is checked for
structure and fix hints, never for what this machine happens to have installed (bubblewrap may be
missing). ~15 s; the `[rest]` half ~8 s (building the REST lake ~3 s, two console-script runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from factory import cli, doctor
from factory.data.ingest import ingest_source
from factory.data.sources import DirectorySource
from factory.deploy import open_lake, profile_env
from factory.lake import CommitStamp, LineageRecord
from factory.lake.lineage import snapshot_record
from factory.lake.schemas import RAW_DOCUMENTS
from factory.lake.sql import query
from factory.version import canonical_json, code_version, config_hash

FILES = {
    "a.py": "x = 1\n", "b.py": "print('b')\n", "pkg/c.py": "def c():\n    return 3\n",
    "README.md": "# tiny\n", "docs/guide.md": "some words\n", "notes.txt": "plain text\n",
}
TOKENIZER_URI = "file:///artifacts/tokenizer/0123abcd4567ef89.json"


@pytest.fixture(scope="module", params=["sql", pytest.param("rest", marks=pytest.mark.rest)])
def lake_home(request, tmp_path_factory) -> dict:
    """A lake with raw.tiny (two snapshots), refined.tiny read from it, and a tokenizer row, on
    the embedded catalog or on a fresh warehouse bucket of the session's SeaweedFS; `profile` is
    the deploy profile that opens it."""
    from configs.deploy import embedded
    from factory.deploy.seaweed import create_warehouse

    if request.param == "sql":
        profile = embedded()
    else:
        profile = create_warehouse(request.getfixturevalue("rest_profile"), f"cli-{uuid.uuid4().hex[:12]}")
    root = tmp_path_factory.mktemp("source")
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    home = tmp_path_factory.mktemp("home")
    lake = open_lake(profile, home)
    source = DirectorySource(name="tiny", root=str(root), include=["**/*.py", "**/*.md", "**/*.txt"])
    first = ingest_source(lake, source)
    (root / "d.py").write_text("d = 4\n")
    second = ingest_source(lake, source)

    refine = {"op": "dedup"}
    stamp = CommitStamp(asset_key="refined/tiny", config_hash=config_hash(refine),
                        upstream={"raw.tiny": second.snapshot_id})
    commit = lake.commit("refined.tiny", lake.table("raw.tiny").scan().to_arrow(), stamp, schema=RAW_DOCUMENTS)
    refined = snapshot_record(commit, stamp, refine)
    tokenizer = LineageRecord(
        version_id="tokenizer@0123abcd4567ef89", kind="tokenizer", name="tokenizer", uri=TOKENIZER_URI,
        content_hash="0123abcd4567ef89", upstream=[refined.version_id], config_json=canonical_json({"vocab": 512}),
        config_hash=config_hash({"vocab": 512}), asset_key="tokenizer",
    )
    lake.lineage.record(refined)
    lake.lineage.record(tokenizer)
    languages = Counter({"python": 4, "markdown": 2, "text": 1})
    return {"home": str(home), "first": first, "second": second, "refined": refined,
            "tokenizer": tokenizer, "languages": languages, "profile": profile}


@pytest.fixture(autouse=True)
def deploy_env(request, monkeypatch):
    """No profile from the developer's shell; a test on `lake_home` gets that lake's profile in
    FACTORY_DEPLOY_JSON (set after the deletion: this fixture asks for `lake_home` itself)."""
    monkeypatch.delenv("FACTORY_DEPLOY", raising=False)
    monkeypatch.delenv("FACTORY_DEPLOY_JSON", raising=False)
    if "lake_home" in request.fixturenames:
        for name, value in profile_env(request.getfixturevalue("lake_home")["profile"]).items():
            monkeypatch.setenv(name, value)


def run(capsys, home: str, *args: str) -> tuple[int, str, str]:
    code = cli.main(["--home", home, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- sql ------------------------------------------------------------------------------------------
def test_sql_group_by_matches_the_source(lake_home, capsys):
    code, out, _ = run(capsys, lake_home["home"], "sql",
                       "select language, count(*) as n from raw.tiny group by 1 order by 1", "--format", "json")
    assert code == 0
    assert {r["language"]: r["n"] for r in json.loads(out)} == lake_home["languages"]

    code, out, _ = run(capsys, lake_home["home"], "sql", "select source, count(*) from raw.tiny group by 1")
    assert code == 0 and "tiny" in out and "7" in out and "1 row" in out


def test_query_returns_arrow_and_works_without_local_metadata(lake_home, monkeypatch):
    lake = open_lake(lake_home["profile"], lake_home["home"])
    sql = "select count(*) as n, sum(bytes) as b from raw.tiny"
    expected = query(lake, sql)
    assert isinstance(expected, pa.Table)
    assert expected.to_pylist() == [{"n": 7, "b": lake_home["second"].bytes}]
    # The object-storage fallback (pyiceberg scan copied into DuckDB) gives the same answer.
    monkeypatch.setattr("factory.lake.sql.local_metadata_path", lambda location: None)
    assert query(lake, sql).equals(expected)


def test_sql_on_the_lineage_table(lake_home, capsys):
    code, out, _ = run(capsys, lake_home["home"], "sql",
                       "select kind, name from factory.lineage order by created_at", "--format", "csv")
    assert code == 0
    assert out.splitlines() == ["kind,name", "table_snapshot,raw.tiny", "table_snapshot,raw.tiny",
                                "table_snapshot,refined.tiny", "tokenizer,tokenizer"]


def test_sql_unknown_table_names_it(lake_home, capsys):
    code, out, err = run(capsys, lake_home["home"], "sql", "select * from raw.nope")
    assert code == 1 and out == ""
    assert "unknown table raw.nope" in err and "raw.tiny" in err  # and lists what exists


def test_sql_syntax_error_exits_1(lake_home, capsys):
    code, out, err = run(capsys, lake_home["home"], "sql", "selec * frm raw.tiny")
    assert code == 1 and out == ""
    assert "syntax error" in err


# -- lineage --------------------------------------------------------------------------------------
def test_lineage_of_a_table_shows_its_current_snapshot(lake_home, capsys):
    second, first = lake_home["second"], lake_home["first"]
    code, out, _ = run(capsys, lake_home["home"], "lineage", "raw.tiny")
    assert code == 0
    for expected in ("raw/tiny", second.config_hash, code_version(), str(second.snapshot_id),
                     f"raw.tiny@{second.snapshot_id}"):
        assert expected in out
    assert str(first.snapshot_id) in out  # the table's earlier snapshot, in the history
    assert "factory.content-hash" in out and second.fingerprint in out  # Iceberg summary properties
    assert lake_home["refined"].version_id in out and "tokenizer@0123abcd4567ef89" in out  # downstream


def test_lineage_walks_up_from_an_artifact(lake_home, capsys):
    code, out, _ = run(capsys, lake_home["home"], "lineage", TOKENIZER_URI, "--json")
    assert code == 0
    [report] = json.loads(out)
    assert report["version"]["kind"] == "tokenizer" and report["snapshot"] is None
    [refined] = report["upstream"]
    assert refined["version_id"] == lake_home["refined"].version_id
    assert [u["version_id"] for u in refined["upstream"]] == [f"raw.tiny@{lake_home['second'].snapshot_id}"]
    # A content-hash prefix finds the same version.
    code, out, _ = run(capsys, lake_home["home"], "lineage", "0123abcd", "--json")
    assert code == 0 and json.loads(out)[0]["version"]["uri"] == TOKENIZER_URI


def test_lineage_of_an_older_version_id(lake_home, capsys):
    first = lake_home["first"]
    code, out, _ = run(capsys, lake_home["home"], "lineage", f"raw.tiny@{first.snapshot_id}", "--json")
    [report] = json.loads(out)
    assert code == 0 and report["version"]["snapshot_id"] == first.snapshot_id
    assert report["version"]["metadata"]["documents"] == 6 and report["downstream"] == []
    # An overwrite is two Iceberg snapshots (delete, then append); the history shows all three.
    history = [(h["operation"], h["rows"], h["current"]) for h in report["history"]]
    assert history == [("append", 7, True), ("delete", 0, False), ("append", 6, False)]


def test_lineage_of_a_snapshot_without_a_row_uses_its_summary(lake_home, capsys):
    code, out, _ = run(capsys, lake_home["home"], "lineage", "factory.lineage", "--json")
    [report] = json.loads(out)
    assert code == 0 and report["recorded"] is False
    assert report["version"]["asset_key"] == "factory/lineage"


def test_lineage_unknown_ref_names_it(lake_home, capsys):
    code, out, err = run(capsys, lake_home["home"], "lineage", "raw.nope")
    assert code == 1 and out == ""
    assert "raw.nope" in err and "raw.tiny" in err and "refined.tiny" in err
    code, _, err = run(capsys, lake_home["home"], "lineage", "raw.tiny@latest")  # not a snapshot id
    assert code == 1 and "raw.tiny@latest" in err


# -- tables and ingest ----------------------------------------------------------------------------
def test_tables_lists_rows_bytes_and_asset_keys(lake_home, capsys):
    code, out, _ = run(capsys, lake_home["home"], "tables", "--json")
    assert code == 0
    rows = {r["table"]: r for r in json.loads(out)}
    assert set(rows) == {"factory.lineage", "raw.tiny", "refined.tiny"}
    assert rows["raw.tiny"]["rows"] == 7 and rows["raw.tiny"]["snapshots"] == 3
    assert rows["raw.tiny"]["snapshot_id"] == lake_home["second"].snapshot_id
    assert rows["refined.tiny"]["asset_key"] == "refined/tiny" and rows["factory.lineage"]["rows"] == 4
    assert all(r["bytes"] > 0 for r in rows.values())
    code, out, _ = run(capsys, lake_home["home"], "tables")
    assert code == 0 and "raw.tiny" in out and "refined/tiny" in out


def test_ingest_commits_once_then_reports_unchanged(tmp_path, monkeypatch, capsys):
    import configs.sources

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("m = 1\n")
    tiny = lambda full=False: DirectorySource(name="tiny_src", root=str(tmp_path / "src"))  # noqa: E731
    monkeypatch.setitem(configs.sources.EMBEDDED, "tiny_src", tiny)
    home = str(tmp_path / "home")
    code, out, _ = run(capsys, home, "ingest", "tiny_src")
    assert code == 0 and "raw.tiny_src" in out and "new snapshot" in out
    code, out, _ = run(capsys, home, "ingest", "tiny_src")
    assert code == 0 and "unchanged" in out
    code, _, err = run(capsys, home, "ingest", "nope")
    assert code == 1 and "nope" in err and "python_stdlib" in err


# -- doctor ---------------------------------------------------------------------------------------
def test_doctor_reports_every_check_with_fixes_for_failures(tmp_path, capsys):
    checks = doctor.run_checks(tmp_path)
    names = [c.name for c in checks]
    for name in ("FACTORY_HOME", "python", "java (Spark)", "bubblewrap (sandbox)", "free disk", "dagster",
                 "pyiceberg", "pyspark", "torch", "duckdb", "vllm (inference)", "duckdb iceberg extension",
                 "lake catalog"):
        assert name in names
    assert all(c.status in ("ok", "warn", "fail") for c in checks)
    assert all(c.fix for c in checks if c.status == "fail")
    code, out, _ = run(capsys, str(tmp_path), "doctor", "--json")
    report = json.loads(out)
    assert [r["name"] for r in report] == names
    assert code == (1 if any(r["status"] == "fail" for r in report) else 0)


def test_doctor_failures_say_how_to_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no java, no bwrap
    no_bwrap = doctor.check_bwrap()
    assert no_bwrap.status == "fail" and "apt-get install -y bubblewrap" in no_bwrap.fix
    assert doctor.check_java().status == "fail" and "openjdk-17" in doctor.check_java().fix
    monkeypatch.setattr(doctor, "_run", lambda cmd: 'java version "1.8.0_292"\n')
    old = doctor.check_java()
    assert old.status == "fail" and "JDK 8" in old.detail
    monkeypatch.setattr(doctor, "MIN_FREE_GB", 1e9)
    assert doctor.check_disk(tmp_path / "not" / "yet").status == "warn"
    # Warnings do not fail the doctor; a failure does, and the table shows its fix.
    warn = doctor.Check("free disk", "warn", "little", "free space")
    monkeypatch.setattr(doctor, "run_checks", lambda home, config=None, full=False: [warn])
    assert run(capsys, str(tmp_path), "doctor")[0] == 0
    monkeypatch.setattr(doctor, "run_checks", lambda home, config=None, full=False: [warn, no_bwrap])
    code, out, _ = run(capsys, str(tmp_path), "doctor")
    assert code == 1 and "FAIL" in out and "apt-get install -y bubblewrap" in out


# -- the real entry point -------------------------------------------------------------------------
@pytest.mark.slow
def test_console_script_in_a_subprocess(lake_home):
    script = Path(sys.executable).parent / "factory"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "factory.cli"]
    env = {**os.environ, "FACTORY_HOME": lake_home["home"], **profile_env(lake_home["profile"])}
    done = subprocess.run([*command, "sql", "select count(*) as n from raw.tiny", "--format", "csv"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["n", "7"]
    done = subprocess.run([*command, "lineage", "raw.missing"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1 and "raw.missing" in done.stderr


def test_a_reader_that_stops_early_is_not_a_failure(tmp_path):
    """`factory lineage X | head -1` under `set -o pipefail` (as .ci/smoke_graph runs): exit 0, no traceback."""
    script = Path(sys.executable).parent / "factory"
    command = str(script) if script.exists() else f"{sys.executable} -m factory.cli"
    env = {**os.environ, "FACTORY_HOME": str(tmp_path), "COLUMNS": "60"}
    for name in ("FACTORY_DEPLOY", "FACTORY_DEPLOY_JSON"):  # the embedded profile
        env.pop(name, None)
    # Enough output to outlast the pipe buffer, so the write after `head` has gone really fails.
    query = "select * from range(200000)"
    done = subprocess.run(["bash", "-c", f"set -o pipefail; {command} sql '{query}' --format csv | head -1"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["range"]
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


class _ClosedPipe:
    """A stdout whose reader has gone: every write fails the way a closed pipe does."""

    def __init__(self, path: Path):
        self._file = open(path, "w")

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        return self._file.fileno()

    def isatty(self) -> bool:
        return False


def test_rich_output_into_a_closed_pipe_exits_zero(lake_home, tmp_path, monkeypatch):
    """rich's own broken-pipe handler exits 1; the CLI's console stops quietly with 0 instead."""
    monkeypatch.setattr(sys, "stdout", _ClosedPipe(tmp_path / "stdout"))
    assert cli.main(["--home", lake_home["home"], "lineage", "refined.tiny"]) == 0


# -- experiment register ----------------------------------------------------------------------------
@pytest.mark.slow
def test_experiment_register_adds_partitions_to_the_instance_without_the_code_location(tmp_path):
    """`make demo`'s first step: the runs' training_run partitions go straight into the instance in
    DAGSTER_HOME (jobs/queue_runs.py, dagster alone), not through a code server, which loads
    every asset module; a second call adds nothing and prints the same run names."""
    from dagster import DagsterInstance

    from factory.experiments.registry import get_experiment
    from factory.experiments.sweep import run_name

    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("")
    env = {**os.environ, "FACTORY_HOME": str(tmp_path), "DAGSTER_HOME": str(dagster_home)}
    expected = [run_name(get_experiment(n)) for n in ("smoke", "smoke_ddp")]
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "factory.cli", "experiment", "register", "smoke", "smoke_ddp"],
                              capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == expected
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        assert sorted(instance.get_dynamic_partitions("training_runs")) == sorted(expected)
