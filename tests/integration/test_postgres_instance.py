"""The Dagster instance on PostgreSQL, end to end: Debian's server started on loopback in a data
directory of its own (`factory.deploy.postgres`), a `$DAGSTER_HOME/dagster.yaml` rendered from the
`loopback_postgres` profile (`factory.deploy.instance`, password by variable name), `dagster dev`
on it; one raw asset materialized over GraphQL, then one checkpoint row that makes the daemon's
`checkpoint_eval_sensor` fire once. The run, its materialization, the sensor's run request and its
tick are read back from Postgres's own tables, and nothing was written to sqlite.

Marked `slow` (~1-2 min: dagster dev, one ingest run). The eval run the sensor requests waits in
the queue (an `eval` concurrency limit of 0 in this instance): this test is about where Dagster
keeps its state, not about evaluating. Postgres and dagster dev are stopped by PID.
"""

import json
from contextlib import closing
import shutil
import tempfile
import time
from pathlib import Path

import psycopg2
import pytest
from dagster import AssetKey, DagsterRunStatus
from dagster._core.scheduler.instigation import TickData
from dagster._serdes import deserialize_value

from configs.deploy import loopback_postgres
from factory.deploy import profile_env
from factory.deploy.instance import base_config, check_postgres, instance_env, write_instance_yaml
from factory.deploy.postgres import start_postgres
from factory.deploy.servers import free_port
from factory.lake import Lake

pytestmark = pytest.mark.slow
FINISHED = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)


@pytest.fixture
def postgres_profile(tmp_path):
    """`loopback_postgres` on a free port, its server running; stopped by PID at teardown."""
    root = Path(tempfile.mkdtemp(prefix="factory-pg-"))  # pytest's tmp_path is 0700: postgres could not enter it
    root.chmod(0o711)
    base = loopback_postgres()
    profile = base.derive(dagster={"storage": "postgres",
                                   "postgres": {**base.dagster.postgres.model_dump(), "port": free_port()}})
    pg = profile.dagster.postgres
    server = start_postgres(root / "data", port=pg.port, user=pg.user, db=pg.db,
                            password=pg.password.resolve("dagster.postgres.password"), log_path=tmp_path / "postgres.log")
    try:
        yield profile
    finally:
        server.stop()
        assert not server.alive()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def factory_env(factory_env, postgres_profile):
    """The suite's environment with the profile's instance YAML and the password's variable."""
    base = base_config()
    base["run_coordinator"]["config"]["tag_concurrency_limits"].append(
        {"key": "factory/kind", "value": "eval", "limit": 0})  # eval runs stay queued (module docstring)
    write_instance_yaml(postgres_profile, factory_env["DAGSTER_HOME"], base)
    factory_env.update(instance_env(postgres_profile) | profile_env(postgres_profile))
    return factory_env


def query(profile, sql: str, *args) -> list[tuple]:
    pg = profile.dagster.postgres
    with closing(psycopg2.connect(host=pg.host, port=pg.port, user=pg.user, dbname=pg.db,
                                  password=pg.password.resolve("dagster.postgres.password"))) as conn, \
            conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall()


def test_dagster_dev_keeps_runs_and_sensor_ticks_in_postgres(postgres_profile, factory_env, dagster_dev, run_rows):
    check_postgres(postgres_profile.dagster.postgres)
    run_id = dagster_dev.submit_job_execution("ingest_job", asset_selection=[AssetKey(["raw", "python_stdlib"])],
                                              run_config={"ops": {"raw__python_stdlib": {"config": {"max_documents": 5}}}})
    deadline = time.monotonic() + 240
    while (status := dagster_dev.get_run_status(run_id)) not in FINISHED:
        assert time.monotonic() < deadline, f"run {run_id} still {status}"
        time.sleep(2)
    assert status == DagsterRunStatus.SUCCESS
    lake = Lake.open(home=factory_env["FACTORY_HOME"])
    assert lake.table("raw.python_stdlib").scan().to_arrow().num_rows == 5

    checkpoint = run_rows.checkpoint(lake, "pgsmoke", 4, loss=2.0)  # eval_every=4: due
    deadline = time.monotonic() + 180
    # the sensor's tick creates the run (NOT_STARTED), then submits it to the queue (QUEUED, held there)
    while True:
        evals = query(postgres_profile, "SELECT run_id, status FROM runs WHERE pipeline_name = 'eval_job'")
        if [status for _, status in evals] == ["QUEUED"]:
            break
        assert time.monotonic() < deadline, f"checkpoint_eval_sensor queued no eval run (runs: {evals})"
        time.sleep(2)

    runs = dict(query(postgres_profile, "SELECT pipeline_name, status FROM runs"))
    assert runs == {"ingest_job": "SUCCESS", "eval_job": "QUEUED"}
    [(eval_run, _)] = evals
    tags = dict(query(postgres_profile, "SELECT key, value FROM run_tags WHERE run_id = %s", eval_run))
    assert tags["dagster/run_key"] == checkpoint and tags["dagster/sensor_name"] == "checkpoint_eval_sensor"
    materialized = query(postgres_profile, "SELECT asset_key FROM event_logs WHERE run_id = %s AND "
                                           "dagster_event_type = 'ASSET_MATERIALIZATION'", run_id)
    assert [json.loads(k) for (k,) in materialized] == [["raw", "python_stdlib"]]

    # the daemon submits the run before it writes the tick's final (SUCCESS) state: wait for that write
    deadline = time.monotonic() + 60
    while True:
        ticks = [deserialize_value(body, TickData) for (body,) in query(postgres_profile, "SELECT tick_body FROM job_ticks "
                                                                                          "WHERE status = 'SUCCESS'")]
        fired = [t for t in ticks if t.instigator_name == "checkpoint_eval_sensor"]
        if fired or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert [(list(t.run_ids), list(t.run_keys)) for t in fired] == [([eval_run], [checkpoint])]
    assert not list(Path(factory_env["DAGSTER_HOME"]).rglob("*.db"))  # no sqlite storage beside Postgres
