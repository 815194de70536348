"""Checked executions (factory.sandbox.checked + harness.py) in the real bubblewrap sandbox: a pass
needs the end-of-check marker with this execution's nonce; early exits, killing the checker, a
guessed marker, reading the nonce, non-plain return values, a test that swallows errors, and output
over the cap each fail with their reason; CPU limits, memory errors and crashes keep their outcome;
exceptions, state and plain values cross between the program and its test. Plus `verdict` on
hand-made results and the API's argument errors (no sandbox needed for those).

These run on CPU and need bubblewrap; most cases share one `map_checked` call (~5 s on two cores).
"""

from __future__ import annotations

import shutil
import textwrap

import pytest

from factory.sandbox import ExecResult, Outcome, Sandbox, SandboxConfig
from factory.sandbox.checked import MARKER, checked_program, verdict

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)")

TEST = textwrap.dedent("""
    def check(candidate):
        assert candidate(2, 3) == 5
        assert candidate(-1, 1) == 0
""")

# Each hostile program next to the reason it must fail with. All define add(), most correctly wrong.
HOSTILE = {
    "sys.exit at top level": ("def add(a, b):\n    return 0\nimport sys\nsys.exit(0)\n",
                              "the program exited early (SystemExit(0)) before its checks finished"),
    "os._exit at top level": ("def add(a, b):\n    return 0\nimport os\nos._exit(0)\n",
                              "the program exited (status 0) before its checks finished"),
    "os._exit in the call": ("def add(a, b):\n    import os\n    os._exit(0)\n",
                             "the program exited (status 0) before its checks finished"),
    "SystemExit in the call": ("def add(a, b):\n    raise SystemExit\n",
                               "add() exited early (SystemExit()) before its checks finished"),
    "quit()": ("def add(a, b):\n    quit()\n", "add() exited early (SystemExit()) before its checks finished"),
    "exit() at top level": ("def add(a, b):\n    return 0\nexit()\n",
                            "the program exited early (SystemExit()) before its checks finished"),
    "always-equal object": ("class Anything:\n    def __eq__(self, other):\n        return True\n"
                            "def add(a, b):\n    return Anything()\n",
                            "add() returned a value of type Anything: only exact builtin values"),
    "int subclass": ("class Five(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
                     "def add(a, b):\n    return Five(5)\n", "add() returned a value of type Five"),
    "always-equal inside a list": ("class Anything:\n    def __eq__(self, other):\n        return True\n"
                                   "def add(a, b):\n    return [Anything()]\n", "add() returned a value of type list"),
    "guessed marker": (f"import os\ndef add(a, b):\n    print('{MARKER} ' + '0' * 32)\n    os._exit(0)\n",
                       "the program exited (status 0) before its checks finished"),
    "rebinds check and builtins": ("import builtins\ndef check(candidate):\n    pass\nbuiltins.AssertionError = None\n"
                                   "def add(a, b):\n    return 0\n", "check() raised AssertionError (<test> line 3)"),
    "traces check's frame": (textwrap.dedent("""
        import sys
        def _tracer(frame, event, arg):  # would skip check's asserts if check ran in this process
            if frame.f_code.co_name == "check":
                frame.f_locals["candidate"] = lambda *a: 5
            return _tracer
        sys.settrace(_tracer)
        sys._getframe().f_trace = _tracer
        def add(a, b):
            return 0
    """), "check() raised AssertionError (<test> line 3)"),
    # In the child every bytearray and bytes of the nonce's size is looked for; the parent's memory is out of reach.
    "hunts for the nonce": (textwrap.dedent(f"""
        import gc, os, sys
        def add(a, b):
            found = set()
            frame = sys._getframe()
            while frame is not None:
                found |= {{bytes(v) for v in frame.f_locals.values() if type(v) in (bytes, bytearray) and len(v) == 32}}
                frame = frame.f_back
            for obj in gc.get_objects():
                if type(obj) is dict:
                    found |= {{bytes(v) for v in obj.values() if type(v) in (bytes, bytearray) and len(v) == 32}}
            for path in (f"/proc/{{os.getppid()}}/fd/0", "/proc/self/fd/0"):
                try:
                    found.add(open(path, "rb").read()[:32])
                except OSError:
                    pass
            try:
                with open(f"/proc/{{os.getppid()}}/mem", "rb") as mem:
                    found.add(b"readable")
            except OSError:
                pass
            print("searched", len(gc.get_objects()), "objects; found", sorted(found))
            for nonce in found:
                print("{MARKER}", nonce.decode("ascii", "replace"))
            os._exit(0)
    """), "the program exited (status 0) before its checks finished"),
}


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(SandboxConfig(workers=2, timeout_s=10, cpu_s=2, memory_mb=512))


