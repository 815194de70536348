"""Scoring one candidate on one task: `score_candidate(task, candidate, sandbox) -> AttemptOutcome`.

The candidate is applied on the host to a fresh copy of the environment's sources (no repository
code runs on the host), then the task's FAIL_TO_PASS + PASS_TO_PASS tests run in the sandbox
(factory.envs.testrun.run_tests), in sorted id order: the order the derivation's broken run and
its reference check used, since some suites' tests depend on the ones before them. Reward 1.0 only when the run reached its end (the report's nonce
record, `TestReport.completed`) and every one of those tests passed; the exit status is never read.

Candidates (a surrounding ``` fence is removed first):
- function_completion: the function's body, or the whole function (one `def` of the target's name);
  spliced into the broken file by factory.tasks.completion.splice. A candidate that does not parse
  or changes code outside the function is `error`.
- bug_fixing: a unified diff (a/ b/ paths, `patch -p1`) applied to the broken tree. It must be a
  plain unified diff that touches only the task's file: a patch that edits the tests would pass them,
  and `patch` would also run ed scripts or read other formats, so anything else is `error` before
  `patch` sees it; one that does not apply is `error` too.

Before anything runs, the candidate's file is compared with the original file (guard.py): a
candidate that newly imports a module or reaches for process control, frames, the module table or
the builtins is `error`, since it would run inside the test process and could score by tampering.

Outcomes: passed; failed (a test failed, errored, was skipped or missing, or the run stopped early
without a limit); timeout (wall clock or CPU limit: a candidate that loops forever); sandbox_limit
(memory, file size, a signal); error (above). This runs inside Ray workers: a module-level function
of picklable arguments, loading the environment by the task's `env_root` (cached per process).
"""

from __future__ import annotations

import functools
import re

from factory.envs.environment import Environment, TestReport
from factory.envs.testrun import PatchError, apply_changes, run_tests
from factory.tasks.completion import CandidateError, splice
from factory.tasks.guard import tampering
from factory.tasks.model import AttemptOutcome, Task, Verdict

HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
FENCE = re.compile(r"^\s*```[\w+-]*\s*\n(.*?)\n?```\s*$", re.S)


def score_candidate(task: Task, candidate: str, sandbox, env: Environment | None = None) -> AttemptOutcome:
    """Apply `candidate` to `task`'s broken repository, run its tests in `sandbox`, and judge."""
    env = env or _environment(task.env_root)
    if env.digest != task.env_digest:
        raise ValueError(f"task {task.task_id}: the environment at {task.env_root} has digest {env.digest[:12]}, "
                         f"the task was derived from {task.env_digest[:12]}")
    text = unfence(candidate)
    overlay, patch = dict(task.broken_overlay), None
    try:
        if task.kind == "function_completion":
            overlay[task.file] = splice(task.broken_overlay[task.file], task.target, text)
            after = overlay[task.file]
            before = splice(task.broken_overlay[task.file], task.target, task.reference)  # the original file
        else:
            check_patch(text, task.file)
            patch = text if text.endswith("\n") else text + "\n"
            broken = task.broken_overlay.get(task.file) or (env.src_dir / task.file).read_text()
            after = _patched(broken, task.file, patch)
            before = _patched(broken, task.file, task.reference if task.reference.endswith("\n")
                              else task.reference + "\n")  # the original file
        why = tampering(before, after)
        if why:
            return AttemptOutcome(task_id=task.task_id, outcome=Verdict.ERROR, reward=0.0, detail=why)
        report = run_tests(env, sandbox, test_ids=sorted(task.tests), overlay=overlay, patch=patch)
    except (CandidateError, PatchError) as e:
        return AttemptOutcome(task_id=task.task_id, outcome=Verdict.ERROR, reward=0.0, detail=str(e)[:1000])
    return judge(task, report)


def judge(task: Task, report: TestReport) -> AttemptOutcome:
    """The outcome of a finished run of `task`'s tests (see the module docstring)."""
    failing = tuple(t for t in task.tests if t not in report.passed())
    if report.completed:
        if report.all_passed(task.tests):
            return AttemptOutcome(task_id=task.task_id, outcome=Verdict.PASSED, reward=1.0,
                                  detail=f"{len(task.tests)} tests passed", duration_s=report.duration_s)
        detail = f"{len(failing)} of {len(task.tests)} tests did not pass: {', '.join(failing[:10])}"
        return AttemptOutcome(task_id=task.task_id, outcome=Verdict.FAILED, reward=0.0, detail=detail,
                              failing=failing, duration_s=report.duration_s)
    if report.exec_outcome == "timeout":
        verdict = Verdict.TIMEOUT
    elif report.exec_outcome in ("oom", "crashed") or "file-size" in report.exec_reason:
        verdict = Verdict.SANDBOX_LIMIT
    else:
        verdict = Verdict.FAILED
    detail = f"the run did not reach its end ({report.exec_outcome}: {report.exec_reason})"
    return AttemptOutcome(task_id=task.task_id, outcome=verdict, reward=0.0, detail=detail, failing=failing,
                          duration_s=report.duration_s)


def _patched(text: str, file: str, patch: str) -> str:
    """`text` (the task's file) with `patch` applied, on a scratch copy of that one file."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="factory-guard-") as scratch:
        root = Path(scratch)
        (root / file).parent.mkdir(parents=True, exist_ok=True)
        (root / file).write_text(text)
        apply_changes(root, patch=patch)
        return (root / file).read_text()


def unfence(candidate: str) -> str:
    """The candidate without one surrounding Markdown code fence (models often add one)."""
    match = FENCE.match(candidate)
    return match.group(1) if match else candidate


def check_patch(patch: str, file: str) -> None:
    """Raise CandidateError unless `patch` is a plain unified diff, with hunks, of `file` only."""
    lines = patch.splitlines()
    touched: set[str] = set()
    hunks = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- "):
            if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
                raise CandidateError(f"patch line {i + 1}: '---' header without a '+++' line")
            touched |= {_strip_p1(line[4:]), _strip_p1(lines[i + 1][4:])}
            i += 2
        elif line.startswith("@@"):
            match = HUNK.match(line)
            if not match or not touched:
                raise CandidateError(f"patch line {i + 1}: malformed hunk header {line[:80]!r}")
            old, new = (int(g) if g is not None else 1 for g in match.groups())
            hunks, i = hunks + 1, i + 1
            while (old > 0 or new > 0) and i < len(lines):
                tag = lines[i][:1]
                if tag in (" ", ""):
                    old, new = old - 1, new - 1
                elif tag == "-":
                    old -= 1
                elif tag == "+":
                    new -= 1
                elif tag != "\\":
                    raise CandidateError(f"patch line {i + 1}: not a hunk line: {lines[i][:80]!r}")
                i += 1
            if old > 0 or new > 0:
                raise CandidateError("patch ends inside a hunk (fewer lines than its header says)")
        elif line.startswith(("diff --git ", "index ", "\\")) or not line.strip():
            i += 1
        else:
            raise CandidateError(f"patch line {i + 1} is not part of a unified diff: {line[:80]!r}")
    if not hunks:
        raise CandidateError("patch has no hunks")
    if touched != {file}:
        others = sorted(str(t) for t in touched - {file})
        raise CandidateError(f"patch must change only {file}; it names {others}")


def _strip_p1(header: str) -> str | None:
    path = header.split("\t")[0].strip()
    return path.split("/", 1)[1] if "/" in path and path != "/dev/null" else None


@functools.lru_cache(maxsize=64)
def _environment(root: str) -> Environment:
    return Environment.load(root)
