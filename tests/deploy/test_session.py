"""`factory.deploy.session` (what `make ui` runs `dagster dev` under): on SIGINT or SIGTERM it stops
the command's whole tree, including a child that ignores SIGINT, one that started a session of
its own (out of the process group) and one orphaned by its parent (out of the tree), and returns
128 + the signal; started with SIGINT ignored (a background job of a script), its command still
gets the SIGINT. Unit tier: `sleep`s stand in for dagster's processes, found in /proc by the
test by their unique argument. A few seconds."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest


def alive(tag: str) -> list[int]:
    """PIDs of live processes whose command line (arguments joined by spaces) holds `tag`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if tag in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def catches(pid: int, sig: int) -> bool:
    """Whether process `pid` has a handler for `sig` (/proc/PID/status SigCgt)."""
    for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.slow
def test_a_signal_stops_the_whole_tree_even_what_left_the_group(sig):
    seconds = str(900 + uuid.uuid4().int % 99)  # a unique `sleep N` to find in /proc
    script = (f"trap '' INT; sleep {seconds} & setsid sleep {seconds} & "
              f"(sleep {seconds} &) ; sleep {seconds}.5")  # INT-ignoring, own session, orphaned, the main one
    session = [sys.executable, "-m", "factory.deploy.session", "--grace", "1", "--"]
    proc = subprocess.Popen([*session, "bash", "-c", script], start_new_session=True)
    deadline = time.monotonic() + 20
    while len(alive(f"sleep {seconds}")) < 4:
        assert time.monotonic() < deadline, alive(f"sleep {seconds}")
        time.sleep(0.1)
    os.kill(proc.pid, sig)
    assert proc.wait(timeout=30) == 128 + sig
    assert alive(f"sleep {seconds}") == []


def test_the_command_exiting_by_itself_still_stops_what_it_left_running():
    seconds = str(800 + uuid.uuid4().int % 99)
    proc = subprocess.run([sys.executable, "-m", "factory.deploy.session", "--grace", "1", "--", "bash", "-c",
                           f"setsid sleep {seconds} & exit 3"], timeout=30)
    assert proc.returncode == 3 and alive(f"sleep {seconds}") == []


def test_a_session_started_with_sigint_ignored_still_stops_its_command_by_sigint():
    # `make test` runs its lanes as background jobs of a non-interactive shell, which start with SIGINT
    # ignored: before, the command inherited that, sat out the SIGINT and was stopped by SIGTERM after
    # the grace ("left behind (SIGTERM)")
    seconds = str(700 + uuid.uuid4().int % 99)
    proc = subprocess.Popen([sys.executable, "-m", "factory.deploy.session", "--grace", "60", "--", "sleep", seconds],
                            start_new_session=True, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 60
    while not (alive(f"sleep {seconds}") and catches(proc.pid, signal.SIGHUP)):  # its handlers set last
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=30) == 128 + signal.SIGINT
    assert "left behind" not in proc.stderr.read() and alive(f"sleep {seconds}") == []
