"""Run a command and everything it starts as one unit that stops together (`make ui`).

`python -m factory.deploy.session -- dagster dev -w workspace.yaml ...` starts the command in a
session of its own and marks it, and so every process it starts however deep, with one
environment variable (`FACTORY_SESSION_MARK=<token>`). On Ctrl-C, SIGTERM or SIGHUP (or when the
command exits by itself) it stops the whole tree:

1. SIGINT to the command's process group: `dagster dev` shuts its webserver, daemon and code
   server down in order, as it does on Ctrl-C in a terminal of its own;
2. after `--grace` seconds, SIGTERM to every process still alive that carries the mark or is in
   the group (run workers, the training subprocess, vLLM engines, compute-log `tail -F`s and
   their watchers, a code server's gRPC child);
3. after as long again, SIGKILL to whatever is left, then it waits until none is alive.
A second Ctrl-C skips the waiting.

Why a mark and not only the process group: a process may start a session of its own (and leave
the group), and an orphan is re-parented to init (and leaves the tree), but the environment is
inherited by every child that does not clear it. Why the SIGKILL: stopping `make ui` (Ctrl-C)
while an eval run was in flight left `dagster dev`, its code server and gRPC server, the
webserver, the daemon and a multiprocessing resource tracker running (issue 16); 90 s later they
were still there and ignored SIGTERM too. Under this wrapper the same stop ends in ~25 s.

With `FACTORY_METRICS=1` and `--metrics-port` (`make ui` passes both), the factory-health exporter
and Prometheus (`--prometheus-port`) start beside the command (`factory.health.local`), get the
same SIGINT and carry the same mark.

The command and the processes beside it start with SIGINT and SIGTERM at their defaults, whatever
the wrapper inherited: a program started in the background by a non-interactive shell (`make ui &`
in a script, a CI lane) inherits SIGINT ignored, and its children would then sit out step 1.

Linux only (it reads `/proc`); other systems get the process-group steps.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from factory import settings

MARK = "FACTORY_SESSION_MARK"
PROC = Path("/proc")


def members(token: str, group: int | None = None) -> list[int]:
    """PIDs of live (not zombie) processes that carry `MARK=token` or are in process group `group`."""
    wanted = f"{MARK}={token}".encode()
    found = []
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
            # fields after the parenthesised command name: state, ppid, pgrp, ...
            state, _, pgrp = stat.rsplit(")", 1)[1].split()[:3]
            if state == "Z":
                continue
            if (group is not None and int(pgrp) == group) or wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):  # gone meanwhile, or not ours to read
            continue
    return found


def children(pid: int) -> list[int]:
    """PIDs of the live processes whose parent is `pid`."""
    found = []
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):  # gone meanwhile
                continue
    return found


def environ(pid: int) -> dict[str, str]:
    """The environment process `pid` was started with."""
    raw = (PROC / str(pid) / "environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


class Session:
    """The command's process tree; `stop()` ends all of it (module docstring)."""

    def __init__(self, argv: list[str], grace: float = 10.0):
        self.token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.grace = grace
        self.hurry = False
        self.proc = subprocess.Popen(argv, env={**settings.environment(), MARK: self.token}, start_new_session=True)
        self.beside: list[subprocess.Popen] = []  # processes started next to the command (Prometheus: factory.health.local)

    def alive(self) -> list[int]:
        return members(self.token, self.proc.pid)

    def _wait(self, seconds: float, hurry: bool = True) -> bool:
        """Until the tree is gone (True) or `seconds` passed or (when `hurry`) a second signal came."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (hurry and self.hurry):
            for child in (self.proc, *self.beside):  # reap our own children, so they do not linger as zombies
                child.poll()
            if not self.alive():
                return True
            time.sleep(0.2)
        self.proc.poll()
        return not self.alive()

    def _signal(self, sig: int, pids: list[int]) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        self._signal(signal.SIGINT, [p.pid for p in self.beside if p.poll() is None])
        if self._wait(self.grace):
            return
        leftover = self.alive()
        print(f"stopping {len(leftover)} processes left behind (SIGTERM): {leftover}", file=sys.stderr)
        self._signal(signal.SIGTERM, leftover)
        if self._wait(self.grace):
            return
        leftover = self.alive()
        print(f"killing {len(leftover)} processes (SIGKILL): {leftover}", file=sys.stderr)
        self._signal(signal.SIGKILL, leftover)
        self._wait(10.0, hurry=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m factory.deploy.session", description=__doc__.split("\n")[0])
    parser.add_argument("--grace", type=float, default=10.0, help="seconds per stopping step (default 10)")
    parser.add_argument("--metrics-port", type=int, help="with FACTORY_METRICS=1: the metrics exporter's port")
    parser.add_argument("--prometheus-port", type=int, help="with FACTORY_METRICS=1: start Prometheus on this port")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    from factory import health

    on = health.enabled() and args.metrics_port is not None
    # an ignored SIGINT or SIGTERM is inherited across exec (a handler is not): the command and what
    # starts beside it get the defaults (module docstring); ours are set once they run
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if on:
        settings.export(health.child_env())  # the command's every process writes to the exporter's directory
    session = Session(command, grace=args.grace)
    if on:
        from factory.health.local import start_beside_session

        session.beside = start_beside_session(session.token, args.metrics_port, args.prometheus_port)
    received: list[int] = []

    def on_signal(signum, _frame):
        if received:
            session.hurry = True  # a second Ctrl-C: stop waiting
        received.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    while not received and session.proc.poll() is None:
        try:
            session.proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
    session.stop()
    code = session.proc.wait()
    return 128 + received[0] if received else code


if __name__ == "__main__":
    sys.exit(main())
