"""Run the demo's commands one after another: our progress on the terminal, the rest in a log file.

Each `Step` is one command line (the `dagster` CLI, or `factory`) run as a child process in the
checkout, with stderr merged into stdout so the log keeps the order things happened in. Every
line goes to the log file; a line reaches the terminal only when it is ours:

- a Dagster log line (`<time> - dagster - <LEVEL> - <job> - <run id> - <step> - <message>`) that
  an asset wrote through `context.log`: the factory's progress (`kept 1657/1695`, `step 40/120
  loss 6.73`). Dagster's own events carry the process id before the step (`- 12861 - mix -
  STEP_START - ...`), and `[pipes]` messages are its plumbing: both stay in the log.
- nothing else: Python warnings (Dagster's "use dg launch", vLLM's, torch's), vLLM's and Spark's
  own loggers, progress bars, the rich tables of `factory` commands.

Why not raise log levels instead: most of that output comes from libraries inside the runs'
processes (vLLM, Spark's JVM, py4j), each with its own switch; sorting lines by their shape works
for all of them, and nothing is lost, only moved to the log. A step that exits non-zero stops the
demo: `StepFailed` carries the step, its exit code and its last lines, for the caller to print.

A `Session` runs the steps of one program (the `dagster` CLI) in one long-lived child instead of a
process each; its steps are sorted, timed and failed the same way.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

# `2026-12-01 14:09:24 +0000 - dagster - INFO - demo_job - <run id> - <rest>`
DAGSTER_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} - dagster - (?P<level>[A-Z]+) - \S+ - "
                          r"[0-9a-f]{8}-[0-9a-f-]{27} - (?P<rest>.*)$")
FRAMEWORK_EVENT = re.compile(r"^\d+ - ")  # Dagster's own events name the process before the step
TAIL_LINES = 25
INDENT = "   "


@dataclass(frozen=True)
class Step:
    """One phase of the demo: what it is called on the terminal and the command it runs."""

    name: str
    argv: list[str]


@dataclass
class StepResult:
    step: Step
    seconds: float
    lines: list[str] = field(default_factory=list)  # everything it printed, for the caller to parse


class StepFailed(RuntimeError):
    def __init__(self, step: Step, code: int, seconds: float, tail: list[str]):
        super().__init__(f"{step.name} exited {code}")
        self.step, self.code, self.seconds, self.tail = step, code, seconds, tail


def ours(line: str) -> str | None:
    """The terminal's version of an output line (the message alone), or None for the log only."""
    match = DAGSTER_LINE.match(line)
    if match is None:
        return None
    rest = match["rest"]
    if FRAMEWORK_EVENT.match(rest):
        return None
    _, _, message = rest.partition(" - ")
    if not message or message.startswith("[pipes]"):
        return None
    level = match["level"]
    if level == "INFO":
        return message
    return f"{level.lower()}: {message}" if level in ("WARNING", "ERROR", "CRITICAL") else None


class Session:
    """One child process that runs several steps' commands, one after another, instead of a process
    each: `argv` starts it (`jobs/cli_session.py`, which runs `dagster` commands); a step whose
    command starts with `prefix` (the `dagster` program) is sent to it as the JSON list of the rest,
    and the session ends each command with a line `<marker> <exit status>`. Started on first use,
    ended by `close` (or when a step finds it gone: that step fails with its exit status)."""

    def __init__(self, argv: list[str], prefix: list[str]):
        self.argv, self.prefix = argv, prefix
        self.marker = f"==== session {uuid.uuid4().hex} exit"  # no command prints this line
        self.child: subprocess.Popen | None = None

    def runs(self, step: Step) -> bool:
        return step.argv[:len(self.prefix)] == self.prefix

    def run(self, step: Step, *, cwd: Path, env: dict[str, str], take: Callable[[str], None]) -> int:
        """Run `step` in the session, each line it prints to `take`; its exit status."""
        if self.child is None:
            self.child = _start(step, [*self.argv, self.marker], cwd=cwd, env=env, stdin=subprocess.PIPE)
        try:
            self.child.stdin.write(json.dumps(step.argv[len(self.prefix):]) + "\n")
            self.child.stdin.flush()
        except BrokenPipeError:  # the session died in an earlier step: its output says why
            pass
        for raw in self.child.stdout:
            if raw.startswith(self.marker):
                return int(raw[len(self.marker):])
            take(raw)
        return self.child.wait() or 1  # it ended without finishing the command

    def close(self, log: IO[str], timeout: float = 120) -> None:
        """End the session (end of its input), its last words to `log`."""
        if self.child is None:
            return
        child, self.child = self.child, None
        try:
            rest, _ = child.communicate(timeout=timeout)
        except (subprocess.TimeoutExpired, BrokenPipeError, ValueError):
            child.kill()
            rest, _ = child.communicate()
        if rest:
            log.write(rest)
            log.flush()


def run_step(step: Step, *, cwd: Path, env: dict[str, str], log: IO[str], out: IO[str],
             session: Session | None = None) -> StepResult:
    """Run `step` (in `session` when it runs that program), every line to `log` and ours to `out`
    (indented); StepFailed when it exits non-zero."""
    log.write(f"\n==== {step.name}: {' '.join(step.argv)}\n")
    log.flush()
    started, lines = time.monotonic(), []

    def take(raw: str) -> None:
        line = raw.rstrip("\n")
        log.write(raw if raw.endswith("\n") else raw + "\n")
        log.flush()  # `tail -f` on the log follows a long phase as it runs
        lines.append(line)
        if (shown := ours(line)) is not None:
            out.write(f"{INDENT}{shown}\n")
            out.flush()

    if session is not None and session.runs(step):
        code = session.run(step, cwd=cwd, env=env, take=take)
    else:
        with _start(step, step.argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL) as child:
            for raw in child.stdout:
                take(raw)
            code = child.wait()
    seconds = time.monotonic() - started
    if code != 0:
        raise StepFailed(step, code, seconds, lines[-TAIL_LINES:])
    return StepResult(step, seconds, lines)


def _start(step: Step, argv: list[str], *, cwd: Path, env: dict[str, str], stdin) -> subprocess.Popen:
    """The child running `argv` for `step`, stdout and stderr merged into one text pipe."""
    try:
        return subprocess.Popen(argv, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", bufsize=1)
    except OSError as e:  # a missing executable is this step's failure, not a traceback
        raise StepFailed(step, 127, 0.0, [f"cannot start {argv[0]}: {e}"]) from None


def duration(seconds: float) -> str:
    """`8s`, `1m12s`, `1h02m`: short enough to line up in a column."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
