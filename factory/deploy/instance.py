"""The Dagster instance of a profile: `$DAGSTER_HOME/dagster.yaml`, and whether its storage answers.

One base file, `configs/dagster.yaml`, holds what every deployment shares (the run queue and its
concurrency limits, telemetry off). The profile adds only where the instance keeps its runs,
event logs and schedules: nothing for `dagster.storage == "sqlite"` (Dagster's default is sqlite
under `$DAGSTER_HOME`), or dagster-postgres's `storage: postgres: postgres_db:` section for
`"postgres"`. The password is never written into the file: it appears as Dagster's
`{env: NAME}` form with the variable the profile's `Secret` names, so the YAML can be committed,
copied into an image or printed, and every Dagster process (webserver, daemon, run workers)
reads the value from its own environment. `instance_env` gives the environment a process the
factory starts needs for that (the throwaway loopback default when the variable is unset).

`check_postgres` asks the server the profile names whether it answers and accepts the
credentials, so `factory deploy check` fails with the field to fix (`dagster.postgres.port`,
`dagster.postgres.password`, ...) before Dagster fails with a stack trace.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from factory.deploy.config import DeployConfig, DeployError, PostgresConfig
from factory.home import CHECKOUT

BASE = CHECKOUT / "configs" / "dagster.yaml"
SCHEME = "postgresql+psycopg2"


def base_config(path: Path = BASE) -> dict:
    """The shared instance settings (configs/dagster.yaml)."""
    return yaml.safe_load(path.read_text()) or {}


def instance_config(profile: DeployConfig, base: dict) -> dict:
    """`base` with the storage `profile` chooses (the profile owns the `storage` key)."""
    config = copy.deepcopy(base)
    config.pop("storage", None)
    if profile.dagster.storage == "postgres":
        pg = profile.dagster.postgres
        # The driver is named: SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3, which is not
        # installed; dagster-postgres brings psycopg2.
        db = {"hostname": pg.host, "port": pg.port, "username": pg.user, "db_name": pg.db, "scheme": SCHEME}
        if pg.password is not None:
            db["password"] = {"env": pg.password.env}
        config["storage"] = {"postgres": {"postgres_db": db}}
    return config


def write_instance_yaml(profile: DeployConfig, dagster_home: Path | str, base: dict | None = None) -> Path:
    """Write `<dagster_home>/dagster.yaml` for `profile` (base: configs/dagster.yaml); its path."""
    home = Path(dagster_home)
    home.mkdir(parents=True, exist_ok=True)
    config = instance_config(profile, base_config() if base is None else base)
    header = f"# Dagster instance for deploy profile {profile.name!r}, written by factory.deploy.instance from " \
             f"configs/dagster.yaml.\n"
    if profile.dagster.storage == "postgres" and profile.dagster.postgres.password is not None:
        header += f"# The Postgres password is read from ${profile.dagster.postgres.password.env} by every process.\n"
    path = home / "dagster.yaml"
    path.write_text(header + yaml.safe_dump(config, sort_keys=False))
    return path


def instance_env(profile: DeployConfig) -> dict[str, str]:
    """Variables a Dagster process needs for `profile`'s instance: the Postgres password's, resolved
    (from the environment, else the Secret's loopback default). Empty for sqlite."""
    pg = profile.dagster.postgres
    if profile.dagster.storage != "postgres" or pg.password is None:
        return {}
    return {pg.password.env: pg.password.resolve("dagster.postgres.password")}


def check_postgres(config: PostgresConfig, timeout: float = 5.0) -> None:
    """Connect as the profile's role; DeployError naming the `dagster.postgres.*` field to fix."""
    try:
        import psycopg2  # brought by dagster-postgres
    except ImportError:
        raise DeployError("dagster.storage: 'postgres' needs dagster-postgres (and its psycopg2) installed") from None

    password = config.password.resolve("dagster.postgres.password") if config.password else None
    where = f"{config.user}@{config.host}:{config.port}/{config.db}"
    try:
        psycopg2.connect(host=config.host, port=config.port, user=config.user, password=password,
                         dbname=config.db, connect_timeout=max(1, int(timeout))).close()
    except psycopg2.OperationalError as e:
        message = " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or repr(e)
        if "password authentication failed" in message or "no password supplied" in message:
            field = "dagster.postgres.password"  # also an unknown role: the server does not say which
            problem = "rejected the credentials"
        elif "database" in message and "does not exist" in message:
            field, problem = "dagster.postgres.db", "has no such database"
        elif "role" in message and "does not exist" in message:
            field, problem = "dagster.postgres.user", "has no such role"
        else:
            field, problem = "dagster.postgres.host/port", "does not answer"
        raise DeployError(f"{field}: PostgreSQL at {where} {problem} ({message})") from None
