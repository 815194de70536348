"""Runs tests/kernels/interpreted — the Triton kernels against their PyTorch references — in a
pytest process of its own with TRITON_INTERPRET=1 (Triton reads it when it is imported, and this
process has imported it without), so they run on CPU tensors in Triton's interpreter.

Runs on CPU; about 15 s, most of it starting the process. The same kernels compiled for a GPU
are checked by bench/gpu_check.sh when one is available.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.slow
def test_triton_kernels_match_their_references_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "interpreted")],
                          cwd=HERE.parents[1], env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= 4 and "skipped" not in out, out[-3000:]
