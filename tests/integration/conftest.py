"""Fixtures for the end-to-end tier: an isolated FACTORY_HOME with its own Dagster instance."""

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def factory_env(tmp_path):
    """Environment for subprocesses: FACTORY_HOME and DAGSTER_HOME under tmp_path, loopback Spark."""
    home = tmp_path / "factory"
    dagster_home = home / "dagster"
    dagster_home.mkdir(parents=True)
    shutil.copy(ROOT / "configs" / "dagster.yaml", dagster_home / "dagster.yaml")
    env = {
        **os.environ,
        "FACTORY_HOME": str(home),
        "DAGSTER_HOME": str(dagster_home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONUNBUFFERED": "1",
    }
    return env
