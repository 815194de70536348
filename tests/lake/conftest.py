"""Shared by the lake's crash tests: run a child that signals a point of a commit, kill it there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.fixture
def kill_at_marker():
    """`kill(code, *args, marker=Path)`: run `python -c code *args`, SIGKILL it once it creates
    `marker`, and return its stdout (the test asserts what it had not printed yet)."""

    def kill(code: str, *args: str, marker: Path) -> str:
        child = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env={**os.environ, "FACTORY_CODE_VERSION": "test"})
        try:
            deadline = time.monotonic() + 60
            while not marker.exists():
                assert child.poll() is None, child.communicate()[1][-3000:]
                assert time.monotonic() < deadline, f"child never reached the point that writes {marker.name}"
                time.sleep(0.05)
            child.send_signal(signal.SIGKILL)
            out, _ = child.communicate(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
        assert child.returncode == -signal.SIGKILL
        return out

    return kill
