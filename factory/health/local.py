"""Prometheus and the factory's exporter beside a local Dagster (`make ui`), on loopback.

`start_beside(...)` starts two processes and returns them:
1. the exporter on 127.0.0.1:`metrics_port`, with the run queue when a DAGSTER_HOME is given
   (`python -m resources.run_queue_metrics`, the Dagster layer's entry; `factory/` only names it);
2. Debian's `prometheus` on 127.0.0.1:`prometheus_port`, with a config written here (one scrape
   job for the exporter, deploy/prometheus/rules.yml loaded) and its TSDB under
   `FACTORY_HOME/metrics/tsdb`, so the history survives restarts of `make ui`.

Design: `factory.deploy.session` calls `start_beside_session`, keeps the two processes and sends
them the SIGINT it sends `dagster dev` (both stop cleanly on it); they carry the session's mark, so
whatever survives is stopped with the rest of the tree. Debian's own prometheus service is
never used (its package may start one on :9090 on a machine with systemd; pick another
`PROMETHEUS_PORT` then). No `prometheus` binary: the exporter still starts and the log says how to
install one (`make system`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules.yml"


def prometheus_config(targets: list[str], rules: Path | None = RULES, interval_s: float = 15) -> str:
    """A prometheus.yml scraping `targets` (host:port) every `interval_s` seconds."""
    lines = ["global:", f"  scrape_interval: {interval_s:g}s", f"  evaluation_interval: {interval_s:g}s"]
    if rules is not None:
        lines += ["rule_files:", f"  - {rules}"]
    lines += ["scrape_configs:", "  - job_name: factory", "    static_configs:",
              f"      - targets: [{', '.join(repr(t) for t in targets)}]"]
    return "\n".join(lines) + "\n"


def prometheus_command(config: Path, tsdb: Path, port: int, binary: str = "prometheus") -> list[str]:
    return [binary, f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
            f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle"]


def exporter_command(port: int, metrics_dir: Path, dagster_home: str | None) -> list[str]:
    module = "resources.run_queue_metrics" if dagster_home else "factory.health.exporter"
    return [sys.executable, "-m", module, "--port", str(port), "--dir", str(metrics_dir)] + (
        ["--dagster-home", dagster_home] if dagster_home else [])


def start_beside(home: Path, *, metrics_port: int, prometheus_port: int, dagster_home: str | None, env: dict,
                 interval_s: float = 15, with_prometheus: bool = True) -> list[subprocess.Popen]:
    """Start the exporter and Prometheus (module docstring); their output goes to
    `home/logs/{metrics-exporter,prometheus}.log`."""
    from factory.health import metrics_dir

    base = home / "metrics"
    logs = home / "logs"
    for d in (base, logs, metrics_dir(home)):
        d.mkdir(parents=True, exist_ok=True)
    procs = [_spawn(exporter_command(metrics_port, metrics_dir(home), dagster_home), logs / "metrics-exporter.log",
                    env)]
    if not with_prometheus:
        return procs
    binary = shutil.which("prometheus")
    if binary is None:
        print("prometheus is not installed (make system installs Debian's): serving metrics only, "
              f"on http://127.0.0.1:{metrics_port}/metrics", file=sys.stderr)
        return procs
    config = base / "prometheus.yml"
    config.write_text(prometheus_config([f"127.0.0.1:{metrics_port}"], interval_s=interval_s))
    procs.append(_spawn(prometheus_command(config, base / "tsdb", prometheus_port, binary), logs / "prometheus.log",
                        env))
    return procs


def start_beside_session(token: str, metrics_port: int, prometheus_port: int | None) -> list[subprocess.Popen]:
    """`factory.deploy.session`'s call: the processes above for this FACTORY_HOME and DAGSTER_HOME,
    marked with the session's token (Prometheus only when `prometheus_port` is given)."""
    from factory import settings
    from factory.deploy.session import MARK
    from factory.home import factory_home

    env, home, dagster_home = {**settings.environment(), MARK: token}, factory_home(), settings.get("DAGSTER_HOME")
    if prometheus_port is not None:
        print(f"== Prometheus at http://127.0.0.1:{prometheus_port} scraping the factory's metrics on "
              f"http://127.0.0.1:{metrics_port}/metrics", file=sys.stderr)
    return start_beside(home, metrics_port=metrics_port, prometheus_port=prometheus_port or 0, dagster_home=dagster_home,
                        env=env, with_prometheus=prometheus_port is not None)


def _spawn(argv: list[str], log: Path, env: dict) -> subprocess.Popen:
    with open(log, "a") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
