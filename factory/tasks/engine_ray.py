"""Starting, joining and inspecting the Ray instance the task engine runs on.

A local instance listens on loopback only. `_node_ip_address="127.0.0.1"` alone does not do it on
Linux: Ray replaces a loopback address with the host's outward one unless its cluster mode is off
(`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, the switch Ray uses on macOS and Windows), and its servers
bind every interface unless the node address is loopback. So the switch is on while the instance
starts (the processes it spawns inherit it) and restored afterwards, so that an engine that later
joins a real cluster from this process resolves its own address again. A driver joining a loopback
instance by its address ('127.0.0.1:<gcs port>', another process's engine) needs the same switch, or
it looks for a raylet at the host's outward address and waits forever. Measured on the 2-core dev
box: `ray.init` takes ~7-15 s and the instance's processes hold ~1 GB RSS with two idle workers.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time

import ray

from factory import settings
from factory.tasks.engine_model import EngineConfig

CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# A local start may fail on a loaded machine by no fault of ours: the raylet gives its dashboard agent a
# fixed 15 s to write its port files and aborts when the agent's imports take longer (ray-project/ray
# issue 65983; seen with the test suite's lanes side by side). A local instance is ours alone, so it
# is started again.
LOCAL_START_TRIES = 3
log = logging.getLogger(__name__)


def start_ray(config: EngineConfig) -> bool:
    """Start or join Ray for `config`; False when Ray was already initialized here (not ours to stop)."""
    if settings.get("RAY_USAGE_STATS_ENABLED") is None:  # no usage reports: nothing leaves the host
        settings.export({"RAY_USAGE_STATS_ENABLED": "0"})
    if ray.is_initialized():
        return False
    quiet = {"logging_level": logging.WARNING, "log_to_driver": False, "namespace": "factory-tasks"}
    if config.address is not None and not _on_loopback(config.address):
        ray.init(address=config.address, **quiet)
        return True
    if config.address is not None:  # a second driver of a loopback instance: it must call itself 127.0.0.1 too
        with _loopback_only():
            ray.init(address=config.address, _node_ip_address="127.0.0.1", **quiet)
        return True
    attempt = 1
    while True:
        try:
            with _loopback_only():
                ray.init(address="local", include_dashboard=False,
                         num_cpus=math.ceil(config.workers * config.attempt_cpus), _node_ip_address="127.0.0.1",
                         object_store_memory=config.object_store_mb * 2**20, **quiet)
            return True
        except Exception as exc:  # a local instance is ours alone: stop what the failed start left, start again
            ray.shutdown()
            if attempt == LOCAL_START_TRIES:
                raise RuntimeError(f"a local Ray instance failed to start {LOCAL_START_TRIES} times; last: "
                                   f"{type(exc).__name__}: {exc} (its raylet.err under /tmp/ray/session_latest/logs "
                                   "says why)") from exc
            attempt += 1
            log.warning("a local Ray instance failed to start (%s: %s); starting it again (%d/%d)",
                        type(exc).__name__, exc, attempt, LOCAL_START_TRIES)
            time.sleep(2)


def _on_loopback(address: str) -> bool:
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


@contextlib.contextmanager
def _loopback_only():
    from ray._private import ray_constants

    before_flag = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False  # read at import; services.py reads the module attribute per call
    try:
        with settings.temporarily(CLUSTER_SWITCH, "0"):
            yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before_flag


def ray_processes() -> list[int]:
    """PIDs of the Ray instance this process started (gcs, raylet, agents, workers and their children)."""
    import psutil

    node = ray._private.worker._global_node  # None when joined through Ray Client or not started here
    pids: set[int] = set()
    for infos in (node.all_processes.values() if node is not None else ()):
        for info in infos:
            pids.add(info.process.pid)
            with contextlib.suppress(psutil.NoSuchProcess):
                pids.update(p.pid for p in psutil.Process(info.process.pid).children(recursive=True))
    return sorted(pids)


def stop_ray(grace_s: float = 10.0) -> list[int]:
    """`ray.shutdown()`, then wait up to `grace_s` for this instance's processes to exit and SIGKILL
    any left; returns the PIDs that had to be killed. `ray.shutdown` signals its processes and
    returns without waiting, so a worker or agent can outlive it by a second or more on a busy host."""
    import psutil

    procs = []
    for pid in ray_processes():
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    ray.shutdown()
    alive = _wait_gone(procs, grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    if alive:
        _wait_gone(alive, grace_s)
        logging.getLogger(__name__).warning("killed %d Ray processes still alive %.0f s after ray.shutdown: %s",
                                            len(alive), grace_s, [p.pid for p in alive])
    return [p.pid for p in alive]


def _wait_gone(procs: list, timeout_s: float) -> list:
    """The ones of `procs` still running after `timeout_s` (a zombie counts as gone: it only awaits its reaper)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


def memory_mb(pids: list[int]) -> float:
    """Resident memory of `pids` together (MiB), the ones still alive."""
    import psutil

    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += psutil.Process(pid).memory_info().rss
    return total / 2**20
