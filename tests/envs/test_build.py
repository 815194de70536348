"""factory.envs.build end to end: fixture repositories made here reach each failure class, a passing
repository records its failing and flaky tests, the batch lands in envs.builds / envs.tests with a
lineage row per build, a rebuild of the same revision from the same wheelhouse gets the same digest,
and a builder may revise its plan. (Real sdists: test_envs_commands.py builds the demo set.) Runs on CPU with bubblewrap, resolving
against the local mirror only (tests/envs/conftest.py): no network. ~1 minute."""

from __future__ import annotations

from pathlib import Path

import pytest

from factory.envs.build import build_repos
from factory.envs.builder import Builder, HeuristicBuilder
from factory.envs.environment import CaseOutcome, Environment, Runner
from factory.envs.outcomes import FailureClass
from factory.envs.registry import RegistryConfig
from factory.envs.sources import RepoSet, RepoSource
from factory.envs.testrun import run_tests, test_sandbox_config
from factory.lake import Lake
from factory.sandbox import Sandbox

from envs_fixtures import pyproject, sdist_only_mirror, write_repo

pytestmark = pytest.mark.slow

FLIT = '[build-system]\nrequires = ["flit_core"]\nbuild-backend = "flit_core.buildapi"\n\n'
TEST_TIMEOUT_S = 10.0  # the hanging fixture costs this once

PASSING = {
    "pyproject.toml": pyproject("calc"),
    "src/calc/__init__.py": "def add(a, b):\n    return a + b\n",
    "tests/test_calc.py": """
        import sys
        from calc import add

        def test_add():
            assert add(2, 3) == 5

        def test_wrong():
            assert add(2, 2) == 5

        def test_flaky():
            # fails in the full run, passes when rerun by id (the rerun names tests on the command line)
            assert any("::" in arg for arg in sys.argv)
    """,
}

FIXTURES = {
    "passing": PASSING,
    "unittest_only": {
        "pyproject.toml": pyproject("ut", backend=FLIT, extra='description = "x"\n'),
        "ut.py": '"""A module."""\n__version__ = "0.1"\n\ndef double(x):\n    return 2 * x\n',
        "tests/test_ut.py": """
            import unittest
            from ut import double

            class DoubleTest(unittest.TestCase):
                def test_double(self):
                    self.assertEqual(double(2), 4)
        """,
    },
    "no_build": {"mod.py": "X = 1\n", "tests/test_mod.py": "from mod import X\n\ndef test_x():\n    assert X == 1\n"},
    "no_wheel": {"pyproject.toml": pyproject("nw", deps=("tinysdist",)), "nw.py": "",
                 "tests/test_nw.py": "def test_x():\n    pass\n"},
    "unresolvable": {"pyproject.toml": pyproject("ur", deps=("factory-no-such-project-anywhere",)), "ur.py": "",
                     "tests/test_ur.py": "def test_x():\n    pass\n"},
    "build_error": {"setup.py": "raise SystemExit('this setup.py refuses to build')\n", "be.py": "",
                    "tests/test_be.py": "def test_x():\n    pass\n"},
    "broken_import": {"pyproject.toml": pyproject("bi"), "bi.py": "",
                      "tests/test_bi.py": "import module_that_does_not_exist\n\ndef test_x():\n    pass\n"},
    "network": {"pyproject.toml": pyproject("net"), "net.py": "", "tests/test_net.py": """
        import socket

        def test_local():
            assert True

        def test_dns_server():
            socket.create_connection(("8.8.8.8", 53), timeout=5).close()
    """},
    "hang": {"pyproject.toml": pyproject("hang"), "hang.py": "",
             "tests/test_hang.py": "import time\n\ndef test_forever():\n    time.sleep(3600)\n"},
    "escape": {"pyproject.toml": pyproject("esc"), "esc.py": "", "tests/test_esc.py": """
        def test_ok():
            assert True

        def test_plant_into_env():
            with open("/env/planted.py", "w") as f:
                f.write("print('owned')")
    """},
}

