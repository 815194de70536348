"""A Spark standalone cluster on loopback: one master and N workers, started with pyspark's own
`bin/spark-class`, each a `Server` stopped by PID.

pyspark's wheel ships `bin/spark-class` but none of Spark's `sbin/start-*.sh` scripts, so the
daemons are started directly (`org.apache.spark.deploy.master.Master`, `...worker.Worker`), each
in its own session with its output in `work_dir/logs`. Everything binds to 127.0.0.1
(`--host`, `SPARK_LOCAL_IP`): this machine has no other network, and a laptop should not expose a
cluster. The workers' scratch (`SPARK_WORKER_DIR`, `SPARK_LOCAL_DIRS`) lives under `work_dir` too,
so stopping the cluster and deleting that directory leaves nothing behind.

"Ready" means every worker has registered with the master — the master web UI's `/json/`
endpoint says `aliveworkers == workers` — not merely that the ports listen: a session created
before a worker registers waits without executors. The workers' own Python is the venv's
(`PYSPARK_PYTHON`), the same interpreter `factory.data.spark` names for executors, so pandas UDFs
find pyarrow. `make cluster-up` calls `start_spark_cluster` with the loopback profile's ports;
tests call it with free ports.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from factory import settings
from factory.deploy.config import LOOPBACK_JVM_OPTIONS
from factory.deploy.servers import Server, ServerError, free_port

HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# JVM heap of the master and worker daemons themselves (executors get `memory`); Spark's default
# of 1g each is most of a small machine's headroom for three processes that only keep state.
DAEMON_MEMORY = "512m"


def spark_class() -> Path:
    """pyspark's `bin/spark-class` (the launcher of Spark's JVM entry points)."""
    import pyspark

    path = Path(pyspark.__file__).parent / "bin" / "spark-class"
    if not path.exists():
        raise ServerError(f"pyspark at {path.parent.parent} has no bin/spark-class: cannot start a standalone cluster")
    return path


@dataclass
class SparkCluster:
    """A running standalone cluster: `url` for `SparkSession.builder.master`, `stop()` to end it."""

    master: Server
    workers: list[Server]
    port: int
    webui_port: int
    work_dir: Path
    started_seconds: float = field(default=0.0, compare=False)

    @property
    def url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://{HOST}:{self.webui_port}"

    @property
    def pids(self) -> dict[str, int]:
        """name -> PID of every daemon (what `make cluster-up` records for `cluster-down`)."""
        return {s.name: s.pid for s in [self.master, *self.workers] if s.pid is not None}

    def state(self) -> dict:
        """The master's own view (`/json/`): workers, cores, memory, applications."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=5) as response:
            return json.loads(response.read())

    def alive_workers(self) -> int:
        return int(self.state().get("aliveworkers", 0))

    def stop(self) -> None:
        """Stop the workers, then the master, by PID (a worker outliving its master only retries)."""
        for worker in self.workers:
            worker.stop()
        self.master.stop()

    def __enter__(self) -> "SparkCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _daemon_env(work_dir: Path, python: str) -> dict[str, str]:
    env = settings.environment()
    env |= {
        "SPARK_LOCAL_IP": HOST,
        "SPARK_LOG_DIR": str(work_dir / "logs"),
        "SPARK_PID_DIR": str(work_dir / "pids"),
        "SPARK_WORKER_DIR": str(work_dir / "work"),
        "SPARK_LOCAL_DIRS": str(work_dir / "local"),
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_DAEMON_JAVA_OPTS": LOOPBACK_JVM_OPTIONS,  # a master and workers on this machine alone
        # executors a worker launches start Python workers with this interpreter unless the
        # application names one (factory.data.spark always does)
        "PYSPARK_PYTHON": python,
    }
    env.pop("SPARK_HOME", None)  # spark-class finds pyspark's own home; a stray one mixes versions
    return env


def start_spark_cluster(
    work_dir: str | Path,
    *,
    port: int | None = None,
    webui_port: int | None = None,
    workers: int = 2,
    cores: int = 1,
    memory: str = "1g",
    python: str | None = None,
    timeout: float = 180.0,
) -> SparkCluster:
    """Start a master on 127.0.0.1:`port` (web UI on `webui_port`; free ports when None) and
    `workers` workers of `cores` cores and `memory` each; return once all have registered.

    `python` is the workers' Python (default: this interpreter). Logs go to `work_dir/logs`. On
    any failure every daemon already started is stopped before the error propagates.
    """
    if workers < 1 or cores < 1:
        raise ValueError(f"a cluster needs at least one worker and one core each (workers={workers}, cores={cores})")
    started = time.monotonic()
    work_dir = Path(work_dir).resolve()
    for sub in ("logs", "pids", "work", "local"):
        (work_dir / sub).mkdir(parents=True, exist_ok=True)
    port, webui_port = port or free_port(), webui_port or free_port()
    env = _daemon_env(work_dir, python or sys.executable)
    launcher = str(spark_class())
    url = f"spark://{HOST}:{port}"

    master = Server("spark-master", [launcher, MASTER_CLASS, "--host", HOST, "--port", str(port),
                                     "--webui-port", str(webui_port)],
                    work_dir / "logs" / "master.log", env=env, cwd=work_dir)
    cluster = SparkCluster(master=master, workers=[], port=port, webui_port=webui_port, work_dir=work_dir)
    try:
        master.start()
        master.wait_ready(lambda: "aliveworkers" in cluster.state(), timeout, f"web UI {cluster.webui_url}/json/")
        for i in range(workers):
            worker = Server(f"spark-worker-{i}", [
                launcher, WORKER_CLASS, url, "--host", HOST, "--cores", str(cores), "--memory", memory,
                "--webui-port", str(free_port()), "--work-dir", str(work_dir / "work" / str(i)),
            ], work_dir / "logs" / f"worker-{i}.log", env=env, cwd=work_dir)
            cluster.workers.append(worker.start())
        deadline = time.monotonic() + timeout
        for worker in cluster.workers:  # each must stay up while the master counts them
            worker.wait_ready(lambda: cluster.alive_workers() >= workers, max(deadline - time.monotonic(), 1.0),
                              f"{workers} workers registered with {url}")
    except BaseException:
        cluster.stop()
        raise
    cluster.started_seconds = round(time.monotonic() - started, 1)
    return cluster
