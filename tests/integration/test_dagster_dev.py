"""End to end through the web UI's own API: `dagster dev` on loopback, a run launched over
GraphQL, the run reaching SUCCESS, and the Iceberg tables and lineage rows it wrote.

Marked `slow` (~60 s). The server is started in a new process session with default SIGINT/SIGTERM
handlers (started from a script it would otherwise inherit an ignored SIGINT) and stopped by PID.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterRunStatus
from dagster_graphql import DagsterGraphQLClient

from factory.lake import Lake

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).parent / "dagster"


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


def test_graphql_launch_materializes_tables_with_lineage(dagster_dev, factory_env):
    run_config = {"ops": {f"raw__{n}": {"config": {"max_documents": 15}} for n in ("python_stdlib", "site_packages", "package_docs")}}
    run_id = dagster_dev.submit_job_execution("ingest_job", run_config=run_config)
    deadline = time.monotonic() + 240
    status = dagster_dev.get_run_status(run_id)
    while status not in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED):
        assert time.monotonic() < deadline, f"run {run_id} still {status}"
        time.sleep(2)
        status = dagster_dev.get_run_status(run_id)
    assert status == DagsterRunStatus.SUCCESS

    lake = Lake.open(home=factory_env["FACTORY_HOME"])
    for source in ("python_stdlib", "site_packages", "package_docs"):
        table = lake.table(f"raw.{source}")
        assert table.scan().to_arrow().num_rows == 15
        [record] = lake.lineage.resolve(f"raw.{source}")
        assert record.run_id == run_id
        assert record.snapshot_id == table.current_snapshot().snapshot_id
        assert record.asset_key == f"raw/{source}"
