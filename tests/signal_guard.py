"""Each test ends with SIGINT and SIGTERM handled as before it (tests/conftest.py imports the hook).

Something a test ran in process once left both ignored (SIG_IGN) in its pytest worker, and every
process the worker started afterwards inherited that: datatrove's pool in the bench test could not
terminate its workers and hung until the suite's timeout, and a sandboxed program's
`multiprocessing.Pool` ran into its wall clock. The handlers are set again even when Python sees
no change, since a library may change a disposition from C."""

from __future__ import annotations

import signal

import pytest

GUARDED = (signal.SIGINT, signal.SIGTERM)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = {number: signal.getsignal(number) for number in GUARDED}
    yield
    for number, handler in before.items():
        if handler is not None:  # None: set from C before Python looked; nothing to restore to
            signal.signal(number, handler)
