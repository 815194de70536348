"""Run a built environment's tests in the sandbox, with a per-test report: `run_tests`.

Design: every run gets a fresh writable copy of the environment's sources at /repo (so a test that
writes into its checkout, an overlay or a patch never touches the stored environment), the venv
read-only at /env, the report plugin read-only at /factory-report and an empty writable /out for the
report. The runner is pytest with `-p factory_report` (factory/envs/inside/), or the unittest runner
beside it; both write one JSON line per test as it ends and, at the very end, a record holding a nonce
made for this run. `TestReport.completed` is true only when that record arrived with the right nonce,
which is how the builder's test phase, task validation and rewards tell "the tests ran to their end"
from "the process exited 0" (factory's rule for every check that scores code).

Applying a candidate is host work on the copy: `overlay` replaces whole files, `patch` is a unified
diff applied with `patch -p1` (a patch that does not apply raises `PatchError`, which scorers record
as the candidate's error). Nothing here executes repository code on the host.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from factory.envs.environment import REPO_PATH, VENV_PATH, CaseOutcome, Environment, Runner, TestCase, TestReport
from factory.sandbox import Mount, Sandbox, SandboxConfig

INSIDE = Path(__file__).with_name("inside")
OUTPUT_TAIL = 4000  # characters of stdout+stderr kept on the report


class PatchError(ValueError):
    """A patch or overlay could not be applied to the sources (names the file and patch's words)."""


def test_sandbox_config(timeout_s: float = 120.0, workers: int = 1, memory_mb: int = 4096) -> SandboxConfig:
    """Limits for one test run: a suite may take minutes, write files and spawn a few processes."""
    # 256 processes: RLIMIT_NPROC counts threads too, and thread-pool tests start dozens
    return SandboxConfig(timeout_s=timeout_s, cpu_s=max(int(timeout_s), 1), memory_mb=memory_mb, max_processes=256,
                         max_file_mb=64, tmp_mb=256, tmp_files=32768, max_output_bytes=16384, workers=workers)


test_sandbox_config.__test__ = False  # a factory function, not a pytest test


def run_tests(env: Environment, sandbox: Sandbox, *, test_ids: Sequence[str] | None = None,
              overlay: Mapping[str, str] | None = None, patch: str | None = None) -> TestReport:
    """Run `test_ids` (default: the environment's whole suite) on a fresh copy of its sources, with
    `overlay` ({relative path: full text}) and then `patch` applied, in `sandbox`."""
    scratch = Path(tempfile.mkdtemp(prefix="factory-tests-"))
    try:
        repo, out = scratch / "repo", scratch / "out"
        shutil.copytree(env.src_dir, repo, symlinks=True)
        apply_changes(repo, overlay=overlay, patch=patch)
        out.mkdir()
        open_to_sandbox(scratch)
        nonce = secrets.token_hex(16)
        report = out / "report.jsonl"
        mounts = (Mount(host=str(env.venv_dir), path=VENV_PATH), Mount(host=str(repo), path=REPO_PATH, writable=True, owned=True),
                  Mount(host=str(INSIDE), path="/factory-report"), Mount(host=str(out), path="/out", writable=True))
        variables = {"FACTORY_REPORT_PATH": "/out/report.jsonl", "FACTORY_REPORT_NONCE": nonce,
                     "PYTHONPATH": "/factory-report", "PATH": f"{VENV_PATH}/bin:/usr/local/bin:/usr/bin:/bin",
                     "VIRTUAL_ENV": VENV_PATH}
        started = time.monotonic()
        result = sandbox.run(_program(env, test_ids), mounts=mounts, env=variables, cwd=REPO_PATH)
        duration = time.monotonic() - started
        return _read_report(report, nonce, result, duration)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def apply_changes(repo: Path, *, overlay: Mapping[str, str] | None = None, patch: str | None = None) -> None:
    """Write `overlay`'s files into `repo`, then apply `patch` (unified diff, -p1) with `patch`."""
    for relative, text in (overlay or {}).items():
        target = (repo / relative).resolve()
        if not target.is_relative_to(repo.resolve()):
            raise PatchError(f"overlay path {relative!r} leaves the repository")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    if patch:
        done = subprocess.run(["patch", "-p1", "--batch", "--forward", "--silent", "--no-backup-if-mismatch",
                               "-r", "-", "-d", str(repo)], input=patch, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise PatchError(f"patch does not apply: {(done.stdout + done.stderr).strip()[:500]}")


def _program(env: Environment, test_ids: Sequence[str] | None) -> str:
    """The sandbox's main program: exec the runner, so its exit status is the run's."""
    python = f"{VENV_PATH}/bin/python"
    if env.runner is Runner.UNITTEST:
        args = ["/factory-report/factory_unittest.py", *env.test_options, *env.test_args]
        args += ["--ids", *test_ids] if test_ids else []
    else:
        args = ["-m", "pytest", "-p", "factory_report", "-p", "no:cacheprovider", "-q", "--rootdir", REPO_PATH,
                *env.test_options, *(test_ids if test_ids else env.test_args)]
    return f"import os\nos.execv({python!r}, {[python, *args]!r})\n"


def _read_report(path: Path, nonce: str, result, duration: float) -> TestReport:
    cases: dict[str, TestCase] = {}
    errors: list[str] = []
    completed = False
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill mid-write
        if not isinstance(record, dict):
            continue
        if record.get("end"):
            completed = record.get("nonce") == nonce
        elif "collection_error" in record:
            errors.append(f"{record['collection_error']}: {str(record.get('message', ''))[-500:]}")
        elif "test_id" in record:
            try:
                outcome = CaseOutcome(record.get("outcome"))
            except ValueError:
                outcome = CaseOutcome.ERROR
            cases[str(record["test_id"])] = TestCase(
                test_id=str(record["test_id"]), outcome=outcome, duration_s=float(record.get("duration_s") or 0.0),
                message=str(record.get("message", ""))[-500:])
    tail = (result.stdout + "\n" + result.stderr)[-OUTPUT_TAIL:]
    return TestReport(completed=completed, exec_outcome=result.outcome.value, exec_reason=result.reason,
                      cases=tuple(cases.values()), collection_errors=tuple(errors), duration_s=duration,
                      output_tail=tail)


def open_to_sandbox(root: Path) -> None:
    """Make the scratch tree readable and writable by the sandbox's unprivileged uid."""
    for directory, dirnames, filenames in os.walk(root):
        os.chmod(directory, 0o777)
        for name in filenames:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                mode = os.stat(path).st_mode
                os.chmod(path, 0o777 if mode & 0o111 else 0o666)
