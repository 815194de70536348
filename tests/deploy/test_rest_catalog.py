"""The lake on an Iceberg REST catalog over S3 (SeaweedFS `weed mini`): what only that setup has.

Covers: the server binds nothing but 127.0.0.1 and runs with telemetry off; wrong credentials —
the REST catalog's OAuth2 credential, or the S3 keys SigV4 and the data files use — fail when the
lake is opened, naming the profile field, before anything is written; a commit that loses a race
to another connection is retried on fresh metadata; snapshot summaries carry the stamp through the
REST server to an independent reader; a table's data files really are objects in the warehouse
bucket (listed with pyarrow's S3 file system, nothing under FACTORY_HOME); `factory sql` scans
the S3 tables through DuckDB's httpfs (no pyarrow copy); a second SeaweedFS on other ports runs
beside the session's and stops by PID.

Runs on CPU against the session's SeaweedFS (`rest_profile` in tests/conftest.py, free loopback
ports, one fresh S3 Tables bucket per test); marked `rest`. ~15 s, ~6 s of it the second server;
the end-to-end train → export → eval test is also `slow` (~90 s under load).
"""

from __future__ import annotations

import json
import uuid

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs as pafs
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from factory import cli
from factory.deploy import open_lake, profile_env
from factory.deploy.config import Secret
from factory.deploy.seaweed import create_warehouse, rest_profile as profile_on, s3_filesystem, start_seaweedfs
from factory.deploy.servers import free_port, port_open
from factory.lake import CommitStamp, LakeError
from factory.lake.commit import stamp_of

pytestmark = pytest.mark.rest

SCHEMA = Schema(NestedField(1, "v", LongType(), required=False), NestedField(2, "tag", StringType(), required=False))


def rows(*values: int, tag: str = "t") -> pa.Table:
    return pa.table({"v": pa.array(values, pa.int64()), "tag": [tag] * len(values)})


@pytest.fixture
def profile(rest_profile, monkeypatch):
    """A profile on a fresh, empty warehouse bucket of the session's SeaweedFS, handed down."""
    fresh = create_warehouse(rest_profile, f"rc-{uuid.uuid4().hex[:12]}")
    for name, value in profile_env(fresh).items():
        monkeypatch.setenv(name, value)
    return fresh


def with_catalog(profile, **changes):
    return profile.derive(catalog=profile.catalog.model_copy(update=changes))


def with_s3_secret(profile, secret: Secret):
    return with_catalog(profile, s3=profile.catalog.s3.model_copy(update={"secret_access_key": secret}))


def namespaces(profile) -> list:
    return open_lake(profile).catalog.list_namespaces()


