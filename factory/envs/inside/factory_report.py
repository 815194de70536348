"""pytest plugin loaded inside the sandbox (`-p factory_report`): one JSON line per test as it ends,
then an end-of-session record carrying the run's nonce.

Not imported by the host. The host gives the report path and a fresh nonce in the environment; both
are read and removed from `os.environ` when pytest loads this plugin, before any test module is
imported, and the nonce is kept only in a closure. A test or a candidate that calls os._exit(0), kills
pytest or writes a report of its own therefore never produces the final record the host checks, so a
run that did not reach its end cannot pass (factory.envs.testrun).
"""

import json
import os
import time


def _make_writer():
    path = os.environ.pop("FACTORY_REPORT_PATH")
    nonce = os.environ.pop("FACTORY_REPORT_NONCE")
    handle = open(path, "a", encoding="utf-8", buffering=1)  # line-buffered: a killed run keeps what ended

    def write(record, final=False):
        if final:
            record = dict(record, nonce=nonce)
        handle.write(json.dumps(record) + "\n")
        if final:
            handle.flush()
            os.fsync(handle.fileno())

    return write


_write = _make_writer()
_calls = {}
_RANK = {"skipped": 0, "passed": 1, "failed": 2}


def pytest_collectreport(report):
    if report.failed:
        _write({"collection_error": report.nodeid or "<session>", "message": str(report.longrepr)[-2000:]})


def pytest_runtest_logreport(report):
    node = report.nodeid
    state = _calls.setdefault(node, {"outcome": None, "duration": 0.0, "message": ""})
    state["duration"] += report.duration
    if report.when == "call":
        if getattr(report, "wasxfail", None) is not None:  # xfailed (skipped-like) or xpassed non-strict
            outcome = "skipped" if report.skipped else "passed"
        else:
            outcome = report.outcome
        # subtests report several calls for one test id: the worst one stands (a failed subtest fails
        # the test, a skipped one does not hide the test's own pass)
        if _RANK.get(outcome, 0) >= _RANK.get(state["outcome"], -1):
            state["outcome"] = outcome
            if report.failed or report.skipped:
                state["message"] = _message(report)
    elif report.failed:  # setup or teardown error
        state["outcome"] = "error"
        state["message"] = _message(report)
    elif report.skipped and state["outcome"] is None:  # skipped in setup (skip marker, skipif)
        state["outcome"] = "skipped"
        state["message"] = _message(report)
    if report.when == "teardown":
        _write({"test_id": node, "outcome": state["outcome"] or "error", "duration_s": round(state["duration"], 6),
                "message": state["message"][-500:]})  # the end names the exception


def pytest_sessionfinish(session, exitstatus):
    _write({"end": True, "exitstatus": int(exitstatus), "collected": session.testscollected,
            "time": time.time()}, final=True)


def _message(report):
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    return str(report.longreprtext or report.longrepr or "")[-2000:]
