"""A lake that heals and reports damage (issue 15, "Lake recovery"): a lineage row lost between
the data commit and the lineage commit is written again from the snapshot's stamp; `factory
lineage` shows the snapshot asked for and no other; every commit path stamps its upstream table
snapshots and a content hash; one unreadable table fails alone; `factory ingest --force` rewrites
a damaged raw table; an empty or missing `catalog.db` beside a warehouse of tables is an error
(and `factory lake recover` brings the tables back); `factory doctor` names each damage.

Runs on CPU on the embedded sqlite catalog in `tmp_path` (the damage is done to its local files),
with a real child process SIGKILLed between the two commits (~3 s), the small training lake of
`build_training_lake` for the commit paths (~4 s), and one `spark`-marked test of the refiner's
content hash (a local[2] SparkSession, ~20 s). ~30 s in all.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import textwrap
from pathlib import Path

import pytest

from factory import cli
from factory.data.ingest import ingest_source
from factory.data.sources import DirectorySource
from factory.doctor import run_checks
from factory.lake import Lake, LakeError
from factory.lake.commands import describe
from factory.lake.lineage import LINEAGE_TABLE

FILES = {"a.py": "a = 1\n", "b.py": "b = 2\n", "c.md": "# c\n"}


@pytest.fixture(autouse=True)
def embedded_profile(monkeypatch):
    """These tests damage local files: the embedded catalog, whatever the developer's shell says."""
    monkeypatch.delenv("FACTORY_DEPLOY", raising=False)
    monkeypatch.delenv("FACTORY_DEPLOY_JSON", raising=False)


@pytest.fixture
def source(tmp_path) -> DirectorySource:
    root = tmp_path / "src"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return DirectorySource(name="toy", root=str(root), include=["**/*.py", "**/*.md"])