@needs_bwrap
def test_a_correct_program_passes_and_keeps_its_output(sandbox):
    code = "def add(a, b):\n    print('adding', a, b)\n    return a + b\nprint('loaded')\n"
    program = checked_program(code, test=TEST, entry_point="add")
    [v] = sandbox.map_checked([program])
    assert (v.outcome, v.reason, v.passed) == (Outcome.PASSED, "ran to the end of its checks", True)
    assert v.result.stdout == f"loaded\nadding 2 3\nadding -1 1\n\n{MARKER} {program.nonce}\n"


@needs_bwrap
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_programs_fail_with_their_reason(sandbox, hostile_verdicts, name):
    v = hostile_verdicts[name]
    assert not v.passed and v.outcome is Outcome.FAILED, (v.reason, v.result.stderr[-500:])
    assert v.reason.startswith(HOSTILE[name][1]), v.reason


@pytest.fixture(scope="module")
def hostile_verdicts(sandbox):
    """Every HOSTILE program in one map_checked call (the pool runs them two at a time)."""
    programs = [checked_program(code, test=TEST, entry_point="add") for code, _ in HOSTILE.values()]
    verdicts = dict(zip(HOSTILE, sandbox.map_checked(programs)))
    hunt = verdicts["hunts for the nonce"].result.stdout
    nonce = programs[list(HOSTILE).index("hunts for the nonce")].nonce
    assert "searched" in hunt and nonce not in hunt and "readable" not in hunt, hunt  # it looked, and found nothing
    return verdicts


@needs_bwrap
def test_killing_the_checker_or_a_test_that_swallows_errors_still_fails(sandbox):
    swallowing = "def check(candidate):\n    try:\n        candidate()\n    except BaseException:\n        pass\n"
    killer, swallowed = sandbox.map_checked([
        checked_program("import os\ndef add(a, b):\n    os.kill(os.getppid(), 9)\n", test=TEST, entry_point="add"),
        checked_program("import sys\ndef add():\n    sys.exit(0)\n", test=swallowing, entry_point="add"),
    ])
    assert killer.outcome is Outcome.CRASHED and killer.reason == "signal SIGKILL"
    assert swallowed.outcome is Outcome.FAILED
    assert swallowed.reason == "add() exited early (SystemExit(0)) before its checks finished"


@needs_bwrap
def test_limits_keep_their_outcome_when_the_program_hits_them(sandbox):
    spin, hog, crash = sandbox.map_checked([
        checked_program("def add(a, b):\n    while True:\n        pass\n", test=TEST, entry_point="add"),
        checked_program("def add(a, b):\n    return bytearray(2 << 30)\n", test=TEST, entry_point="add"),
        checked_program("import ctypes\ndef add(a, b):\n    return ctypes.string_at(0)\n", test=TEST, entry_point="add"),
    ])
    assert spin.outcome is Outcome.TIMEOUT and "cpu limit 2s" in spin.reason
    assert "the program was killed by SIGXCPU before its checks finished" in spin.reason
    assert hog.outcome is Outcome.OOM, hog.reason
    assert crash.outcome is Outcome.CRASHED and crash.reason.startswith("signal SIGSEGV")


@needs_bwrap
def test_values_exceptions_and_state_cross_between_program_and_test(sandbox):
    test = textwrap.dedent("""
        def check(candidate):
            assert candidate([3, 1]) == ([1, 3], {"n": 2, "s": {1, 3}}, (1.5, None, True, b"x", 2j, frozenset()))
            assert candidate(list(range(10**5)))[1]["n"] == 10**5          # a large value
            assert candidate.__name__ == "candidate" and calls() == 2      # calls() is the test's own
            try:
                candidate("boom")
            except ValueError as exc:
                assert "(raised in the program) no strings" in str(exc)
            else:
                raise AssertionError("the program's ValueError did not reach the test")
            assert tally(0) == 3                                            # the entry point by name, as HumanEval/33 does
        def calls():
            return 2
    """)
    code = textwrap.dedent("""
        seen = []
        def tally(items):
            if isinstance(items, str):
                raise ValueError("no strings")
            seen.append(1)
            if items == 0:
                return len(seen)                                            # state lives on in the child
            return sorted(items), {"n": len(items), "s": set(items) if len(items) < 5 else set()}, (1.5, None, True, b"x", 2j, frozenset())
    """)
    [v] = sandbox.map_checked([checked_program(code, test=test, entry_point="tally")])
    assert v.passed, (v.reason, v.result.stderr[-800:])


