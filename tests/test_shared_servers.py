"""A shared server that dies mid-run fails the tests that use it, naming it and its log, and the
suite goes on (tests/shared_servers.py).

A real inner pytest session (pytester, in a subprocess) with a session fixture that starts a
server process (`sleep`, through the factory's own `Server`) and registers it; its second test
kills it. The tests after it that ask for the fixture fail at setup with the server's name, PID,
exit code and log path; a test that reaches it without asking fails with the same note appended;
a test that does not use it passes. Check tier: one `sleep` process, no socket, ~3 s."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent

CONFTEST = """
import sys
from pathlib import Path

import pytest

from factory.deploy.servers import Server
from shared_servers import pytest_runtest_makereport, register, shared_servers_alive, unregister  # noqa: F401

STATE = {}


@pytest.fixture(scope="session")
def sleeper(tmp_path_factory):
    log = tmp_path_factory.mktemp("sleeper") / "sleeper.log"
    log.write_text("sleeper: ready\\n")
    server = Server("sleeper", ["sleep", "600"], log).start()
    STATE["server"] = server
    register("sleeper", "the session's sleeper", server)
    yield server
    unregister("sleeper")
    server.stop()
"""

TEST = """
def test_uses_it(sleeper):
    assert sleeper.alive()

def test_kills_it(sleeper):
    sleeper.process.kill()
    sleeper.process.wait()

def test_uses_it_after(sleeper):
    assert False, "never reached: setup fails first"

def test_reaches_it_another_way():
    from conftest import STATE
    assert STATE["server"].alive(), "the sleeper is gone"

def test_does_not_use_it():
    assert 1 + 1 == 2
"""


def test_a_dead_shared_server_fails_its_users_by_name_and_log(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner=TEST)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=3, failed=1, errors=1)
    out = result.stdout.str()
    assert "ERROR test_inner.py::test_uses_it_after" in out
    assert "the session's sleeper (fixture `sleeper`, pid" in out and "is not running (exit code -9)" in out
    assert "sleeper.log, which ends:" in out and "sleeper: ready" in out
    assert "never reached" not in out
    # the test that reached it without asking fails on its own assertion, with the note beside it
    assert "FAILED test_inner.py::test_reaches_it_another_way" in out
    assert "shared servers down" in out