def run(capsys, home, *args: str) -> tuple[int, str, str]:
    code = cli.main(["--home", str(home), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def lake_checks(home, full: bool = False) -> dict[str, tuple[str, str]]:
    """`factory doctor`'s lake checks (`full`: `--full`): name -> (status, detail)."""
    return {c.name: (c.status, c.detail) for c in run_checks(Path(home), full=full)
            if c.name.startswith(("lake", "table "))}


def lineage_pairs(lake) -> set[tuple[str, int]]:
    return {(r.version_id, r.snapshot_id) for r in lake.lineage.records()}


def full_disk_on_lineage(monkeypatch, times: int = 1) -> list[str]:
    """Make the next `times` commits to factory.lineage fail as a full disk would; returns the log."""
    real, failed = Lake.commit, []

    def commit(self, name, *args, **kwargs):
        if name == LINEAGE_TABLE and len(failed) < times:
            failed.append(name)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(Lake, "commit", commit)
    return failed


# -- a lineage row lost between the two commits ----------------------------------------------------
CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from factory.data.ingest import ingest_source
    from factory.data.sources import DirectorySource
    from factory.lake.catalog import Lake
    from factory.lake.lineage import LINEAGE_TABLE

    home, root, marker = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    real = Lake.commit

    def commit(self, name, *args, **kwargs):
        if name == LINEAGE_TABLE:  # the data commit is done; die before the lineage commit
            marker.write_text("data committed")
            time.sleep(120)
        return real(self, name, *args, **kwargs)

    Lake.commit = commit
    source = DirectorySource(name="toy", root=root, include=["**/*.py", "**/*.md"])
    ingest_source(Lake.open(home=home), source)
    print("lineage written")  # must never happen
    """
)


def test_killed_before_the_lineage_commit_heals_on_the_rerun(tmp_path, source, capsys, kill_at_marker):
    lake = Lake.open(home=tmp_path / "home")
    first = ingest_source(lake, source)
    (Path(source.root) / "d.py").write_text("d = 4\n")  # a change, so the child commits
    marker = tmp_path / "marker"
    out = kill_at_marker(CHILD, str(lake.home), source.root, str(marker), marker=marker)
    assert "lineage written" not in out

    crashed = lake.current_snapshot_id("raw.toy")
    assert crashed != first.snapshot_id  # the data commit landed ...
    assert (f"raw.toy@{crashed}", crashed) not in lineage_pairs(lake)  # ... its lineage row did not
    status, detail = lake_checks(lake.home)["lake lineage"]
    assert status == "fail" and f"raw.toy@{crashed}" in detail and "1 snapshot has no lineage row" in detail

    # `factory lineage` shows the snapshot it was asked for, never the previous one's row
    for ref in ("raw.toy", f"raw.toy@{crashed}"):
        [report] = describe(lake, ref)
        assert report["version"]["snapshot_id"] == crashed and not report["recorded"]

    again = ingest_source(lake, source)  # the re-run: unchanged, and it writes the lost row
    assert not again.committed and again.snapshot_id == crashed
    [row] = [r for r in lake.lineage.records() if r.snapshot_id == crashed]
    assert row.version_id == f"raw.toy@{crashed}" and row.kind == "table_snapshot"
    assert row.content_hash == again.fingerprint and row.metadata["documents"] == 4
    assert row.config["root"] == source.root  # the whole row, config included, from the stamp
    assert len(lake.lineage.records()) == 2  # first + healed: nothing written twice
    code, out, _ = run(capsys, lake.home, "lineage", "raw.toy", "--json")
    assert code == 0 and [r["version"]["snapshot_id"] for r in json.loads(out)] == [crashed]
    assert json.loads(out)[0]["recorded"] is True
    assert lake_checks(lake.home)["lake lineage"][0] == "ok"


def test_a_full_disk_on_the_lineage_commit_is_healed_by_the_next_commit(tmp_path, run_rows, monkeypatch):
    """Any commit path, not only ingest: an eval whose lineage commit hit a full disk gets its row
    when the next eval is written."""
    lake = Lake.open(home=tmp_path / "home")
    failed = full_disk_on_lineage(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        run_rows.evaluate(lake, "r", 4, {"all": 1.5})
    assert failed == [LINEAGE_TABLE] and not lake.lineage.records()
    lost = lake.current_snapshot_id("evals.results")
    [report] = describe(lake, "eval/r@4/heldout")  # shown from the row its snapshot owes
    assert report["source"] == "stamp" and report["version"]["snapshot_id"] == lost
    assert report["version"]["metadata"] == {"bpb/all": 1.5}

    run_rows.evaluate(lake, "r", 8, {"all": 1.2})
    rows = {r.version_id: r.snapshot_id for r in lake.lineage.records()}
    assert rows == {"eval/r@4/heldout": lost, "eval/r@8/heldout": lake.current_snapshot_id("evals.results")}
    assert lake.lineage.heal("evals.results") == []  # nothing left owed


def test_two_healers_write_a_lost_row_once(tmp_path, source, monkeypatch):
    """The heal is a read-check-write commit: a healer that read the lineage table before another
    healer's commit retries on the new state instead of writing the row a second time."""
    from factory.lake.lineage import LineageStore

    lake = Lake.open(home=tmp_path / "home")
    full_disk_on_lineage(monkeypatch)
    with pytest.raises(OSError):
        ingest_source(lake, source)
    lost = lake.current_snapshot_id("raw.toy")
    real, raced = LineageStore._present, []

    def present(lineage, snapshot_ids):
        seen = real(lineage, snapshot_ids)
        if not raced:  # another process heals between this healer's read and its commit
            raced.append([])
            raced[0] = Lake.open(home=lake.home).lineage.heal("raw.toy")
        return seen

    monkeypatch.setattr(LineageStore, "_present", staticmethod(present))
    assert [r.snapshot_id for r in lake.lineage.heal("raw.toy")] == []  # the other one won
    assert [r.snapshot_id for r in raced[0]] == [lost]
    assert [r.snapshot_id for r in lake.lineage.records()] == [lost]


def test_lineage_names_the_snapshot_asked_for_or_says_there_is_none(tmp_path, source, capsys, monkeypatch):
    lake = Lake.open(home=tmp_path / "home")
    first = ingest_source(lake, source)
    (Path(source.root) / "d.py").write_text("d = 4\n")
    full_disk_on_lineage(monkeypatch)
    with pytest.raises(OSError):
        ingest_source(lake, source)
    current = lake.current_snapshot_id("raw.toy")

    code, out, _ = run(capsys, lake.home, "lineage", "raw.toy")
    assert code == 0 and f"raw.toy@{current}" in out and f"raw.toy@{first.snapshot_id} " not in out.split("snapshots")[0]
    assert "no row in factory.lineage" in out and "factory lake heal" in out
    code, _, err = run(capsys, lake.home, "lineage", "raw.toy@12345")
    assert code == 1 and "raw.toy has no snapshot 12345" in err
    code, out, _ = run(capsys, lake.home, "lake", "heal")
    assert code == 0 and f"raw.toy@{current}" in out and "1 lineage row written" in out


# -- every commit stamps its upstream and a content hash --------------------------------------------
SYNTH = '''
def shout(fields):
    return fields["text"][:200].upper()
'''


@pytest.mark.slow
def test_every_commit_stamps_upstream_snapshots_and_a_content_hash(tmp_path, source, build_training_lake,
                                                                    run_rows, monkeypatch):
    from factory.mix import mix_versions
    from factory.synth import PipelineConfig, run_pipeline
    from factory.train.checkpoint import CheckpointRef, record_checkpoint
    from factory.train.incidents import record_incident
    from factory.train.trackers import IcebergMetrics

    lake = build_training_lake(tmp_path / "home")  # refined.* (the roots), tokenizer, mix default v1
    ingest_source(lake, source)
    mix = mix_versions(lake, "default")[-1]
    for step in (4, 8):
        ref = CheckpointRef(run="r", step=step, path=tmp_path / f"step-{step}.pt", sha256=f"{step:064d}", bytes=1,
                            tokens=step * 4096, loss=2.0, created_at=dt.datetime.now(dt.timezone.utc))
        record_checkpoint(lake, ref, experiment="r", mix_version=mix.version_id, config_hash="c", eval_every=4,
                          upstream=[mix.version_id, mix.tokenizer_version] + ([] if step == 4 else ["ckpt/r@4"]))
    metrics = IcebergMetrics(lake, "r")
    metrics.start("r", params={"mix_version": mix.version_id, "tokenizer": mix.tokenizer_version}, tags={"mix": mix.version_id})
    metrics.log_metrics(1, {"loss": 2.5})
    metrics.flush()
    record_incident(lake, "r", 5, "spike", {"loss": 9.0})
    run_rows.evaluate(lake, "r", 8, {"all": 1.2})
    (tmp_path / "synth_shout.py").write_text(SYNTH)
    monkeypatch.syspath_prepend(str(tmp_path))
    run_pipeline(lake, PipelineConfig(
        name="shout", seeds={"table": "refined.package_docs", "id_field": "doc_id", "limit": 4}, text="{loud}",
        stages=[{"name": "shout", "output": "loud", "generator": {"kind": "function", "function": "synth_shout:shout"}}],
    ), log=lambda m: None)

    checked, missing_hash, missing_upstream = 0, [], []
    for name in lake.tables():
        table = lake.table(name)
        for snapshot in table.metadata.snapshots:
            stamp = {k.removeprefix("factory."): v for k, v in snapshot.summary.additional_properties.items()}
            checked += 1
            if not stamp.get("content-hash"):
                missing_hash.append(f"{name}@{snapshot.snapshot_id}")
            roots = name.startswith(("raw.", "refined.")) or name == LINEAGE_TABLE  # read from outside the lake
            if not roots and json.loads(stamp.get("upstream-snapshots", "{}")) == {}:
                missing_upstream.append(f"{name}@{snapshot.snapshot_id}")
    assert checked >= 15 and missing_hash == [] and missing_upstream == []

    tables = {"evals.results", "evals.samples", "train.checkpoints", "train.metrics", "train.incidents",
              "synthetic.shout", "mixes.versions"}
    assert tables <= set(lake.tables())
    checkpoints = lake.table("train.checkpoints")
    first_ckpt = checkpoints.metadata.snapshots[0].snapshot_id
    upstream = json.loads(checkpoints.current_snapshot().summary.additional_properties["factory.upstream-snapshots"])
    mix_snapshot = lake.current_snapshot_id("mixes.versions")
    # the mix version's table, the tokenizer's training tables, the previous checkpoint's snapshot
    assert upstream == {"mixes.versions": mix_snapshot, "train.checkpoints": first_ckpt,
                        **{t: lake.current_snapshot_id(t) for t in mix.pins}}
    results = json.loads(lake.table("evals.results").current_snapshot().summary.additional_properties[
        "factory.upstream-snapshots"])
    assert results == {"train.checkpoints": checkpoints.current_snapshot().snapshot_id}
    synthetic = json.loads(lake.table("synthetic.shout").current_snapshot().summary.additional_properties[
        "factory.upstream-snapshots"])
    assert synthetic == {"refined.package_docs": lake.current_snapshot_id("refined.package_docs")}


@pytest.mark.spark
def test_the_spark_refiner_stamps_an_order_free_content_hash(tmp_path, source):
    """The refiner's Parquet files are written by executors and never read by the driver: its
    content hash is computed in Spark, and a rerun over the same input stamps the same one."""
    from configs.refine import default_pipeline
    from factory.data.refine.pipeline import EXCLUSIONS_TABLE, run_step
    from factory.data.spark import spark_session

    (Path(source.root) / "empty.py").write_text("")  # normalize drops it: one exclusion row
    lake = Lake.open(home=tmp_path / "home")
    raw = ingest_source(lake, source)
    spark = spark_session("local[2]")
    first = run_step(spark, lake, default_pipeline("toy"), 0)
    second = run_step(spark, lake, default_pipeline("toy"), 0)
    stamps = [{k.removeprefix("factory."): v for k, v in lake.table(t).snapshot_by_id(s).summary.additional_properties.items()}
              for t, s in ((first.table, first.snapshot_id), (first.table, second.snapshot_id),
                           (EXCLUSIONS_TABLE, first.exclusions_snapshot_id))]
    assert stamps[0]["content-hash"] == stamps[1]["content-hash"] != stamps[2]["content-hash"]
    assert all(len(s["content-hash"]) == 24 for s in stamps)
    assert {json.loads(s["upstream-snapshots"])["raw.toy"] for s in stamps} == {raw.snapshot_id}
    [row] = [r for r in lake.lineage.records() if r.snapshot_id == first.snapshot_id]
    assert row.content_hash == stamps[0]["content-hash"] and row.metadata["rows_out"] == 3


# -- one broken table fails alone -------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_table_with_broken_metadata_fails_alone(tmp_path, source, capsys, damage):
    lake = Lake.open(home=tmp_path / "home")
    ingest_source(lake, source)
    ingest_source(lake, source.model_copy(update={"name": "other"}))
    metadata = Path(lake.table("raw.toy").metadata_location.removeprefix("file://"))
    if damage == "corrupt":
        metadata.write_text('{"format-version": 2, "table-uuid": ')
    else:
        metadata.unlink()

    code, out, err = run(capsys, lake.home, "tables", "--json")
    rows = {r["table"]: r for r in json.loads(out)}
    assert code == 1 and rows["raw.other"]["rows"] == 3 and rows["raw.other"]["error"] is None
    assert "raw.toy is unreadable" in rows["raw.toy"]["error"] and "raw.toy is unreadable" in err
    code, out, _ = run(capsys, lake.home, "tables")
    assert "UNREADABLE" in out and "1 unreadable" in " ".join(out.split())  # the caption wraps at the table's width

    code, out, _ = run(capsys, lake.home, "sql", "select count(*) as n from raw.other", "--format", "json")
    assert code == 0 and json.loads(out) == [{"n": 3}]
    code, _, err = run(capsys, lake.home, "sql", "select * from raw.toy")
    assert code == 1 and "table raw.toy is unreadable" in err and "Traceback" not in err
    code, _, err = run(capsys, lake.home, "lineage", "raw.toy")
    assert code == 1 and "table raw.toy is unreadable" in err
    code, out, _ = run(capsys, lake.home, "lineage", "raw.other", "--json")
    assert code == 0 and json.loads(out)[0]["recorded"]

    checks = lake_checks(lake.home)
    assert checks["table raw.toy"][0] == "fail" and "raw.toy is unreadable" in checks["table raw.toy"][1]
    assert checks["lake tables"] == ("fail", "2 of 3 tables readable (metadata, manifest lists; --full reads every "
                                             "data file)")


# -- a damaged raw table is rewritten from its source -----------------------------------------------
def _damage(lake, how: str) -> str:
    table = lake.table("raw.toy")
    snapshot = table.current_snapshot()
    [data_file] = [t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()]
    if how == "data file deleted":
        os.unlink(data_file)
        return "is missing"
    if how == "data file corrupt":
        size = os.path.getsize(data_file)
        Path(data_file).write_bytes(b"\0" * size)  # same size: only the footer check finds it
        return "is unreadable"
    manifest_list = Path(snapshot.manifest_list.removeprefix("file://"))
    manifest_list.write_bytes(manifest_list.read_bytes()[:200])
    return "manifest list"


@pytest.mark.parametrize("how", ["data file deleted", "data file corrupt", "manifest list truncated"])
@pytest.mark.slow
def test_force_ingest_rewrites_a_damaged_table_from_its_source(tmp_path, source, capsys, how):
    lake = Lake.open(home=tmp_path / "home")
    ingest_source(lake, source)
    (Path(source.root) / "d.py").write_text("d = 4\n")
    ingest_source(lake, source)  # two snapshots: history to keep (or, for broken metadata, to lose)
    sources = tmp_path / "sources.yaml"
    sources.write_text(f"toy:\n  kind: directory\n  root: {source.root}\n  include: ['**/*.py', '**/*.md']\n")
    expected = sorted([*FILES, "d.py"])

    symptom = _damage(lake, how)
    status, detail = lake_checks(lake.home, full=True)["table raw.toy"]
    assert status == "fail" and symptom in detail
    # the default reads no data file: it finds a broken manifest list, and leaves data files to --full
    default = lake_checks(lake.home)
    if how.startswith("data file"):
        assert "table raw.toy" not in default and "--full" in default["lake tables"][1]
    else:
        assert default["table raw.toy"][0] == "fail" and symptom in default["table raw.toy"][1]
    with pytest.raises((OSError, ValueError)):  # the damage is real: the table cannot be read
        lake.table("raw.toy").scan().to_arrow()
    assert not ingest_source(lake, source).committed  # re-ingesting alone says "unchanged"

    code, out, err = run(capsys, lake.home, "ingest", "--sources", str(sources), "--force", "toy")
    assert code == 0, err
    assert "rewritten" in out
    table = Lake.open(home=lake.home).table("raw.toy")
    assert sorted(table.scan().to_arrow()["path"].to_pylist()) == expected  # every row reads back
    # damaged data files: a new overwrite (delete + append) on top of the history (append, delete +
    # append); broken metadata: the table was dropped and re-created, its history lost
    assert len(table.metadata.snapshots) == (5 if how.startswith("data file") else 1)
    checks = lake_checks(lake.home, full=True)
    assert "table raw.toy" not in checks and checks["lake tables"][0] == "ok"
    assert checks["lake lineage"][0] == "ok"


# -- a lost catalog is an error, not an empty lake --------------------------------------------------
@pytest.mark.parametrize("damage", ["emptied", "deleted", "garbage"])
def test_a_lost_catalog_beside_a_warehouse_of_tables_is_an_error(tmp_path, source, capsys, damage):
    home = tmp_path / "home"
    lake = Lake.open(home=home)
    first = ingest_source(lake, source)
    db = home / "lake" / "catalog.db"
    lake.catalog.engine.dispose()
    if damage == "emptied":
        db.write_bytes(b"")
    elif damage == "deleted":
        db.unlink()
    else:
        db.write_bytes(b"not a database at all" * 100)

    with pytest.raises(LakeError) as error:
        Lake.open(home=home)
    assert str(db) in str(error.value) and "factory lake recover" in str(error.value)
    code, _, err = run(capsys, home, "ingest", "--sources", str(_sources_file(tmp_path, source)), "toy")
    assert code == 1 and str(db) in err  # the next ingest refuses instead of orphaning the history
    assert lake_checks(home)["lake catalog"][0] == "fail"
    if damage == "garbage":
        return  # recovery starts from a catalog file sqlite can open: restore it, or move it aside
    code, out, err = run(capsys, home, "lake", "recover")
    assert code == 0, err
    assert "2 tables re-registered" in out  # raw.toy and factory.lineage
    recovered = Lake.open(home=home)
    assert recovered.current_snapshot_id("raw.toy") == first.snapshot_id  # history kept
    assert sorted(recovered.table("raw.toy").scan().to_arrow()["path"].to_pylist()) == sorted(FILES)
    assert not ingest_source(recovered, source).committed


def _sources_file(tmp_path, source) -> Path:
    path = tmp_path / "sources.yaml"
    path.write_text(f"toy:\n  kind: directory\n  root: {source.root}\n  include: ['**/*.py', '**/*.md']\n")
    return path


def test_doctor_passes_a_whole_lake(tmp_path, source):
    lake = Lake.open(home=tmp_path / "home")
    ingest_source(lake, source)
    for full, read in ((False, "metadata, manifest lists; --full reads every data file"),
                       (True, "metadata, manifests, data files")):
        checks = lake_checks(lake.home, full=full)
        assert checks == {"lake catalog": ("ok", checks["lake catalog"][1]),
                          "lake tables": ("ok", f"2 of 2 tables readable ({read})"),
                          "lake lineage": ("ok", "every stamped snapshot has its lineage row")}
        assert "2 tables" in checks["lake catalog"][1]


def test_the_default_doctor_reads_manifest_lists_and_full_reads_every_file(tmp_path, source):
    """The default (`factory doctor`) reads metadata and manifest lists: a damaged data file of
    factory.lineage shows as an unreadable lineage check (no traceback), which `--full` names; a
    deleted manifest is found from the list alone."""
    lake = Lake.open(home=tmp_path / "home")
    ingest_source(lake, source)
    lineage = lake.table(LINEAGE_TABLE)
    [data_file] = [t.file.file_path.removeprefix("file://") for t in lineage.scan().plan_files()]
    os.unlink(data_file)
    default = lake_checks(lake.home)
    assert default["lake tables"][0] == "ok" and default["lake lineage"][0] == "fail"
    assert f"{LINEAGE_TABLE} cannot be read" in default["lake lineage"][1]
    status, detail = lake_checks(lake.home, full=True)[f"table {LINEAGE_TABLE}"]
    assert status == "fail" and f"data file file://{data_file} is missing" in detail

    toy = lake.table("raw.toy")
    manifest = toy.current_snapshot().manifests(toy.io)[0].manifest_path
    os.unlink(manifest.removeprefix("file://"))
    status, detail = lake_checks(lake.home)["table raw.toy"]
    assert status == "fail" and detail == f"manifest {manifest} is missing"
