"""The CI path: `dagster asset materialize --select ... -m definitions` from the shell writes
the table, its lineage and a run in the persistent Dagster instance under DAGSTER_HOME.
Marked `slow` (~15 s)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance

from factory.lake import Lake
from factory.lake.commit import stamp_of

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).parent / "dagster"


def test_asset_materialize_from_the_shell(factory_env):
    config = {"ops": {"raw__python_stdlib": {"config": {"max_documents": 25}}}}
    out = subprocess.run(
        [str(DAGSTER), "asset", "materialize", "-m", "definitions", "--select", "raw/python_stdlib",
         "--config-json", json.dumps(config)],
        cwd=ROOT, env=factory_env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]

    instance = DagsterInstance.from_config(factory_env["DAGSTER_HOME"])
    [run] = instance.get_runs()
    assert run.status.value == "SUCCESS"

    lake = Lake.open(home=factory_env["FACTORY_HOME"])
    table = lake.table("raw.python_stdlib")
    assert table.scan().to_arrow().num_rows == 25
    stamp = stamp_of(table)
    assert stamp["run-id"] == run.run_id
    assert stamp["asset-key"] == "raw/python_stdlib"
    assert stamp["code-version"] and stamp["config-hash"]
    [record] = lake.lineage.resolve("raw.python_stdlib")
    assert record.run_id == run.run_id
