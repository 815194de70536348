"""Servers the factory starts on loopback (SeaweedFS, a Spark standalone cluster, PostgreSQL):
one way to start a process, wait until it answers, and stop it by PID.

A server runs in a new session with default SIGINT/SIGTERM handlers (a process started from a
script can inherit ignored signals and then never stop), writes its output to a log file, and is
stopped by PID: SIGTERM to its process group, SIGKILL after a grace period. `make cluster-up`
records the PIDs under `$FACTORY_HOME/cluster` so `make cluster-down` stops exactly those; tests
use the same class and stop their servers in a `finally`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


class ServerError(RuntimeError):
    """A server did not start, or stopped answering; the message carries the end of its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _default_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


@dataclass
class Server:
    """One server process: `start()`, `wait_ready()`, `stop()`."""

    name: str
    command: Sequence[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)
    pid: int | None = None

    def start(self) -> "Server":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(list(self.command), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=self.env, cwd=self.cwd,
                                            start_new_session=True, preexec_fn=_default_signals)
        except OSError as e:
            raise ServerError(f"{self.name}: cannot start {self.command[0]}: {e}") from None
        finally:
            log.close()
        self.pid = self.process.pid
        return self

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return self.pid is not None and pid_alive(self.pid)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_ready(self, ready: Callable[[], bool], timeout: float, what: str = "") -> "Server":
        """Poll `ready()` until it is true; fail with the log if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServerError(f"{self.name} exited before it was ready (exit "
                                  f"{self.process.returncode if self.process else '?'}); log {self.log_path}:\n"
                                  f"{self.log_tail()}")
            with contextlib.suppress(Exception):
                if ready():
                    return self
            time.sleep(0.5)
        self.stop()
        raise ServerError(f"{self.name} was not ready{' (' + what + ')' if what else ''} after {timeout:.0f} s; "
                          f"log {self.log_path}:\n{self.log_tail()}")

    def wait_port(self, host: str, port: int, timeout: float) -> "Server":
        return self.wait_ready(lambda: port_open(host, port), timeout, f"{host}:{port} not listening")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after `grace` seconds."""
        if self.pid is None:
            return
        stop_pid(self.pid, grace)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=1)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie is not alive
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
            return False
    return True


def stop_pid(pid: int, grace: float = 10.0) -> bool:
    """Stop the process group led by `pid` (falls back to the process); True if it was running."""
    if not pid_alive(pid):
        return False
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and pid_alive(pid):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)
        if not pid_alive(pid):
            return True
    return True
