"""Fixtures for the end-to-end tier: an isolated FACTORY_HOME with its own Dagster instance (and an
empty experiments directory for the experiment sensor), and `dagster dev` (webserver + daemon) on
loopback over it.

The server is started in a new process session with default SIGINT/SIGTERM handlers (started from
a script it would otherwise inherit an ignored SIGINT) and stopped by PID."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster_graphql import DagsterGraphQLClient

from demo_run import wait_for_demo_lane

ROOT = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).parent / "dagster"


@pytest.fixture
def factory_env(tmp_path):
    """Environment for subprocesses: FACTORY_HOME and DAGSTER_HOME under tmp_path, loopback Spark."""
    home = tmp_path / "factory"
    dagster_home = home / "dagster"
    dagster_home.mkdir(parents=True)
    (tmp_path / "no_experiments").mkdir()  # the experiment sensor queues nothing a test did not ask for
    shutil.copy(ROOT / "configs" / "dagster.yaml", dagster_home / "dagster.yaml")
    env = {
        **os.environ,
        "FACTORY_HOME": str(home),
        "DAGSTER_HOME": str(dagster_home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONUNBUFFERED": "1",
        "FACTORY_EXPERIMENTS_DIR": str(tmp_path / "no_experiments"),
    }
    return env


@pytest.fixture
def dagster_dev(factory_env, tmp_path, server, free_ports, wait_up):
    port = free_ports()
    proc = server("dagster-dev", [str(DAGSTER), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
                  factory_env)
    client = DagsterGraphQLClient("127.0.0.1", port_number=port)
    wait_up(lambda: client._execute("{ version }"), proc, tmp_path / "dagster-dev.log", 120, "dagster dev")
    client.url = f"http://127.0.0.1:{port}"  # for factory.experiments.launcher.GraphQL
    return client


@pytest.fixture(scope="session")
def demo_home(tmp_path_factory) -> dict:
    """The environment of a FACTORY_HOME after `make demo`, run once per session exactly as a user runs
    it (about 5 minutes): the state `make ui`, the README and the CLI docstrings start from. Tests
    that use it must not depend on each other's writes; ones that only read come first by name.
    Its output is `demo.log` beside the home.

    Under `make test` the demo is a lane of its own (tests/demo_lane), started with the others:
    FACTORY_TEST_DEMO_RUN=DIR names it, and the fixture waits for its exit status (its log is
    DIR/demo.log; a lane that died without one fails the tests that use it, never hangs them).

    FACTORY_TEST_DEMO_HOME=PATH reuses a home a finished `make demo` left at PATH instead (for
    working on these tests: `FACTORY_HOME=/tmp/demo_x make demo` once, then every run starts at
    once). The tests may write to it as they would to the fixture's own, so give them a home of
    your own, never one you are looking at."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FACTORY_", "DAGSTER_"))}
    env["PYTHONUNBUFFERED"] = "1"
    reuse, lane = os.environ.get("FACTORY_TEST_DEMO_HOME"), os.environ.get("FACTORY_TEST_DEMO_RUN")
    if reuse:
        home = Path(reuse).resolve()
        assert (home / "lake").is_dir() and (home / "dagster").is_dir(), \
            f"FACTORY_TEST_DEMO_HOME={reuse}: not a home `make demo` finished in (no lake/ and dagster/ there)"
    elif lane:
        home = wait_for_demo_lane(Path(lane))
    else:
        root = tmp_path_factory.mktemp("demo")
        home = root / "factory"
        with open(root / "demo.log", "w") as log:
            done = subprocess.run(["make", "-C", str(ROOT), "demo", f"FACTORY_HOME={home}"],
                                  env=env | {"FACTORY_HOME": str(home)}, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=3600)
        assert done.returncode == 0, f"make demo failed: {(root / 'demo.log').read_text()[-4000:]}"
    return env | {"FACTORY_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}


def _processes_with(needle: bytes, session: int | None) -> list[str]:
    """'pid cmdline' of live processes whose environment holds `needle` or in session `session`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            in_session = session is not None and int(fields[3]) == session
            if in_session or needle in (entry / "environ").read_bytes().split(b"\0"):
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{entry.name} {cmd[:200]}")
        except (OSError, ValueError, IndexError):
            continue
    return found


@pytest.fixture
def leftovers():
    """`leftovers(env, session=None, wait=10, var="FACTORY_HOME") -> ['pid cmdline', ...]`: processes
    still alive that were started with `env` (its `var`, unique per test, is inherited by every
    descendant) or that are in process session `session`, after waiting up to `wait` s for them to go."""
    def scan(env: dict, session: int | None = None, wait: float = 10, var: str = "FACTORY_HOME") -> list[str]:
        needle = f"{var}={env[var]}".encode()
        deadline = time.monotonic() + wait
        while (found := _processes_with(needle, session)) and time.monotonic() < deadline:
            time.sleep(0.5)
        return found

    return scan
