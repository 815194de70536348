"""Servers shared by many tests (one SeaweedFS per session, ...) that die mid-run fail loudly.

A session fixture that starts a server `register`s it under its fixture name. Then:
- a test that asks for that fixture (directly or through its fixtures), or carries the marker it was
  registered with (`rest`), fails at setup, naming the
  server, its PID, its exit code and its log (with the log's tail), instead of waiting on a port
  nobody answers;
- a test that failed while a shared server was down gets the same note added to its report (it
  reached the server some other way: through `request.getfixturevalue`, a child process);
- nothing can hang the suite on a dead server: pytest-timeout (`timeout` in pyproject.toml) ends
  any test that waits past it.

tests/conftest.py imports the fixture and the hook; tests/test_shared_servers.py kills a shared
server in a real inner pytest session and checks the message."""

from __future__ import annotations

import pytest

_SHARED: dict[str, tuple[str, object, str | None]] = {}  # fixture name -> (what, Server, marker)


def register(fixture: str, what: str, server, marker: str | None = None) -> None:
    """`server` (a `Server`: `alive()`, `pid`, `log_path`, `log_tail()`) serves every test that asks
    for `fixture` or carries `marker`, for the rest of the session."""
    _SHARED[fixture] = (what, server, marker)


def unregister(fixture: str) -> None:
    _SHARED.pop(fixture, None)


def _dead(fixture: str) -> str | None:
    what, server, _ = _SHARED[fixture]
    if server.alive():
        return None
    code = server.process.poll() if getattr(server, "process", None) is not None else None
    return (f"{what} (fixture `{fixture}`, pid {server.pid}) is not running (exit code {code}); "
            f"its log is {server.log_path}, which ends:\n{server.log_tail(2000)}")


@pytest.fixture(autouse=True)
def shared_servers_alive(request):
    """Fails a test at setup when a shared server it asks for has died."""
    users = [f for f, (_, _, marker) in _SHARED.items()
             if f in request.fixturenames or (marker and request.node.get_closest_marker(marker))]
    for fixture in users:
        if (why := _dead(fixture)) is not None:
            pytest.fail(why, pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        shown = str(report.longrepr)
        notes = [why for f in list(_SHARED) if (why := _dead(f)) is not None and why.split(";")[0] not in shown]
        if notes:
            report.sections.append(("shared servers down", "\n\n".join(notes)))
