"""factory.envs.testrun: a repository's tests run in the sandbox with a per-test report that only a
run reaching its end completes. Runs on CPU with bubblewrap; the environment here is a venv made in
the sandbox at /env whose site-packages point at this checkout's pytest (the builder's own tests make
real ones from wheels)."""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from factory.envs.environment import CaseOutcome, Environment, Runner
from factory.envs.testrun import PatchError, run_tests, test_sandbox_config
from factory.sandbox import Mount, Sandbox

SOURCE = {
    "calc.py": "def add(a, b):\n    return a + b\n\n\ndef slow():\n    import time\n    time.sleep(60)\n",
    "tests/test_calc.py": textwrap.dedent("""
        import os, pytest
        from calc import add

        def test_add():
            assert add(2, 3) == 5

        def test_neg():
            assert add(-1, 1) == 0

        @pytest.mark.skip(reason="not today")
        def test_skipped():
            pass

        def test_env_readonly():
            with pytest.raises(OSError):
                open("/env/planted.txt", "w")
    """),
    "tests/test_unittest_style.py": textwrap.dedent("""
        import unittest
        from calc import add

        class AddTest(unittest.TestCase):
            def test_add(self):
                self.assertEqual(add(1, 1), 2)
    """),
}


def _make_env(root: Path, runner: Runner = Runner.PYTEST, test_args=("tests",)) -> Environment:
    root.mkdir(parents=True)
    src, venv = root / "src", root / "venv"
    for rel, text in SOURCE.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    venv.mkdir()
    os.chmod(root, 0o755)
    os.chmod(venv, 0o777)
    purelib = sysconfig.get_paths()["purelib"]  # this checkout's pytest, readable in the sandbox (interpreter root)
    code = (f"import subprocess, sys\nsubprocess.run([sys._base_executable, '-m', 'venv', '--without-pip', '/env'], check=True)\n"
            f"import glob\nsite = glob.glob('/env/lib/python*/site-packages')[0]\n"
            f"open(site + '/host.pth', 'w').write({purelib!r} + '\\n')\n")
    made = Sandbox(test_sandbox_config(60)).run(code, mounts=(Mount(host=str(venv), path="/env", writable=True),))
    assert made.outcome.value == "passed", made.stderr
    digest = hashlib.sha256(str(root).encode()).hexdigest()
    # the checkout's site-packages hold pytest-randomly, which pytest would load there and use to
    # shuffle the tests (the hanging test needs test_add to run before test_slow)
    return Environment(repo="calc", revision="local-test", digest=digest, root=str(root), python="3.11",
                       lock_hash="0" * 64, runner=runner, test_args=test_args, rule="test-fixture",
                       test_options=("-p", "no:randomly") if runner is Runner.PYTEST else ())


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Environment:
    return _make_env(tmp_path_factory.mktemp("envs") / "calc")


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(test_sandbox_config(30))


def test_whole_suite_reports_each_test(env, sandbox):
    report = run_tests(env, sandbox)
    assert report.completed, report.output_tail
    outcomes = {c.test_id: c.outcome for c in report.cases}
    assert outcomes == {
        "tests/test_calc.py::test_add": CaseOutcome.PASSED,
        "tests/test_calc.py::test_neg": CaseOutcome.PASSED,
        "tests/test_calc.py::test_skipped": CaseOutcome.SKIPPED,
        "tests/test_calc.py::test_env_readonly": CaseOutcome.PASSED,
        "tests/test_unittest_style.py::AddTest::test_add": CaseOutcome.PASSED,
    }
    assert report.all_passed(["tests/test_calc.py::test_add", "tests/test_calc.py::test_neg"])


def test_overlay_breaks_chosen_tests_and_leaves_the_environment_alone(env, sandbox):
    broken = {"calc.py": "def add(a, b):\n    return a - b\n"}
    report = run_tests(env, sandbox, test_ids=["tests/test_calc.py::test_add", "tests/test_calc.py::test_neg"],
                       overlay=broken)
    assert report.completed
    assert report.outcome_of("tests/test_calc.py::test_add") is CaseOutcome.FAILED
    assert report.outcome_of("tests/test_calc.py::test_neg") is CaseOutcome.FAILED
    assert "assert" in next(c.message for c in report.cases)
    assert (env.src_dir / "calc.py").read_text() == SOURCE["calc.py"]