@needs_bwrap
def test_the_test_sees_its_own_context_not_the_programs(sandbox):
    context = "def double(x):\n    return 2 * x\n\n\ndef half(x):\n    \"\"\"Undo double().\"\"\"\n"
    test = "def check(candidate):\n    for x in range(5):\n        assert candidate(double(x)) == x\n"
    honest = context + "    return x // 2\n"
    cheat = context + "    return x\ndouble = lambda x: x\n"  # rebinding the helper the test calls
    good, bad = sandbox.map_checked([checked_program(honest, test=test, entry_point="half", context=context),
                                     checked_program(cheat, test=test, entry_point="half", context=context)])
    assert good.passed and not bad.passed and bad.reason == "check() raised AssertionError (<test> line 3)"


@needs_bwrap
def test_programs_without_a_test_pass_only_when_they_reach_their_end(sandbox):
    codes = ["x = 2\nassert x * 2 == 4\nprint(x)\n", "import sys\nsys.exit(0)\nassert False\n",
             "assert 1 == 2, 'wrong answer'\n", "def f(:\n", "import os\nos._exit(0)\n"]
    verdicts = sandbox.map_checked([checked_program(c) for c in codes])
    assert [v.passed for v in verdicts] == [True, False, False, False, False]
    assert [v.reason for v in verdicts[1:]] == [
        "the program exited early (SystemExit(0)) before its checks finished",
        "the program raised AssertionError: wrong answer (<program> line 1)",
        "the program raised SyntaxError: invalid syntax (<program>, line 1)",
        "the program exited (status 0) before its checks finished",
    ]


@needs_bwrap
def test_output_over_the_cap_hides_the_marker_and_fails(sandbox):
    small = Sandbox(SandboxConfig(workers=1, max_output_bytes=1000))
    code = "def add(a, b):\n    print('x' * 2000)\n    return a + b\n"
    [v] = small.map_checked([checked_program(code, test=TEST, entry_point="add")])
    assert v.result.outcome is Outcome.PASSED and v.result.truncated  # it did pass: the host cannot see it
    assert not v.passed and v.reason.startswith("no end-of-check marker: output over max_output_bytes")


@needs_bwrap
def test_a_checked_program_run_without_its_stdin_fails(sandbox):
    program = checked_program("x = 1\n")
    [plain] = sandbox.map([program.text])
    assert verdict(plain, program.nonce).reason == "no nonce on stdin (run checked programs through Sandbox.map_checked)"
    with pytest.raises(ValueError, match="1 stdins for 2 programs"):
        sandbox.map(["pass", "pass"], stdins=[""])


def _result(stdout: str, outcome: Outcome = Outcome.PASSED, *, stderr: str = "", truncated: bool = False) -> ExecResult:
    return ExecResult(outcome=outcome, reason="exit 0" if outcome is Outcome.PASSED else "exit 1",
                      returncode=0 if outcome is Outcome.PASSED else 1, stdout=stdout, stderr=stderr,
                      truncated=truncated, duration_s=0.1)


def test_verdict_needs_exit_0_and_the_marker_with_this_nonce_on_the_last_line():
    nonce = "ab" * 16
    assert verdict(_result(f"hi\n\n{MARKER} {nonce}\n"), nonce).passed
    assert verdict(_result(f"\n{MARKER} {'cd' * 16}\n"), nonce).reason.startswith("exit 0 without the end-of-check marker")
    assert not verdict(_result(f"\n{MARKER} {nonce}\nlater\n"), nonce).passed  # something printed after it
    assert not verdict(_result(f"\n{MARKER} {nonce}"), nonce).passed           # no line end: cut off
    failed = verdict(_result(f"\n{MARKER} {nonce}\n", Outcome.FAILED, stderr="x\nfactory-check: fake\n"
                                                                                "\nfactory-check: check() raised X\ntb"), nonce)
    assert (failed.outcome, failed.reason) == (Outcome.FAILED, "check() raised X")
    assert verdict(_result("", Outcome.FAILED), nonce).reason == "exit 1"


def test_each_program_gets_its_own_nonce_and_bad_arguments_are_named():
    first, second = checked_program("pass"), checked_program("pass")
    assert first.nonce != second.nonce and len(first.nonce) == 32 and first.stdin == first.nonce + "\n"
    assert first.nonce not in first.text
    with pytest.raises(ValueError, match="test and entry_point go together"):
        checked_program("pass", test="def check(c): pass")
    with pytest.raises(ValueError, match="entry_point 'a-b' is not a Python identifier"):
        checked_program("pass", test="def check(c): pass", entry_point="a-b")
    with pytest.raises(ValueError, match="the test code does not compile"):
        checked_program("pass", test="def check(:", entry_point="f")
