"""End to end through the web UI's own API: `dagster dev` on loopback, a run launched over
GraphQL, the run reaching SUCCESS, and the Iceberg tables and lineage rows it wrote.

Marked `slow` (~60 s). The server comes from the `dagster_dev` fixture (tests/integration/conftest.py).
"""

import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterRunStatus

from factory.lake import Lake

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).parent / "dagster"


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