EXPECTED = {
    "passing": FailureClass.PASSED, "unittest_only": FailureClass.PASSED,
    "no_build": FailureClass.NO_BUILD_SYSTEM, "no_wheel": FailureClass.NO_WHEEL,
    "unresolvable": FailureClass.RESOLUTION_FAILED, "build_error": FailureClass.BUILD_ERROR,
    "broken_import": FailureClass.TEST_COLLECTION_ERROR, "network": FailureClass.TESTS_NEED_NETWORK,
    "hang": FailureClass.TIMEOUT, "escape": FailureClass.SANDBOX_LIMIT,
}


@pytest.fixture(scope="module")
def batch(tmp_path_factory, registry):
    """Every fixture repository built in one batch (one build_repos call, two at a time: the wheelhouse
    and the environment store are shared by concurrent builds), committed to a lake."""
    root = tmp_path_factory.mktemp("envs-batch")
    extra = sdist_only_mirror(root / "sdist-mirror")
    sources = tuple(RepoSource(name=name, path=str(write_repo(root / "repos" / name, files)))
                    for name, files in FIXTURES.items())
    home = root / "home"
    lake = Lake.open(home=home)
    records = build_repos(RepoSet(name="fixtures", repos=sources), lake=lake, home=home,
                          registry=registry.model_copy(update={"extra_index_urls": (extra,)}),
                          sandbox=Sandbox(test_sandbox_config(timeout_s=TEST_TIMEOUT_S, workers=2)), parallel=2)
    assert [r.repo for r in records] == list(FIXTURES)  # the set's order, whatever finished first
    return {r.repo: r for r in records}, lake, home


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_fixture_reaches_its_class(batch, name):
    record = batch[0][name]
    assert record.failure_class is EXPECTED[name], (record.failure_class, record.rule, record.failure_detail)
    assert record.rule, "every outcome names the rule behind it"


def test_failure_classes_name_their_rules(batch):
    records = batch[0]
    assert records["no_build"].rule == "backend.none"
    assert records["no_wheel"].rule == "deps.pyproject" and "tinysdist" in records["no_wheel"].failure_detail
    assert records["unresolvable"].rule == "deps.pyproject"
    assert records["build_error"].rule == "backend.setup-py"
    assert "refuses to build" in records["build_error"].failure_detail
    assert records["hang"].rule == "runner.tests-dir" and "timeout" in records["hang"].failure_detail
    assert "test_plant_into_env" in records["escape"].failure_detail
    assert "test_dns_server" in records["network"].failure_detail
    # the phases that did not run are recorded as skipped, the failing one as failed
    assert (records["no_wheel"].resolve_outcome, records["no_wheel"].build_outcome) == ("failed", "skipped")
    assert (records["build_error"].build_outcome, records["build_error"].test_outcome) == ("failed", "skipped")
    assert records["hang"].test_outcome == "failed" and records["hang"].env_digest


def test_passing_repo_records_failures_and_flaky_tests(batch):
    record = batch[0]["passing"]
    outcomes = {c.test_id: c.outcome for c in record.tests}
    assert outcomes == {"tests/test_calc.py::test_add": CaseOutcome.PASSED,
                        "tests/test_calc.py::test_wrong": CaseOutcome.FAILED,
                        "tests/test_calc.py::test_flaky": CaseOutcome.FAILED}
    assert record.flaky == ("tests/test_calc.py::test_flaky",)
    assert (record.tests_passed, record.tests_failed) == (1, 2)
    assert (record.resolve_outcome, record.build_outcome, record.test_outcome) == ("ok", "ok", "ok")
    assert record.revision.startswith("local-") and record.origin.endswith(record.revision)


def test_environment_is_stored_and_reusable(batch):
    record = batch[0]["passing"]
    env = Environment.load(Path(record.env_uri.removeprefix("file://")))
    assert env.digest == record.env_digest and Path(env.root).name == env.digest
    assert env.runner is Runner.PYTEST and env.test_args == ("tests",)
    lock = (Path(env.root) / "lock.json").read_text()
    assert '"pytest"' in lock and env.lock_hash == record.lock_hash
    report = run_tests(env, Sandbox(test_sandbox_config(timeout_s=TEST_TIMEOUT_S)), test_ids=["tests/test_calc.py::test_add"])
    assert report.completed and report.passed() == {"tests/test_calc.py::test_add"}
    unittest_env = Environment.load(Path(batch[0]["unittest_only"].env_uri.removeprefix("file://")))
    assert unittest_env.runner is Runner.UNITTEST and batch[0]["unittest_only"].tests_passed == 1


