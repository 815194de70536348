"""unittest runner used inside the sandbox for repositories whose suites are plain unittest: the same
JSON-lines report as the pytest plugin (factory_report.py), nonce-stamped end record included.

Run as `python factory_unittest.py [discover args: -s START -t TOP -p PATTERN] [--ids ID ...]`: with
ids, those tests are loaded by name with START (or TOP) on sys.path. Not imported by the host.
"""

import json
import os
import sys
import time
import unittest


def main(argv):
    path = os.environ.pop("FACTORY_REPORT_PATH")
    nonce = os.environ.pop("FACTORY_REPORT_NONCE")
    out = open(path, "a", encoding="utf-8", buffering=1)

    def write(record):
        out.write(json.dumps(record) + "\n")

    sys.path.insert(0, os.getcwd())
    loader = unittest.TestLoader()
    args, ids = (argv[: argv.index("--ids")], argv[argv.index("--ids") + 1 :]) if "--ids" in argv else (argv, None)
    start, top, pattern = ".", None, "test*.py"
    while args:
        flag = args.pop(0)
        value = args.pop(0) if args else None
        if flag == "-s":
            start = value
        elif flag == "-t":
            top = value
        elif flag == "-p":
            pattern = value
    if ids is not None:
        sys.path.insert(0, os.path.abspath(top or start))
        suite = loader.loadTestsFromNames(ids)
    else:
        suite = loader.discover(start, pattern=pattern, top_level_dir=top)
    for error in getattr(loader, "errors", []):
        write({"collection_error": "<discovery>", "message": str(error)[-2000:]})

    class Result(unittest.TestResult):
        def startTest(self, test):
            self._t0 = time.perf_counter()
            self._state = ("passed", "")
            super().startTest(test)

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._state = ("failed", self._exc_info_to_string(err, test))

        def addError(self, test, err):
            super().addError(test, err)
            if test.id().startswith("unittest.loader._FailedTest"):
                write({"collection_error": test.id(), "message": self._exc_info_to_string(err, test)[-2000:]})
            self._state = ("error", self._exc_info_to_string(err, test))

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._state = ("skipped", reason)

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            self._state = ("skipped", "expected failure")

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self._state = ("failed", "unexpected success")

        def stopTest(self, test):
            super().stopTest(test)
            if not test.id().startswith("unittest.loader._FailedTest"):
                outcome, message = self._state
                write({"test_id": test.id(), "outcome": outcome,
                       "duration_s": round(time.perf_counter() - self._t0, 6), "message": message[-500:]})

    result = Result()
    suite.run(result)
    line = {"end": True, "exitstatus": 0 if result.wasSuccessful() else 1, "collected": result.testsRun,
            "time": time.time(), "nonce": nonce}
    write(line)
    out.flush()
    os.fsync(out.fileno())
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
