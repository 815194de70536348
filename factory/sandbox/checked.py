"""Checked executions: a sandboxed check passes only when its test code ran to its end.

    from factory.sandbox.checked import checked_program
    program = checked_program(prompt + completion, test=test, entry_point="add", context=prompt)
    [v] = Sandbox(config).map_checked([program])
    v.passed, v.outcome, v.reason  # True, Outcome.PASSED, "ran to the end of its checks"

One rule for HumanEval, the synthetic `sandbox` validator and, later, RL rewards. "Exit status 0" is
not a pass: `sys.exit(0)`, `os._exit(0)`, `raise SystemExit`, `quit()` all exit 0 before a single
assert ran. A pass is exit 0 *and* stdout ending in the line `FACTORY-CHECK-PASSED <nonce>`, which
harness.py writes only after `check()` returned (or, without a test, after the program's last
statement). The nonce is `secrets.token_hex(16)`, fresh per execution, and reaches the sandbox on
stdin, which the harness reads and erases before any untrusted code exists; a guessed marker fails.

Design (harness.py has the details): the untrusted code runs in a child process; the trusted test
(and `context`, the HumanEval prompt whose helpers such as `poly` or `encode_cyclic` the test calls)
run in the parent, which alone holds the nonce and is non-dumpable. The candidate the test sees is a
proxy: each call crosses to the child and back with marshal, so only exact builtin values come back
(int, float, complex, str, bytes, bool, None, and lists, tuples, dicts, sets, frozensets of them).
So nothing the completion does reaches the test's side: it cannot rebind `check`, `assert`,
builtins, `math.fabs` or the prompt's helpers there, an object whose `__eq__` always returns True
(or an `int` subclass) is refused at the boundary, and killing the parent leaves no marker.

What it does not defend against: the sandbox is the boundary for everything below Python. A kernel
exploit, or a way to read the parent's memory that PR_SET_DUMPABLE does not close, could find the
nonce; the sandbox (seccomp, namespaces, an unprivileged uid) bounds what the code can try. Without
a test (the synthetic validator) the child's "done" message is the evidence: a program that writes
that message to the harness's pipe itself can claim it ran to its end, which it could equally get by
asserting nothing, so only early exits are caught there. Costs and limits that follow from the
design: values returned to the test must be plain builtins (a numpy scalar or a `Counter` equal to
the expected dict fails), the candidate gets copies of its arguments (a test that inspects an
argument after the call sees it unchanged; none of HumanEval's does), and stdout is the channel: if
the program printed more than `max_output_bytes`, the marker is cut off and the check fails with
that reason (raise the cap, or print less) rather than passing on output the host never saw. The
harness costs about 5 ms of CPU per execution (compiling it, ctypes for prctl, the fork) on top of
the ~18 ms a bare interpreter takes to run a HumanEval check.
"""

from __future__ import annotations

import functools
import secrets
from dataclasses import dataclass
from pathlib import Path

from factory.sandbox.config import ExecResult, Outcome

MARKER = "FACTORY-CHECK-PASSED"
_HARNESS = Path(__file__).with_name("harness.py")
_TAG = "factory-check:"  # harness.py's reason lines on stderr


@dataclass(frozen=True)
class CheckedProgram:
    """A harness program (`text`) and the `stdin` that carries its `nonce`; run it with `Sandbox.map_checked`."""

    text: str
    stdin: str
    nonce: str


@dataclass(frozen=True)
class CheckVerdict:
    """What a checked execution came to: PASSED only with the marker; `reason` says which rule fired."""

    outcome: Outcome
    reason: str
    result: ExecResult

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASSED


def checked_program(code: str, *, test: str = "", entry_point: str | None = None, context: str = "") -> CheckedProgram:
    """The harness program for one execution of untrusted `code`, with a fresh nonce.

    Without `test`: `code` passes when it runs as `__main__` to its last statement without raising.
    With `test` (trusted, defines `check(candidate)`): `check` is called with `code`'s function
    `entry_point`, after trusted `context` ran in the test's namespace.
    """
    if bool(test) != (entry_point is not None):
        raise ValueError(f"test and entry_point go together (test: {len(test)} chars, entry_point={entry_point!r})")
    if entry_point is not None and not entry_point.isidentifier():
        raise ValueError(f"entry_point {entry_point!r} is not a Python identifier")
    for name, source in (("test", test), ("context", context)):
        try:
            compile(source, f"<{name}>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:  # trusted code that cannot run is our bug, not a failed check
            raise ValueError(f"the {name} code does not compile: {exc}") from exc
    nonce = secrets.token_hex(16)
    call = f"_harness({ascii(code)}, {ascii(test)}, {ascii(entry_point)}, {ascii(context)}, {ascii(MARKER)})\n"
    return CheckedProgram(text=_harness_source() + "\n\n" + call, stdin=nonce + "\n", nonce=nonce)


def verdict(result: ExecResult, nonce: str) -> CheckVerdict:
    """PASSED only for exit 0 with stdout's last line `MARKER nonce`; otherwise the harness's reason."""
    if result.outcome is Outcome.PASSED:
        if result.stdout.endswith(f"\n{MARKER} {nonce}\n"):
            return CheckVerdict(Outcome.PASSED, "ran to the end of its checks", result)
        if result.truncated:
            reason = ("no end-of-check marker: output over max_output_bytes, so it may have been cut off "
                      "(raise the cap or print less)")
        else:
            reason = "exit 0 without the end-of-check marker: the program ended before its checks finished"
        return CheckVerdict(Outcome.FAILED, reason, result)
    told = _harness_reason(result.stderr)
    if result.outcome is Outcome.FAILED:
        return CheckVerdict(result.outcome, told or result.reason, result)
    return CheckVerdict(result.outcome, f"{result.reason}; {told}" if told else result.reason, result)


def _harness_reason(stderr: str) -> str:
    """The harness's last 'factory-check: ...' line on stderr, or ''."""
    at = stderr.rfind(f"\n{_TAG} ")
    if at < 0:
        return ""
    return stderr[at + len(_TAG) + 2:].split("\n", 1)[0].strip()


@functools.cache
def _harness_source() -> str:
    return _HARNESS.read_text(encoding="utf-8")