def test_seaweedfs_listens_only_on_loopback_with_telemetry_off(seaweedfs):
    process = psutil.Process(seaweedfs.server.pid)
    listening = {c.laddr for c in process.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    assert len(listening) >= 10  # master, volume, filer, S3, REST, admin: HTTP + gRPC each
    assert {addr.ip for addr in listening} == {"127.0.0.1"}
    ports = {addr.port for addr in listening}
    s3_port = int(seaweedfs.profile.catalog.s3.endpoint.rsplit(":", 1)[1])
    rest_port = int(seaweedfs.profile.catalog.uri.rsplit(":", 1)[1])
    assert {s3_port, rest_port} <= ports
    assert "-master.telemetry=false" in process.cmdline()


def test_wrong_oauth_credential_names_the_field_before_any_write(profile, monkeypatch, tmp_path):
    monkeypatch.setenv("FACTORY_TEST_CREDENTIAL", "factory:not-the-secret")
    wrong = with_catalog(profile, sigv4=False, credential=Secret(env="FACTORY_TEST_CREDENTIAL"))
    with pytest.raises(LakeError, match=r"^catalog\.credential: the REST catalog at http://127\.0\.0\.1:\d+ refused"):
        open_lake(wrong, tmp_path)
    monkeypatch.setenv("FACTORY_TEST_CREDENTIAL", "factory:factory-loopback-secret")
    assert open_lake(with_catalog(profile, sigv4=False, credential=Secret(env="FACTORY_TEST_CREDENTIAL")),
                     tmp_path).tables() == []  # the same key with its real secret opens it


def test_wrong_s3_secret_names_the_field_before_any_write(profile, monkeypatch, tmp_path):
    monkeypatch.setenv("FACTORY_TEST_S3_SECRET", "not-the-secret")
    wrong = with_s3_secret(profile, Secret(env="FACTORY_TEST_S3_SECRET"))
    with pytest.raises(LakeError, match=r"^catalog\.s3\.access_key_id / catalog\.s3\.secret_access_key: the object "
                                        r"store at http://127\.0\.0\.1:\d+ refused the keys for bucket rc-"):
        open_lake(wrong, tmp_path)
    # with an OAuth2 credential the catalog itself would let it in: the S3 check still refuses
    oauth = with_catalog(wrong, sigv4=False, credential=Secret(env="X", default="factory:factory-loopback-secret"))
    with pytest.raises(LakeError, match=r"catalog\.s3\.access_key_id"):
        open_lake(oauth, tmp_path)
    assert namespaces(profile) == []  # nothing was created on the way


def test_a_secret_that_is_not_set_names_its_variable(profile, tmp_path):
    unset = with_s3_secret(profile, Secret(env="FACTORY_TEST_UNSET_SECRET"))
    with pytest.raises(ValueError, match=r"catalog\.s3\.secret_access_key: environment variable "
                                         r"FACTORY_TEST_UNSET_SECRET is not set"):
        open_lake(unset, tmp_path)


def test_a_commit_that_loses_a_race_is_retried_on_fresh_metadata(profile, tmp_path):
    lake = open_lake(profile, tmp_path)
    lake.commit("t.race", rows(0), CommitStamp(asset_key="a", config_hash="h"), schema=SCHEMA)
    other = open_lake(profile, tmp_path)  # another connection, as another process would hold
    won = []

    def interloper():
        if not won:
            won.append(other.commit("t.race", rows(99, tag="other"), CommitStamp(asset_key="b", config_hash="h")))

    commit = lake.commit("t.race", rows(1), CommitStamp(asset_key="a", config_hash="h", run_id="mine"),
                         on_files_written=interloper)
    assert commit.attempts == 2 and commit.previous_snapshot_id == won[0].snapshot_id
    table = open_lake(profile, tmp_path).table("t.race")
    assert sorted(table.scan().to_arrow()["v"].to_pylist()) == [0, 1, 99]
    assert len(table.snapshots()) == 3


def test_snapshot_summary_is_stamped_through_the_server(profile, tmp_path):
    stamp = CommitStamp(asset_key="raw/toy", config_hash="c0ffee", run_id="run-7", content_hash="abc",
                        upstream={"raw.src": 42})
    commit = open_lake(profile, tmp_path).commit("raw.toy", rows(1, 2, 3), stamp, schema=SCHEMA)
    reader = open_lake(profile, tmp_path / "elsewhere")  # a fresh client: the summary came from the server
    summary = stamp_of(reader.table("raw.toy"))
    assert summary["asset-key"] == "raw/toy" and summary["config-hash"] == "c0ffee"
    assert summary["run-id"] == "run-7" and summary["content-hash"] == "abc"
    assert json.loads(summary["upstream-snapshots"]) == {"raw.src": 42}
    assert reader.current_snapshot_id("raw.toy") == commit.snapshot_id and commit.rows == 3


def test_data_files_are_objects_in_the_warehouse_bucket(profile, tmp_path):
    lake = open_lake(profile, tmp_path)
    for part in range(3):
        lake.commit("raw.toy", rows(part, part + 10), CommitStamp(asset_key="a", config_hash="h"), schema=SCHEMA)
    table = lake.table("raw.toy")
    bucket = profile.catalog.warehouse.removeprefix("s3://")
    assert table.location() == f"s3://{bucket}/raw/toy"
    planned = {task.file.file_path for task in table.scan().plan_files()}
    s3 = s3_filesystem(profile)
    objects = s3.get_file_info(pafs.FileSelector(f"{bucket}/raw/toy/data", recursive=True))
    stored = {f"s3://{o.path}": o.size for o in objects if o.type == pafs.FileType.File}
    assert set(stored) == planned and len(planned) == 3
    assert all(stored[path] == task.file.file_size_in_bytes for task in table.scan().plan_files()
               for path in [task.file.file_path])
    with s3.open_input_file(next(iter(planned)).removeprefix("s3://")) as f:  # real Parquet, readable by anyone
        assert pq.ParquetFile(f).metadata.num_rows == 2
    assert not list(tmp_path.rglob("*.parquet"))  # nothing of the table under FACTORY_HOME


def test_factory_sql_scans_s3_tables_through_duckdb_httpfs(profile, tmp_path, monkeypatch, capsys):
    import pyiceberg.table

    lake = open_lake(profile, tmp_path)
    lake.commit("raw.toy", rows(1, 2, 3, tag="a"), CommitStamp(asset_key="a", config_hash="h"), schema=SCHEMA)
    lake.commit("raw.toy", rows(4, tag="b"), CommitStamp(asset_key="a", config_hash="h"))

    def no_copy(*args, **kwargs):
        raise AssertionError("factory sql fell back to copying the table through pyarrow")

    monkeypatch.setattr(pyiceberg.table.DataScan, "to_arrow", no_copy)
    code = cli.main(["--home", str(tmp_path), "sql", "select tag, count(*) as n, sum(v)::bigint as s from raw.toy "
                     "group by tag order by tag", "--format", "json"])
    out = capsys.readouterr().out
    assert code == 0
    assert json.loads(out) == [{"tag": "a", "n": 3, "s": 6}, {"tag": "b", "n": 1, "s": 4}]


def test_a_second_seaweedfs_on_other_ports_runs_beside_and_stops_by_pid(seaweedfs, tmp_path):
    other = profile_on(free_port(), free_port())
    server = start_seaweedfs(tmp_path / "data", other, tmp_path / "weed.log")
    try:
        lake = open_lake(other, tmp_path / "home")
        lake.commit("second_server.toy", rows(5), CommitStamp(asset_key="a", config_hash="h"), schema=SCHEMA)
        assert open_lake(other, tmp_path / "home").tables() == ["second_server.toy"]
        assert ("second_server",) not in namespaces(seaweedfs.profile)  # separate servers, separate data
    finally:
        server.stop()
    assert not server.alive()
    for url in (other.catalog.uri, other.catalog.s3.endpoint):
        assert not port_open("127.0.0.1", int(url.rsplit(":", 1)[1]))


def test_train_export_and_eval_on_the_rest_lake(profile, tmp_path, build_training_lake):
    """The smoke chain with every table on S3: refined tables, tokenizer and mix, 8 training steps
    (checkpoint rows), an export found through lineage, and held-out bpb scores (~90 s under load)."""
    import torch

    from configs.evals import suite
    from configs.experiments import smoke
    from factory.evals.suite import evaluate_checkpoint
    from factory.experiments import plan_experiment
    from factory.infer import EngineConfig, find_export
    from factory.infer.export import find_checkpoint
    from factory.train.config import CheckpointConfig
    from factory.train.trainer import train

    run, steps = "restsmoke", 8
    experiment = smoke().derive(name=run, steps=steps, eval_every=4, eval_suite="quick",
                                checkpoint=CheckpointConfig(every=4, keep_last=5), tracker={"backends": ["iceberg"]})
    lake = build_training_lake(tmp_path / "home", heldout_fraction=0.25, profile=profile)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(plan_experiment(lake, experiment), lake, run=run)
    finally:
        torch.set_num_threads(threads)
    lake = open_lake(profile, tmp_path / "home")  # a fresh client reads what the trainer committed
    assert lake.table("train.checkpoints").scan().to_arrow().num_rows == 2
    checkpoint = find_checkpoint(lake, f"ckpt/{run}@{steps}")
    evaluate_checkpoint(lake, checkpoint, suite("heldout"), EngineConfig(kind="transformers"), log=lambda _: None)
    assert find_export(lake, f"ckpt/{run}@{steps}").export_id == f"export/{run}@{steps}"
    results = lake.table("evals.results").scan().to_arrow().to_pylist()
    assert {r["checkpoint_id"] for r in results} == {f"ckpt/{run}@{steps}"} and results
    assert all(r["value"] > 0 for r in results if r["metric"] == "all")
    for name in ("train.checkpoints", "evals.results", "factory.lineage", "mixes.versions"):
        assert lake.table(name).location().startswith(profile.catalog.warehouse + "/")
