"""The Dagster instance YAML a profile renders (`factory.deploy.instance`): embedded keeps Dagster's
sqlite default, Postgres gets dagster-postgres's section with the password as `{env: NAME}`, both
read back through Dagster's own instance schema; `check_postgres` naming the field when no
server answers; `start_postgres` refusing, before it runs anything, a data directory the postgres
user could not enter. Unit tier, CPU, no servers (the Postgres end to end is
tests/integration/test_postgres_instance.py)."""

import os

import pytest
import sqlalchemy
import yaml
from dagster._config import process_config
from dagster._core.instance.config import dagster_instance_config
from dagster._core.instance.ref import InstanceRef
from dagster_postgres import DagsterPostgresStorage
from dagster_postgres.utils import pg_url_from_config

from configs.deploy import embedded, loopback_postgres
from configs.deploy.loopback import POSTGRES_PASSWORD
from factory.deploy import DeployError
from factory.deploy.config import PostgresConfig, Secret
from factory.deploy.instance import base_config, check_postgres, instance_config, instance_env, write_instance_yaml
from factory.deploy.postgres import start_postgres
from factory.deploy.servers import ServerError, free_port


def test_embedded_instance_is_the_base_file_on_sqlite(tmp_path):
    base = base_config()
    assert instance_config(embedded(), base) == base and "storage" not in base
    path = write_instance_yaml(embedded(), tmp_path)
    assert yaml.safe_load(path.read_text()) == base
    assert instance_env(embedded()) == {}
    ref = InstanceRef.from_dir(str(tmp_path))
    assert (ref.storage_data.class_name, ref.run_storage_data.class_name) == ("DagsterSqliteStorage", "SqliteRunStorage")


def test_postgres_instance_reads_its_password_from_the_environment(tmp_path, monkeypatch):
    profile = loopback_postgres()
    monkeypatch.setenv(POSTGRES_PASSWORD.env, "s3cret-from-env")
    path = write_instance_yaml(profile, tmp_path)
    text = path.read_text()
    assert "s3cret-from-env" not in text and POSTGRES_PASSWORD.default not in text

    written = yaml.safe_load(text)
    base = base_config()
    assert {k: v for k, v in written.items() if k != "storage"} == base  # the run queue and telemetry, unchanged
    assert written["storage"] == {"postgres": {"postgres_db": {
        "hostname": "127.0.0.1", "port": 5433, "username": "dagster", "db_name": "dagster",
        "scheme": "postgresql+psycopg2", "password": {"env": "FACTORY_DAGSTER_PG_PASSWORD"}}}}

    # Dagster's own schema accepts the file; dagster-postgres resolves the password from the variable
    config, _ = dagster_instance_config(str(tmp_path))
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    ref = InstanceRef.from_dir(str(tmp_path))
    assert (ref.storage_data.module_name, ref.storage_data.class_name) == ("dagster_postgres", "DagsterPostgresStorage")
    resolved = process_config(DagsterPostgresStorage.config_type(), yaml.safe_load(ref.storage_data.config_yaml))
    url = pg_url_from_config(resolved.value)
    assert url == "postgresql+psycopg2://dagster:s3cret-from-env@127.0.0.1:5433/dagster"
    # SQLAlchemy 2.1 takes a bare postgresql:// for psycopg 3, which is not installed: the driver must load
    assert sqlalchemy.create_engine(url).dialect.driver == "psycopg2"
    assert instance_env(profile) == {"FACTORY_DAGSTER_PG_PASSWORD": "s3cret-from-env"}


def test_postgres_profile_without_a_password_writes_none_and_base_storage_is_replaced():
    profile = embedded().derive(dagster={"storage": "postgres", "postgres": {"host": "db.internal", "port": 6543}})
    config = instance_config(profile, {**base_config(), "storage": {"sqlite": {"base_dir": "/elsewhere"}}})
    assert config["storage"] == {"postgres": {"postgres_db": {"hostname": "db.internal", "port": 6543,
                                                              "username": "dagster", "db_name": "dagster",
                                                              "scheme": "postgresql+psycopg2"}}}
    assert instance_env(profile) == {}


@pytest.mark.loopback
def test_check_postgres_names_the_field_when_nothing_answers(monkeypatch):
    port = free_port()  # nobody listens there
    with pytest.raises(DeployError, match=rf"dagster\.postgres\.host/port: PostgreSQL at dagster@127\.0\.0\.1:{port}"
                                          r"/dagster does not answer \(.*refused"):
        check_postgres(PostgresConfig(port=port, password=POSTGRES_PASSWORD))
    monkeypatch.delenv("FACTORY_TEST_UNSET_PG", raising=False)
    with pytest.raises(DeployError, match="dagster.postgres.password: environment variable FACTORY_TEST_UNSET_PG"):
        check_postgres(PostgresConfig(port=port, password=Secret(env="FACTORY_TEST_UNSET_PG")))


@pytest.mark.skipif(os.geteuid() != 0, reason="as root PostgreSQL runs as the postgres user; otherwise as this one")
@pytest.mark.loopback
def test_start_postgres_refuses_a_data_dir_the_postgres_user_cannot_enter(tmp_path):
    # pytest makes /tmp/pytest-of-<user> (and the rest of tmp_path's ancestors it owns) mode 0700
    with pytest.raises(ServerError, match=rf"data directory {tmp_path}/pg: the postgres user PostgreSQL runs as cannot "
                                          r"enter /tmp/pytest-of-root \(mode 0700, owner uid 0\); put the data"):
        start_postgres(tmp_path / "pg", port=free_port(), password="x", log_path=tmp_path / "pg.log")
    assert not (tmp_path / "pg").exists()


def test_every_profile_runs_one_training_and_one_eval_at_a_time(tmp_path):
    """The run queue's limits come from configs/dagster.yaml whatever the profile's storage: evals
    (each a vLLM engine) one at a time, as training is (issue 16: two evals side by side)."""
    from factory.deploy.profiles import load_profile, profile_names

    assert {"embedded", "loopback", "loopback_postgres"} <= set(profile_names())
    for name in profile_names():
        path = write_instance_yaml(load_profile(name), tmp_path / name)
        config, _ = dagster_instance_config(str(path.parent))  # Dagster's own schema reads it
        limits = config["run_coordinator"]["config"]["tag_concurrency_limits"]
        assert {(x["key"], x["value"], x["limit"]) for x in limits} >= {("factory/kind", "training", 1),
                                                                        ("factory/kind", "eval", 1)}, name
