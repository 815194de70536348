"""Task derivation and scoring end to end on a real environment, in the real sandbox (bubblewrap):
a tiny repository written here (a few functions, pytest tests, one function copied from a HumanEval
canonical solution), built by the environment builder (factory.envs.build) against the test
mirror ($FACTORY_TEST_REGISTRY, default .cache/registry: no network). Covers: a function-completion task's
FAIL_TO_PASS fail broken and pass with the reference; the reference scores 1, a wrong candidate 0, a
candidate that does not parse is an error, one that loops forever times out and is recorded so; a
bug-fixing task's inverse patch scores 1 and a patch that edits the tests is refused; the HumanEval
copy is dropped by decontamination before any run; tasks and their lineage row land in the lake.
Runs on CPU where bubblewrap works (~40 s: every derivation step is a sandboxed pytest run)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from factory.envs.build import build_repos
from factory.envs.environment import Environment
from factory.envs.registry import RegistryConfig
from factory.envs.sources import RepoSet, RepoSource
from factory.envs.testrun import run_tests, test_sandbox_config
from factory.sandbox import Sandbox
from factory.tasks.derive import derive_task_set
from factory.tasks.model import DeriveConfig, Verdict
from factory.tasks.score import score_candidate
from factory.tasks.store import load_tasks, write_task_set

CORE = textwrap.dedent('''\
    def clamp(x, lo, hi):
        """Clamp x into [lo, hi]."""
        if x < lo:
            return lo
        if x > hi:
            return hi
        return x


    def total(xs):
        s = 0
        for x in xs:
            s += x
        return s


    def has_close_elements(numbers, threshold):
        for idx, elem in enumerate(numbers):
            for idx2, elem2 in enumerate(numbers):
                if idx != idx2:
                    distance = abs(elem - elem2)
                    if distance < threshold:
                        return True

        return False
    ''')
TESTS = textwrap.dedent('''\
    from calc.core import clamp, has_close_elements


    def test_clamp_low():
        assert clamp(-5, 0, 10) == 0


    def test_clamp_high():
        assert clamp(50, 0, 10) == 10


    def test_clamp_inside():
        assert clamp(5, 0, 10) == 5


    def test_truth():
        assert 1 + 1 == 2


    def test_close():
        assert has_close_elements([1.0, 1.05], 0.1) and not has_close_elements([1.0, 2.0], 0.1)
    ''')
TOTAL_TESTS = "from calc.core import total\n\n\ndef test_total():\n    assert total([1, 2, 3]) == 6\n"


PYPROJECT = ('[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
             '[project]\nname = "calc"\nversion = "0.1"\n')
REGISTRY = Path(os.environ.get("FACTORY_TEST_REGISTRY", Path(__file__).resolve().parents[2] / ".cache" / "registry"))


def _build_env(tmp: Path) -> Environment:
    """The fixture repository, built by the environment builder against the test mirror (no network)."""
    repo = tmp / "calc"
    files = {"pyproject.toml": PYPROJECT, "calc/__init__.py": "", "calc/core.py": CORE, "tests/test_core.py": TESTS,
             "tests/test_total.py": TOTAL_TESTS}
    for relative, text in files.items():
        (repo / relative).parent.mkdir(parents=True, exist_ok=True)
        (repo / relative).write_text(text)
    (record,) = build_repos(RepoSet(name="tasks-fixture", repos=(RepoSource(name="calc", path=str(repo)),)),
                            home=tmp / "home", registry=RegistryConfig(index_url=(REGISTRY / "simple").as_uri()))
    assert record.failure_class.value == "passed", (f"{record.failure_class}: {record.failure_detail} "
                                                   f"(the test mirror is {REGISTRY}; FACTORY_TEST_REGISTRY moves it)")
    return Environment.load(record.env_uri.removeprefix("file://"))


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Environment:
    return _build_env(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(test_sandbox_config(30))


@pytest.fixture(scope="module")
def completion(env, sandbox):
    return derive_task_set(env, "function_completion", DeriveConfig(max_tasks=5, max_candidates=5, seed=1), sandbox)


@pytest.mark.slow
def test_completion_tasks_fail_broken_and_pass_with_the_reference(completion, env, sandbox):
    assert completion.baseline_passed == 6
    assert sorted(t.target for t in completion.tasks) == ["clamp", "total"]
    assert completion.candidates == 2 and completion.rejected == {}
    clamp = next(t for t in completion.tasks if t.target == "clamp")
    assert clamp.fail_to_pass == ("tests/test_core.py::test_clamp_high", "tests/test_core.py::test_clamp_inside",
                                  "tests/test_core.py::test_clamp_low")
    # the tests of the same file that do not depend on clamp; test_total.py never names clamp
    assert clamp.pass_to_pass == ("tests/test_core.py::test_close", "tests/test_core.py::test_truth")
    assert "raise NotImplementedError" in clamp.prompt and "if x < lo" not in clamp.prompt
    assert clamp.difficulty.lines_removed == 5 and clamp.difficulty.tests_covering == 3 and clamp.reference_s > 0
    broken = run_tests(env, sandbox, test_ids=list(clamp.fail_to_pass), overlay=clamp.broken_overlay)
    assert broken.completed and broken.passed() == set()


def test_humaneval_copy_is_dropped_before_any_run(completion):
    assert completion.contaminated == {"calc/core.py::has_close_elements": completion.contaminated[
        "calc/core.py::has_close_elements"]}
    assert completion.contaminated["calc/core.py::has_close_elements"].startswith("humaneval:HumanEval/0 (")
    assert "has_close_elements" not in {t.target for t in completion.tasks}


@pytest.mark.slow
def test_scoring_reference_wrong_error_and_a_forever_loop(completion, env, sandbox):
    clamp = next(t for t in completion.tasks if t.target == "clamp")
    right = score_candidate(clamp, clamp.reference, sandbox)
    assert (right.outcome, right.reward) == (Verdict.PASSED, 1.0)
    whole = score_candidate(clamp, "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n", sandbox)
    assert whole.outcome is Verdict.PASSED
    wrong = score_candidate(clamp, "return lo", sandbox)
    assert (wrong.outcome, wrong.reward) == (Verdict.FAILED, 0.0)
    assert set(wrong.failing) == {"tests/test_core.py::test_clamp_high", "tests/test_core.py::test_clamp_inside"}
    bad = score_candidate(clamp, "return (", sandbox)
    assert bad.outcome is Verdict.ERROR and "does not parse" in bad.detail
    loop = score_candidate(clamp, "while True:\n    pass", Sandbox(test_sandbox_config(4)))
    assert (loop.outcome, loop.reward) == (Verdict.TIMEOUT, 0.0) and "did not reach its end" in loop.detail
    # the cheapest way to score: end the test process "successfully" before any test can fail
    cheat = score_candidate(clamp, "import os\nos._exit(0)", sandbox)
    assert (cheat.outcome, cheat.reward) == (Verdict.ERROR, 0.0) and "reaches outside its task" in cheat.detail


def test_bug_fixing_tasks_inverse_patch_scores_one(env, sandbox):
    config = DeriveConfig(max_tasks=2, max_candidates=4, seed=3, operators=("compare_flip", "off_by_one", "drop_branch"))
    # two candidates at a time; test_total marked flaky by the build, so `total` has no usable test
    bugs = derive_task_set(env, "bug_fixing", config, Sandbox(test_sandbox_config(30, workers=2)),
                           flaky=["tests/test_total.py::test_total"])
    assert [t.target for t in bugs.tasks] == ["clamp"], bugs.rejected
    assert bugs.rejected == {"no passing test in the files that mention the function": 1}
    task = bugs.tasks[0]
    assert "tests/test_total.py::test_total" not in task.pass_to_pass
    assert task.reference.startswith(f"--- a/{task.file}\n+++ b/{task.file}\n")
    assert all(t in task.prompt for t in task.fail_to_pass)
    fixed = score_candidate(task, task.reference, sandbox)
    assert (fixed.outcome, fixed.reward) == (Verdict.PASSED, 1.0)
    cheat = "--- a/tests/test_core.py\n+++ b/tests/test_core.py\n@@ -1,1 +1,1 @@\n-from calc.core import clamp, has_close_elements\n+import calc\n"
    refused = score_candidate(task, cheat, sandbox)
    assert refused.outcome is Verdict.ERROR and "must change only" in refused.detail
    stale = task.reference.replace("\n-", "\n-#", 1)
    assert score_candidate(task, stale, sandbox).outcome is Verdict.ERROR  # does not apply


def test_task_set_is_stored_with_lineage_and_replaced_on_rederive(completion, lake):
    config = DeriveConfig(max_tasks=5, max_candidates=5, seed=1)
    write_task_set(lake, completion, config=config)
    write_task_set(lake, completion, config=config)  # the same derivation again: replaced, not doubled
    stored = load_tasks(lake, "function_completion")
    assert stored == sorted(completion.tasks, key=lambda t: t.task_id)
    (row,) = lake.lineage.records(kind="task_set")[-1:]
    assert row.upstream == [f"env_build/calc@{completion.revision}/{completion.env_digest[:12]}"]
    assert row.version_id == f"task_set/function_completion/calc@{completion.revision}/{completion.env_digest[:12]}"
