"""The records of task derivation and scoring: `Task`, `Difficulty`, `DeriveConfig`, `TaskSet`,
`AttemptOutcome`.

A task is a broken copy of one file of a built environment (`broken_overlay`), the tests that the
break makes fail (`fail_to_pass`) and those it leaves passing (`pass_to_pass`), what a model sees
(`prompt`) and what undoes the break (`reference`). Two kinds:

- function_completion: a covered function's body is replaced by `raise NotImplementedError`; the
  reference is the original body text (indented as in the file), and a candidate is a body or the
  whole function (factory.tasks.score);
- bug_fixing: a seeded AST mutation (factory.tasks.mutation) is applied; the reference is the inverse
  patch, a unified diff with a/ b/ paths that `patch -p1` and `git apply` accept, and a candidate is
  such a diff touching only the task's file.

Why a content hash for `task_id`: the same environment, file, target and mutation give the same id on
every derivation, so re-deriving replaces rows instead of adding duplicates, and the task engine's
attempt keys (task id + candidate) stay stable across runs.
"""

from __future__ import annotations

import hashlib
from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from factory.version import canonical_json

TaskKind = Literal["function_completion", "bug_fixing"]
KINDS: tuple[str, ...] = ("function_completion", "bug_fixing")


class Difficulty(BaseModel):
    """Signals of how hard a task is (for curricula and for slicing eval scores)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lines_removed: int = Field(description="Lines of the original the break removes or changes (lines).")
    tests_covering: int = Field(description="FAIL_TO_PASS tests: how many tests notice the break (tests).")
    test_files: int = Field(description="Test files that mention the target and were run (files).")
    complexity: int = Field(description="Cyclomatic-ish count of the target function: 1 + branches, loops, "
                            "handlers, boolean operands and comprehension ifs (count).")
    operator: str = Field(description="'remove_body' for completion, else the mutation operator "
                          "(compare_flip, off_by_one, drop_branch, bool_swap).")


class Task(BaseModel):
    """One validated task (see the module docstring for the two kinds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str = Field(pattern=r"^[0-9a-f]{24}$", description="Content hash of kind, env digest, file, target and mutation (24 hex).")
    kind: TaskKind = Field(description="function_completion or bug_fixing.")
    repo: str = Field(description="Repository name of the environment.")
    revision: str = Field(description="Revision of the environment (sdist version, commit, local-<digest>).")
    env_digest: str = Field(pattern=r"^[0-9a-f]{64}$", description="Digest of the environment the task runs in.")
    env_root: str = Field(description="Host directory of the environment when the task was derived.")
    file: str = Field(description="Path of the broken file, relative to the repository root (POSIX).")
    target: str = Field(description="Qualified name of the function (e.g. 'Stack.push', 'parse').")
    mutation: str = Field(description="'' for completion; for bug fixing the mutation, e.g. 'compare_flip L12:8 < -> >='.")
    prompt: str = Field(description="What a model sees: instructions and the broken file (and, for bugs, the failing tests).")
    broken_overlay: dict[str, str] = Field(description="{file: full text of the broken file}: applied to the environment's sources.")
    reference: str = Field(description="The original body (completion) or the inverse unified diff (bug fixing).")
    fail_to_pass: tuple[str, ...] = Field(min_length=1, description="Test ids that fail broken and pass with the reference.")
    pass_to_pass: tuple[str, ...] = Field(description="Test ids that pass both broken and fixed.")
    difficulty: Difficulty
    seed: int = Field(description="Derivation seed the candidate order came from.")
    reference_s: float = Field(0.0, ge=0, description="Wall time of the reference's validation run (seconds): "
                               "a scale for an attempt's time limit.")

    @property
    def tests(self) -> tuple[str, ...]:
        """Every test a candidate is scored on: FAIL_TO_PASS then PASS_TO_PASS."""
        return self.fail_to_pass + self.pass_to_pass


def task_id_of(kind: str, env_digest: str, file: str, target: str, mutation: str) -> str:
    return hashlib.sha256(canonical_json([kind, env_digest, file, target, mutation]).encode()).hexdigest()[:24]


class DeriveConfig(BaseModel):
    """How many tasks to derive from one environment, and how."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tasks: int = Field(20, ge=1, description="Tasks kept per environment at most (tasks).")
    max_candidates: int = Field(60, ge=1, description="Candidates tried per environment at most; each costs two "
                                "sandboxed test runs, the broken run and the reference check (candidates).")
    seed: int = Field(0, description="Seed of the candidate order and of the mutation choices.")
    per_function: int = Field(1, ge=1, description="Bug-fixing tasks per function at most (tasks).")
    min_body_lines: int = Field(1, ge=1, description="Completion: functions whose body (docstring excluded) is shorter "
                                "are skipped (lines).")
    max_body_lines: int = Field(80, ge=1, description="Completion: functions whose body is longer are skipped (lines).")
    operators: tuple[str, ...] = Field(("compare_flip", "off_by_one", "drop_branch", "bool_swap"),
                                       description="Bug fixing: mutation operators to draw from.")
    benchmarks: tuple[str, ...] = Field(("humaneval",), description="Eval sets tasks are decontaminated against.")
    ngram: int = Field(13, ge=4, description="Decontamination n-gram length (normalized word tokens).")
    timeout_s: float = Field(120.0, gt=0, description="Wall-clock limit of one sandboxed test run during derivation (seconds).")


class TaskSet(BaseModel):
    """What one derivation came to: the kept tasks and the counts behind them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: TaskKind
    repo: str
    revision: str
    env_digest: str
    tasks: tuple[Task, ...]
    candidates: int = Field(description="Candidates tried (each one broken run) (count).")
    rejected: dict[str, int] = Field(default_factory=dict, description="Candidates dropped, by reason (count).")
    contaminated: dict[str, str] = Field(default_factory=dict, description="{target: the eval item it overlaps} of "
                                         "candidates dropped by decontamination.")
    baseline_passed: int = Field(0, description="Tests passing on the unbroken repository (tests).")
    decontam: str = Field("", description="What tasks were checked against, e.g. 'humaneval@<hash> 13-gram+body'.")


class Verdict(str, Enum):
    """How one scored attempt ended (reward 1.0 only for passed)."""

    PASSED = "passed"            # the run completed and every FAIL_TO_PASS + PASS_TO_PASS test passed
    FAILED = "failed"            # some test failed, errored, was skipped or missing, or the run stopped early
    TIMEOUT = "timeout"          # the sandbox's wall clock or CPU limit ended the run
    ERROR = "error"              # the candidate does not parse, or its patch does not apply / touches other files
    SANDBOX_LIMIT = "sandbox_limit"  # memory, file size, processes, or a signal ended the run


class AttemptOutcome(BaseModel):
    """What scoring one candidate came to (picklable: returned from Ray workers)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    outcome: Verdict
    reward: float = Field(description="1.0 when outcome is passed, else 0.0.")
    detail: str = Field("", description="Why, in words: the failing tests, the parse error, the sandbox's reason.")
    failing: tuple[str, ...] = Field((), description="Scored tests that did not pass (ids).")
    duration_s: float = Field(0.0, description="Wall time of the sandboxed run (seconds); 0 when none ran.")
