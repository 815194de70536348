"""`factory deploy up | status | check | down`: the servers a profile names on loopback are started,
recorded by PID under FACTORY_HOME/cluster, answer the profile's probes, and are stopped by exactly
those PIDs. Uses a PostgreSQL-only profile on a free port (the cheapest real server: ~2 s); the
SeaweedFS and Spark servers behind `up` are exercised by their own tests and by `.ci/run`.
Runs as root (PostgreSQL runs as the `postgres` user); CPU."""

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from factory.deploy.servers import free_port, pid_alive, port_open

ROOT = Path(__file__).resolve().parents[2]


def factory(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "factory.cli", "--home", str(home), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=180)


@pytest.mark.slow
def test_up_records_pids_the_probes_pass_and_down_stops_them():
    # not pytest's tmp_path: the postgres user must be able to walk down to its data directory
    home = Path(tempfile.mkdtemp(prefix="factory-up-"))
    home.chmod(0o755)
    port = free_port()
    profile = home / "pg.yaml"
    profile.write_text(f"dagster: {{storage: postgres, postgres: {{port: {port}, "
                       f"password: {{env: TEST_UP_PG_PASSWORD, default: up-test-secret}}}}}}\n")
    try:
        up = factory(home, "deploy", "up", "--deploy", str(profile))
        assert up.returncode == 0, up.stderr
        recorded = json.loads((home / "cluster" / "postgres.pid").read_text())
        assert pid_alive(recorded["pid"]) and port_open("127.0.0.1", port)
        check = factory(home, "deploy", "check", "--deploy", str(profile), "--json")
        probes = {p["field"]: p for p in json.loads(check.stdout)}
        assert check.returncode == 0 and probes["dagster.postgres"]["ok"], check.stdout
        status = factory(home, "deploy", "status", "--json")
        assert json.loads(status.stdout) == [{"server": "postgres", "pid": recorded["pid"], "running": True,
                                              "log": recorded["log"]}]
        down = factory(home, "deploy", "down")
        assert down.returncode == 0 and f"pid {recorded['pid']} stopped" in down.stdout
        assert not pid_alive(recorded["pid"]) and not port_open("127.0.0.1", port)
        assert not (home / "cluster" / "postgres.pid").exists()
        again = factory(home, "deploy", "check", "--deploy", str(profile))
        assert again.returncode == 1 and "dagster.postgres.host/port" in again.stderr
    finally:
        factory(home, "deploy", "down")
        shutil.rmtree(home, ignore_errors=True)