def test_batch_is_committed_with_lineage(batch):
    records, lake, _ = batch
    rows = lake.table("envs.builds").scan().to_arrow().to_pylist()
    assert sorted(r["repo"] for r in rows) == sorted(FIXTURES)
    by_repo = {r["repo"]: r for r in rows}
    assert by_repo["passing"]["tests_flaky"] == 1 and by_repo["no_wheel"]["failure_class"] == "no_wheel"
    tests = lake.table("envs.tests").scan().to_arrow().to_pylist()
    assert sum(r["flaky"] for r in tests) == 1
    assert len(tests) == sum(len(r.tests) for r in records.values())
    lineage = {r.version_id: r for r in lake.lineage.records(kind="env_build")}
    assert len(lineage) == len(FIXTURES)
    passing = lineage[records["passing"].version_id]
    assert passing.content_hash == records["passing"].env_digest
    assert passing.upstream == [records["passing"].origin]
    assert records["passing"].version_id == f"env_build/passing@{records['passing'].revision}/{records['passing'].env_digest[:12]}"


def test_rebuild_gives_the_same_digest(batch, tmp_path, registry):
    """Same revision, same wheels: the same environment digest (and lock hash), in the same home and
    in another one (another wheelhouse directory holding the same files: host paths do not enter)."""
    first = batch[0]["passing"]
    source = RepoSource(name="passing", path=str(batch[2].parent / "repos" / "passing"))
    for home in (batch[2], tmp_path / "other-home"):
        (again,) = build_repos(RepoSet(name="again", repos=(source,)), home=home, registry=registry,
                               sandbox=Sandbox(test_sandbox_config(timeout_s=TEST_TIMEOUT_S)))
        assert (again.revision, again.lock_hash, again.env_digest) == (first.revision, first.lock_hash, first.env_digest)
        assert again.build_id != first.build_id and Path(again.env_uri.removeprefix("file://")).parent == home / "envs"


def test_other_index_fails_resolution_cleanly(tmp_path):
    """An index that does not answer is a recorded resolution failure, not an exception."""
    repo = write_repo(tmp_path / "r", FIXTURES["passing"])
    (record,) = build_repos(RepoSet(name="x", repos=(RepoSource(name="r", path=str(repo)),)), home=tmp_path / "h",
                            registry=RegistryConfig(index_url=(tmp_path / "empty").as_uri()))
    assert record.failure_class is FailureClass.RESOLUTION_FAILED and record.resolve_outcome == "failed"


class _SecondThoughts:
    """A builder that starts from a wrong plan and, shown the failure, revises to the heuristic one:
    the seam an agent builder uses (builder.py)."""

    name = "second-thoughts"

    def __init__(self):
        self.seen: list[str] = []

    def plan(self, source):
        right = HeuristicBuilder().plan(source)
        return right.model_copy(update={"requirements": ("factory-no-such-project-anywhere",)})

    def revise(self, source, plan, failed):
        self.seen.append(failed.failure_class.value)
        return HeuristicBuilder().plan(source)


def test_a_builder_may_revise_its_plan_after_a_failure(tmp_path, registry):
    repo = write_repo(tmp_path / "r", {"pyproject.toml": pyproject("rv"), "rv.py": "",
                                       "tests/test_rv.py": "def test_rv():\n    pass\n"})
    builder = _SecondThoughts()
    assert isinstance(builder, Builder)
    (record,) = build_repos(RepoSet(name="rv", repos=(RepoSource(name="rv", path=str(repo)),)), home=tmp_path / "h",
                            registry=registry, builder=builder)
    assert builder.seen == ["resolution_failed"]
    assert (record.failure_class, record.attempt, record.builder) == (FailureClass.PASSED, 2, "second-thoughts")
    assert record.tests_passed == 1
