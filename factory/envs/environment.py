"""What a built repository environment is, and what running its tests came to.

An `Environment` is content-addressed: `digest` is the sha256 of its venv tree, its source tree
and its lock, and it lives at `$FACTORY_HOME/envs/<digest>/` with `venv/` (the interpreter
environment, built inside the sandbox at `/env`, so its shebangs and editable-install finders name
the same paths on every host), `src/` (the repository after the build: mounted at `/repo`, a
writable copy per run), `lock.json` (every wheel by name, version and sha256) and `env.json` (this
record). Everything that runs a repository's tests, the builder's test phase, task derivation and
the task engine, goes through `factory.envs.testrun.run_tests` with one of these.

A `TestReport` trusts no exit status: `completed` is true only when the report plugin inside the
run wrote its end-of-session record carrying the run's nonce, so a program that exits 0 early, or
writes a report of its own, does not pass.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

VENV_PATH = "/env"  # where an environment's venv is mounted inside the sandbox
REPO_PATH = "/repo"  # where its sources are mounted (a writable copy)


class Runner(str, Enum):
    """Which test runner the test command uses (how per-test outcomes are collected)."""

    PYTEST = "pytest"
    UNITTEST = "unittest"


class Environment(BaseModel):
    """A built, content-addressed repository environment (see the module docstring for the layout)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    repo: str = Field(description="Repository name from the sources config (e.g. 'six').")
    revision: str = Field(description="What was built: the sdist version, the git commit, or 'local-<source digest>'.")
    digest: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the venv tree, the source tree and the lock.")
    root: str = Field(description="Host directory holding venv/, src/, lock.json and env.json.")
    python: str = Field(description="Interpreter version the venv was made with (major.minor, e.g. '3.11').")
    lock_hash: str = Field(description="sha256 of lock.json.")
    runner: Runner = Field(description="Test runner of the test command.")
    test_args: tuple[str, ...] = Field(
        description="What to run inside /repo when no test ids are given: pytest paths (e.g. ('tests',)), or "
        "unittest discovery arguments (e.g. ('-s', 'tests', '-t', '.')).")
    test_options: tuple[str, ...] = Field(
        default=(), description="Runner options passed on every run, ids or not (e.g. ('-o', 'addopts=')).")
    rule: str = Field(description="Id of the builder rule (or agent) that produced the build recipe.")

    @property
    def venv_dir(self) -> Path:
        return Path(self.root) / "venv"

    @property
    def src_dir(self) -> Path:
        return Path(self.root) / "src"

    def save(self) -> None:
        (Path(self.root) / "env.json").write_text(self.model_dump_json(indent=1) + "\n")

    @classmethod
    def load(cls, root: str | Path) -> "Environment":
        path = Path(root) / "env.json"
        try:
            return cls.model_validate(json.loads(path.read_text()))
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no environment here (env.json missing); build it with `factory envs build`") from None


class CaseOutcome(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"  # an error in setup/teardown or collection of this test
    SKIPPED = "skipped"


class TestCase(BaseModel):
    """One test's result in one run."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    __test__ = False  # not a pytest class

    test_id: str = Field(description="pytest node id relative to /repo (e.g. 'tests/test_x.py::test_y'), or unittest id.")
    outcome: CaseOutcome
    duration_s: float = Field(description="Wall time of the test (seconds).")
    message: str = Field("", description="Last 500 characters of the failure or skip reason.")


class TestReport(BaseModel):
    """What one sandboxed test run came to."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    __test__ = False

    completed: bool = Field(description="The report plugin's end-of-session record with this run's nonce was read.")
    exec_outcome: str = Field(description="The sandbox outcome of the run (factory.sandbox.Outcome value).")
    exec_reason: str = Field(description="The sandbox's reason (e.g. 'wall-clock timeout', 'exit 1').")
    cases: tuple[TestCase, ...] = Field(default=(), description="Per-test results, in run order.")
    collection_errors: tuple[str, ...] = Field(default=(), description="Files or modules that failed to collect (with the error).")
    duration_s: float = Field(description="Wall time of the whole run (seconds).")
    output_tail: str = Field("", description="The last part of stdout+stderr, for failure classification.")

    def outcome_of(self, test_id: str) -> CaseOutcome | None:
        for case in self.cases:
            if case.test_id == test_id:
                return case.outcome
        return None

    def passed(self) -> set[str]:
        """Ids of the tests that passed; empty unless the run completed."""
        if not self.completed:
            return set()
        return {c.test_id for c in self.cases if c.outcome is CaseOutcome.PASSED}

    def all_passed(self, test_ids) -> bool:
        """True only when the run completed and every one of `test_ids` ran and passed."""
        ids = set(test_ids)
        return self.completed and bool(ids) and ids <= self.passed()
