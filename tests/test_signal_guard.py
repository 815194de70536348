"""A test that leaves SIGTERM and SIGINT ignored does not hand that to the tests after it, nor to
the processes they start (tests/signal_guard.py). A real inner pytest session (pytester, in a
subprocess) with the guard as its conftest: its first test ignores both signals, its second checks
the handlers and starts a child that reports its own dispositions. Check tier, ~2 s."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent

INNER = """
import signal, subprocess, sys

def test_a_leaks_ignored_signals():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

def test_b_gets_them_back_and_so_do_its_children():
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    child = subprocess.run([sys.executable, "-c", "import signal; print(int(signal.getsignal(signal.SIGTERM)))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert child == str(int(signal.SIG_DFL)), child  # not SIG_IGN
"""


def test_a_leaked_signal_disposition_ends_with_its_test(pytester):
    # the inner session starts from Python's defaults, whatever its parent (an xdist worker) ignores
    pytester.makeconftest(f"import signal, sys\nsys.path.insert(0, {str(TESTS)!r})\n"
                          "from signal_guard import pytest_runtest_protocol  # noqa: F401\n"
                          "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
                          "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n")
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_without_the_guard_the_leak_reaches_the_next_test(pytester):
    """The inner tests do detect a leak: with no guard, the second one fails."""
    pytester.makeconftest("import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
                          "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n")
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
