"""Shared by the sandbox tests: run a script as `nobody`, to exercise the non-root host path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"


@pytest.fixture
def as_nobody():
    """`as_nobody(code)` -> CompletedProcess: `code` run by the system Python as uid 65534 (setpriv),
    importing this checkout, as a non-root machine would. Needs root, setpriv and a system Python of
    this minor version; skips when the checkout or venv is not readable by nobody."""
    if os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON) or shutil.which("setpriv") is None:
        pytest.skip("simulates a non-root machine: needs root, setpriv and a system python of this minor version")

    def run(code: str) -> subprocess.CompletedProcess:
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{sysconfig.get_paths()['purelib']}:{REPO}"}
        user = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
        done = subprocess.run([*user, SYSTEM_PYTHON, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                              text=True)
        if done.returncode != 0 and "Permission denied" in done.stderr:
            pytest.skip(f"the checkout or venv is not readable by nobody: {done.stderr[-300:]}")
        return done

    return run
