"""`make ui` stops everything it started: started as a user does (its own terminal session, free
ports through `DAGSTER_PORT`, `METRICS_PORT` and `PROMETHEUS_PORT`, for the metrics exporter and
Prometheus that start beside Dagster), with a run in progress (a run worker, its compute-log
tailers and their watchers), then Ctrl-C (SIGINT to the session's foreground group, i.e. make's); no
process started under it may remain, whether still in that session or not (each carries the
test's own FACTORY_HOME in its environment, which is how they are found in /proc). Stopped two
ways: Ctrl-C (every process of the group gets SIGINT at once) and SIGTERM to make alone.

Marked `slow` (~1-2 min each: `make setup`'s checks, dagster dev starting, one short ingest run).
"""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from dagster import DagsterRunStatus
from dagster_graphql import DagsterGraphQLClient

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _default_signals():  # a terminal's job gets default handlers (pytest's may be ignored ones)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.parametrize("stop", ["ctrl-c", "kill"])
def test_stopping_make_ui_stops_the_webserver_daemon_code_server_and_run_workers(stop, factory_env, free_port,
                                                                                  free_ports, leftovers, tmp_path,
                                                                                  wait_up):
    # make ui also starts the metrics exporter and Prometheus (FACTORY_METRICS defaults to 1): free
    # ports for them too, and the leftovers check covers them
    env = {**factory_env, "DAGSTER_PORT": str(free_port), "METRICS_PORT": str(free_ports()),
           "PROMETHEUS_PORT": str(free_ports())}
    with open(tmp_path / "make-ui.log", "w") as log:
        make = subprocess.Popen(["make", "-C", str(ROOT), "ui"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_default_signals)
    try:
        client = DagsterGraphQLClient("127.0.0.1", port_number=free_port)
        deadline = time.monotonic() + 300  # for the webserver to answer and the daemon to start the run
        # not up yet: connection refused, or the code location still loading
        wait_up(lambda: client._execute("{ version }"), make, tmp_path / "make-ui.log", 300, "make ui")
        # a run in progress when the user stops the UI: its worker and log tailers must go too
        sources = ("python_stdlib", "site_packages", "package_docs")
        run_id = client.submit_job_execution("ingest_job", run_config={"ops": {
            f"raw__{n}": {"config": {"max_documents": 200}} for n in sources}})
        while client.get_run_status(run_id) in (DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED,
                                                DagsterRunStatus.STARTING):
            assert time.monotonic() < deadline, "the daemon did not start the run"
            time.sleep(0.5)
        assert leftovers(env, make.pid, wait=0) and client.get_run_status(run_id) == DagsterRunStatus.STARTED

        if stop == "ctrl-c":
            os.killpg(make.pid, signal.SIGINT)  # Ctrl-C in make's terminal: its whole foreground group
        else:
            os.kill(make.pid, signal.SIGTERM)  # `kill <pid of make>`, an IDE's stop button, a timeout
        make.wait(timeout=120)
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
    left = leftovers(env, make.pid)
    assert not left, "still running after make ui was stopped:\n" + "\n".join(left)