def test_patch_applies_or_names_the_problem(env, sandbox):
    patch = ("--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a + b\n+    return a * b\n")
    report = run_tests(env, sandbox, test_ids=["tests/test_calc.py::test_add"], patch=patch)
    assert report.completed and report.outcome_of("tests/test_calc.py::test_add") is CaseOutcome.FAILED
    with pytest.raises(PatchError, match="does not apply"):
        run_tests(env, sandbox, patch=patch.replace("return a + b", "return nothing"))


def test_an_early_exit_zero_is_not_a_completed_run(env, sandbox):
    cheat = {"calc.py": "import os\nos._exit(0)\n", }
    report = run_tests(env, sandbox, test_ids=["tests/test_calc.py::test_add"], overlay=cheat)
    assert report.exec_outcome == "passed"  # the process did exit 0 ...
    assert not report.completed and report.passed() == set()  # ... but the tests never ran to their end


def test_a_forged_report_does_not_complete_the_run(env, sandbox):
    forged = ("import json, os\nwith open('/out/report.jsonl', 'a') as f:\n"
              "    f.write(json.dumps({'test_id': 'tests/test_calc.py::test_add', 'outcome': 'passed'}) + '\\n')\n"
              "    f.write(json.dumps({'end': True, 'nonce': os.environ.get('FACTORY_REPORT_NONCE', 'guess')}) + '\\n')\n"
              "os._exit(0)\n")
    report = run_tests(env, sandbox, test_ids=["tests/test_calc.py::test_add"], overlay={"calc.py": forged})
    assert not report.completed and not report.all_passed(["tests/test_calc.py::test_add"])


@pytest.mark.slow
def test_a_hanging_test_times_out_with_the_tests_before_it_reported(env):
    report = run_tests(env, Sandbox(test_sandbox_config(8)), test_ids=[
        "tests/test_calc.py::test_add", "tests/test_slow.py::test_slow"],
        overlay={"tests/test_slow.py": "from calc import slow\n\ndef test_slow():\n    slow()\n"})
    assert report.exec_outcome == "timeout" and not report.completed
    assert report.outcome_of("tests/test_calc.py::test_add") is CaseOutcome.PASSED


def test_collection_errors_are_reported(env, sandbox):
    report = run_tests(env, sandbox, overlay={"tests/test_broken.py": "import no_such_module_here\n"})
    assert report.completed
    assert any("tests/test_broken.py" in e and "no_such_module_here" in e for e in report.collection_errors)


def test_unittest_runner_reports_each_test(env, sandbox):
    unit = env.model_copy(update={"runner": Runner.UNITTEST, "test_args": ("-s", "tests"), "test_options": ()})
    report = run_tests(unit, sandbox)
    assert report.completed, report.output_tail
    assert report.outcome_of("test_unittest_style.AddTest.test_add") is CaseOutcome.PASSED
    only = run_tests(unit, sandbox, test_ids=["test_unittest_style.AddTest.test_add"],
                     overlay={"calc.py": "def add(a, b):\n    return 0\n"})
    assert only.completed and only.outcome_of("test_unittest_style.AddTest.test_add") is CaseOutcome.FAILED


def test_the_run_owns_its_copy_of_the_sources(env, sandbox):
    # setting a file's times needs its owner (jinja2's suite does it): the copy is the run's own uid's
    touch = "import os\n\ndef test_utime():\n    os.utime('calc.py', (0, 0))\n    assert os.stat('calc.py').st_mtime == 0\n"
    report = run_tests(env, sandbox, test_ids=["tests/test_touch.py::test_utime"], overlay={"tests/test_touch.py": touch})
    assert report.completed and report.outcome_of("tests/test_touch.py::test_utime") is CaseOutcome.PASSED, report.cases


def test_subtests_do_not_hide_a_failure(env, sandbox):
    sub = ("import unittest\n\nclass T(unittest.TestCase):\n    def test_many(self):\n"
           "        for i in range(3):\n            with self.subTest(i=i):\n                self.assertNotEqual(i, 1)\n")
    report = run_tests(env, sandbox, test_ids=["tests/test_sub.py::T::test_many"], overlay={"tests/test_sub.py": sub})
    assert report.completed and report.outcome_of("tests/test_sub.py::T::test_many") is CaseOutcome.FAILED
