"""Fixtures for the end-to-end tier: an isolated FACTORY_HOME with its own Dagster instance, and
`dagster dev` (webserver + daemon) on loopback over it.

The server is started in a new process session with default SIGINT/SIGTERM handlers (started from
a script it would otherwise inherit an ignored SIGINT) and stopped by PID."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster_graphql import DagsterGraphQLClient

ROOT = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).parent / "dagster"


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _default_signals():
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture
def dagster_dev(factory_env, tmp_path):
    port = _free_port()
    log = open(tmp_path / "dagster-dev.log", "w")
    proc = subprocess.Popen(
        [str(DAGSTER), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT, env=factory_env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True, preexec_fn=_default_signals,
    )
    client = DagsterGraphQLClient("127.0.0.1", port_number=port)
    deadline = time.monotonic() + 120
    while True:
        try:
            client._execute("{ version }")
            break
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"dagster dev did not come up: {(tmp_path / 'dagster-dev.log').read_text()[-3000:]}")
            time.sleep(1)
    try:
        yield client
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
