"""Factory-health metrics through a real Prometheus: Debian's `prometheus` on loopback scrapes the
exporter (the Dagster layer's, `python -m resources.run_queue_metrics`, over a fresh instance) every
second while a short real training run (`python -m factory.train`, the smoke model, 4 steps, its
own process) and a sandbox batch (bubblewrap, 5 programs: 3 pass, 1 fails, 1 runs out of memory)
write their series into one multiprocess directory; then PromQL over the HTTP API
(`/api/v1/query`) reads back exactly what ran: 4 steps counted and timed, the last step 4, the loop
no longer running, commits to the `train` namespace, outcomes 3/1/1 summing to the 5 executions, an
empty run queue; every dashboard panel's query parses and evaluates, and the alert rules load
healthy and silent. A second test: `make ui`'s session wrapper starts the exporter and Prometheus
beside its command, Prometheus scrapes the exporter, and one SIGINT stops all three.

Everything binds 127.0.0.1 on free ports, runs under tmp_path and is stopped by PID. Skipped
without the `prometheus` binary (`make system` installs it). Marked `slow` (~60 s and ~25 s on 2 busy cores).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from factory.health import dashboards, metrics
from factory.health.local import RULES, prometheus_command, prometheus_config

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed (make system)")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(port: int, promql: str) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def value(port: int, promql: str) -> float | None:
    result = query(port, promql)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def wait_for(port: int, promql: str, expected: float, timeout: float = 60) -> None:
    """Until Prometheus has scraped `promql` == `expected` (it scrapes every second)."""
    deadline, got = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        if (got := value(port, promql)) == expected:
            return
        time.sleep(0.5)
    pytest.fail(f"{promql} = {got}, expected {expected} after {timeout:.0f} s")


def start_prometheus(server, tmp_path, port: int, target_port: int, env: dict, wait_up):
    config = tmp_path / "prometheus.yml"
    config.write_text(prometheus_config([f"127.0.0.1:{target_port}"], rules=RULES, interval_s=1))
    proc = server("prometheus", prometheus_command(config, tmp_path / "tsdb", port), env)
    wait_up(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5).read(), proc,
            tmp_path / "prometheus.log", 60, "prometheus")
    return proc


def test_training_and_sandbox_series_queried_back_with_promql(tmp_path, build_training_lake, server, wait_up,
                                                            monkeypatch):
    from factory.sandbox import Sandbox, SandboxConfig

    home, prom_dir, dagster_home = tmp_path / "home", tmp_path / "prom", tmp_path / "dagster"
    dagster_home.mkdir()
    build_training_lake(home, profile=None)
    env = {**os.environ, "FACTORY_HOME": str(home), "FACTORY_METRICS": "1", "PROMETHEUS_MULTIPROC_DIR": str(prom_dir),
           "DAGSTER_HOME": str(dagster_home), "OMP_NUM_THREADS": "1"}
    for name in ("FACTORY_FAULTS", "FACTORY_TRACKER_BACKENDS", "FACTORY_DEPLOY", "FACTORY_DEPLOY_JSON"):
        env.pop(name, None)
    exporter_port, prom_port = free_port(), free_port()
    exporter = server("exporter", [sys.executable, "-m", "resources.run_queue_metrics", "--port", str(exporter_port),
                                   "--dir", str(prom_dir), "--dagster-home", str(dagster_home)], env)
    wait_up(lambda: urllib.request.urlopen(f"http://127.0.0.1:{exporter_port}/metrics", timeout=5).read(), exporter,
            tmp_path / "exporter.log", 60, "exporter")
    start_prometheus(server, tmp_path, prom_port, exporter_port, env, wait_up)
    wait_for(prom_port, 'up{job="factory"}', 1)

    trainer = subprocess.run([sys.executable, "-m", "factory.train", "--experiment", "smoke", "--steps", "4",
                              "--checkpoint-every", "2", "--home", str(home), "--run-name", "promsmoke"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert trainer.returncode == 0, trainer.stderr[-3000:]

    # the sandbox batch in this process, writing to the same directory
    monkeypatch.setenv("FACTORY_METRICS", "1")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(prom_dir))
    metrics.reset()
    try:
        programs = ["print(1)", "print(2)", "print(3)", "raise SystemExit(1)", "raise MemoryError"]
        outcomes = [r.outcome.value for r in Sandbox(SandboxConfig(workers=2)).map(programs)]
    finally:
        metrics.reset()
    assert sorted(outcomes) == ["failed", "oom", "passed", "passed", "passed"]

    run = '{run="promsmoke"}'
    wait_for(prom_port, "sum(factory_sandbox_executions_total)", 5)
    wait_for(prom_port, f"sum(factory_train_steps_total{run})", 4)
    assert value(prom_port, f"sum(factory_train_step_seconds_count{run})") == 4
    assert value(prom_port, f"max(factory_train_last_step{run})") == 4
    assert value(prom_port, f"max(factory_train_running{run})") == 0
    assert value(prom_port, f"max(factory_train_tokens_per_second{run})") > 0
    assert value(prom_port, f"sum(factory_train_nonfinite_steps_total{run})") == 0
    assert value(prom_port, 'sum(factory_lake_commits_total{namespace="train"})') >= 2  # checkpoints, metrics
    for outcome, n in {"passed": 3, "failed": 1, "oom": 1}.items():
        assert value(prom_port, f'sum(factory_sandbox_executions_total{{outcome="{outcome}"}})') == n
    assert value(prom_port, "sum(factory_sandbox_queue_wait_seconds_count)") == 5
    assert value(prom_port, "factory_dagster_queue_length") == 0

    for expr in dashboards.expressions(dashboards.factory_health()):
        assert query(prom_port, expr)["status"] == "success", expr
    with urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/api/v1/rules", timeout=10) as r:
        rules = [rule for g in json.load(r)["data"]["groups"] for rule in g["rules"]]
    assert len(rules) == 4 and {r["health"] for r in rules} == {"ok"}
    assert {r["state"] for r in rules} == {"inactive"}  # a finished healthy run and an empty queue: no alert


def _with_home(home: Path) -> list[int]:
    """PIDs of live processes whose environment names `home` as FACTORY_HOME."""
    wanted, found = f"FACTORY_HOME={home}".encode(), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z" and \
                        wanted in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except (OSError, IndexError):
                continue
    return found


def test_the_ui_session_starts_prometheus_beside_its_command_and_stops_it(tmp_path):
    home = tmp_path / "home"
    (home / "dagster").mkdir(parents=True)
    exporter_port, prom_port = free_port(), free_port()
    env = {**os.environ, "FACTORY_HOME": str(home), "DAGSTER_HOME": str(home / "dagster"), "FACTORY_METRICS": "1"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    with open(tmp_path / "session.log", "w") as log:
        session = subprocess.Popen([sys.executable, "-m", "factory.deploy.session", "--grace", "30",
                                    "--metrics-port", str(exporter_port), "--prometheus-port", str(prom_port),
                                    "--", "sleep", "600"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if value(prom_port, 'up{job="factory"}') == 1 and value(prom_port, "factory_dagster_queue_length") == 0:
                    break
            except OSError:
                pass
            assert session.poll() is None, (tmp_path / "session.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "session.log").read_text() + \
                (home / "logs" / "prometheus.log").read_text()[-2000:]
            time.sleep(1)
        assert (home / "metrics" / "prom").is_dir() and (home / "metrics" / "tsdb").is_dir()
        assert len(_with_home(home)) >= 3  # the wrapper's command, the exporter, Prometheus
        session.send_signal(signal.SIGINT)
        assert session.wait(timeout=120) == 128 + signal.SIGINT
        # all three stopped on the SIGINT: the wrapper never had to escalate to SIGTERM after its grace
        assert "left behind (SIGTERM)" not in (tmp_path / "session.log").read_text()
        assert _with_home(home) == []
    finally:
        if session.poll() is None:
            os.killpg(session.pid, signal.SIGKILL)
            session.wait()
        for pid in _with_home(home):
            os.kill(pid, signal.SIGKILL)
