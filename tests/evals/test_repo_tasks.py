"""The `repo_tasks` eval end to end, on CPU where bubblewrap works (~1 min): a tiny repository
written here (functions and a class's methods, pytest tests) is built by the environment builder
against the test mirror ($FACTORY_TEST_REGISTRY, default .cache/registry: no network), its
function-completion tasks are derived and stored, and the eval scores a model's bodies through the
task engine on a local Ray instance (loopback only; one instance for the module) in the real sandbox.

The model is a stub of the inference engine's three calls the task makes (document_ids, fit,
generate): it continues each prompt with the original file (a model that knows the answer) or with
`return None`, and cuts at the stop strings as the real engines do. Covers: reference bodies give
pass@1 = 1.0 through `evaluate` (the eval sensor's path: evals.results, evals.samples naming the
task ids, the lineage upstream = the task-set version), also with prompts cut to a small context;
wrong bodies give 0.0 with every outcome `failed`; a scorer that cannot run (the environment
gone), no stored tasks, or a filter that leaves none, is an error that says what happened; the body a completion gives (methods, dedent, blank edges)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from configs.evals import suite
from factory.envs.build import build_repos
from factory.envs.environment import Environment
from factory.envs.registry import RegistryConfig
from factory.envs.sources import RepoSet, RepoSource
from factory.envs.testrun import test_sandbox_config
from factory.evals.repo_tasks import CONSUMER, RepoTasksConfig, candidate_body, select_tasks
from factory.evals.suite import SuiteConfig, evaluate
from factory.evals.tasks import TaskContext, run_task
from factory.infer.engine import Sample, cut_at_stop
from factory.infer.export import ExportRef
from factory.lake import Lake
from factory.sandbox import Sandbox
from factory.tasks.derive import derive_task_set
from factory.tasks.engine import EngineConfig
from factory.tasks.engine_ray import start_ray, stop_ray
from factory.tasks.model import DeriveConfig
from factory.tasks.store import task_set_version, write_task_set

pytestmark = pytest.mark.slow

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


    class Stack:
        def push(self, item):
            self.items = getattr(self, "items", [])
            self.items.append(item)
            return len(self.items)

        def peek(self):
            if not getattr(self, "items", None):
                raise IndexError("empty stack")
            return self.items[-1]
    ''')
TESTS = textwrap.dedent('''\
    from calc.core import Stack, clamp, total


    def test_clamp():
        assert clamp(-5, 0, 10) == 0 and clamp(50, 0, 10) == 10 and clamp(5, 0, 10) == 5


    def test_total():
        assert total([1, 2, 3]) == 6


    def test_stack():
        s = Stack()
        assert s.push(3) == 1 and s.push(4) == 2
        assert s.peek() == 4
    ''')
PYPROJECT = ('[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
             '[project]\nname = "calc"\nversion = "0.1"\n')
FILES = {"pyproject.toml": PYPROJECT, "calc/__init__.py": "", "calc/core.py": CORE, "tests/test_core.py": TESTS}
REGISTRY = Path(os.environ.get("FACTORY_TEST_REGISTRY", Path(__file__).resolve().parents[2] / ".cache" / "registry"))
REPO_SET = "evaltask-fixture"
TARGETS = ["Stack.peek", "Stack.push", "clamp", "total"]


class StubModel:
    """The three engine calls `repo_tasks` makes. Ids are characters (0 = the document separator);
    `generate` continues a prompt with the original file after it (`answer="reference"`) or with a
    `return None` body, cut at the sampling's stop strings and at max_tokens characters."""

    name = "stub"

    def __init__(self, answer: str, context: int = 1 << 20) -> None:
        self.answer, self.max_len = answer, context

    def document_ids(self, text: str) -> list[int]:
        return [0, *map(ord, text)]

    def fit(self, ids: list[int], room: int) -> list[int]:
        return ids[-(self.max_len - room):]

    def generate(self, prompts, sampling):
        out = []
        for ids in prompts:
            prompt = "".join(chr(i) for i in ids if i)
            at = CORE.find(prompt)
            assert at >= 0 and CORE.count(prompt) == 1, f"the stub cannot place the prompt {prompt[-80:]!r}"
            rest = CORE[at + len(prompt):]
            if self.answer != "reference":
                body = rest.removeprefix("\n")
                rest = "\n" + body[: len(body) - len(body.lstrip())] + "return None\n\n\ndef after():\n    pass\n"
            text, stopped = cut_at_stop(rest[: sampling.max_tokens], sampling.stop)
            out.append([Sample(token_ids=[], text=text, finish_reason="stop" if stopped else "length")])
        return out


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """(lake, task set): the fixture repository built (envs.builds committed) and its tasks stored."""
    tmp = tmp_path_factory.mktemp("repo-tasks")
    lake = Lake.open(home=tmp / "home")
    for relative, text in FILES.items():
        (tmp / "calc" / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "calc" / relative).write_text(text)
    registry = RegistryConfig(index_url=(REGISTRY / "simple").as_uri())
    (record,) = build_repos(RepoSet(name=REPO_SET, repos=(RepoSource(name="calc", path=str(tmp / "calc")),)),
                            lake=lake, home=tmp / "home", registry=registry)
    assert record.failure_class.value == "passed", (f"{record.failure_class}: {record.failure_detail} "
                                                   f"(the test mirror is {REGISTRY}; FACTORY_TEST_REGISTRY moves it)")
    env = Environment.load(record.env_uri.removeprefix("file://"))
    config = DeriveConfig(max_tasks=6, max_candidates=6, seed=0)
    task_set = derive_task_set(env, "function_completion", config, Sandbox(test_sandbox_config(30, workers=2)))
    assert sorted(t.target for t in task_set.tasks) == TARGETS, task_set.rejected
    write_task_set(lake, task_set, config=config)
    return lake, task_set


@pytest.fixture(scope="module")
def local_ray():
    """One Ray instance for the module: the evals' task engines join it instead of starting their own."""
    owned = start_ray(EngineConfig(workers=2))
    yield
    if owned:
        stop_ray()


def context(lake: Lake, model: StubModel) -> TaskContext:
    def no_sandbox():
        raise AssertionError("repo_tasks scores through the task engine, not the suite's sandbox")

    return TaskContext(lake=lake, export=None, engine=model, sandbox=no_sandbox, log=lambda _: None)


EVAL = {"task": "repo_tasks", "max_tokens": 400, "timeout_s": 30, "lease_s": 90, "repo_set": REPO_SET}


def test_reference_bodies_pass_through_the_eval_suite(stored, local_ray, tmp_path):
    lake, task_set = stored
    ids = sorted(t.task_id for t in task_set.tasks)
    export = ExportRef(export_id="export/fixture@10", checkpoint_id="ckpt/fixture@10", run="fixture", step=10,
                       path=tmp_path, sha256="0" * 64, tokenizer="tokenizer/none", mix_version="mix/none")
    model = StubModel("reference", context=400 + 150)  # room for 150 prompt characters: later functions are cut
    report = evaluate(lake, export, model, SuiteConfig(name="repo-fixture", tasks=[EVAL]), tokens=0,
                      log=lambda _: None)
    (row,) = report.rows
    assert (row["task"], row["metric"], row["value"], row["n"]) == ("repo_tasks", "pass@1", 1.0, 4)
    meta = report.metadata["repo_tasks"]
    assert meta["outcomes"] == {"passed": 4} and meta["prompts_cut"] >= 2 and meta["empty_bodies"] == 0
    assert meta["by_repo"] == {f"calc@{task_set.revision}": {"passed": 4, "tasks": 4}}
    # this eval's rows: the module's lake also holds what the other tests here scored (in any order)
    samples = [s for s in lake.table("evals.samples").scan().to_arrow().to_pylist() if s["eval_id"] == report.eval_id]
    assert sorted(s["item"] for s in samples) == ids
    references = {t.task_id: t.reference for t in task_set.tasks}
    assert all(s["completion"] == references[s["item"]].rstrip("\n") and s["score"] == 1.0 for s in samples)
    (lineage,) = [r for r in lake.lineage.records(kind="eval") if r.version_id == report.eval_id]
    assert task_set_version(task_set) in lineage.upstream and "export/fixture@10" in lineage.upstream
    attempts = lake.table("tasks.attempts").scan().to_arrow().to_pylist()
    passed = [a for a in attempts if a["outcome"] == "passed"]  # the wrong bodies' attempts fail
    assert sorted(a["task_id"] for a in passed) == ids and all(a["consumers"] == [CONSUMER] for a in attempts)


def test_wrong_bodies_score_zero_as_failed(stored, local_ray):
    lake, task_set = stored
    result = run_task(RepoTasksConfig.model_validate(EVAL), context(lake, StubModel("wrong")))
    (metric,) = result.metrics
    assert (metric.metric, metric.value, metric.n, metric.stderr) == ("pass@1", 0.0, 4, 0.0)
    assert result.metadata["outcomes"] == {"failed": 4} and result.metadata["cached"] == 0
    assert sum(result.metadata["outcomes"].values()) == len(result.samples) == 4
    assert sorted(s["item"] for s in result.samples) == sorted(t.task_id for t in task_set.tasks)
    assert {s["completion"] for s in result.samples} == {"    return None", "        return None"}
    assert all(s["outcome"] == "failed" and s["score"] == 0.0 for s in result.samples)
    assert result.upstream == [task_set_version(task_set)]
    again = run_task(RepoTasksConfig.model_validate(EVAL | {"max_tasks": 2}), context(lake, StubModel("wrong")))
    assert again.metadata["cached"] == 2  # the same (task, body) keys: answered from tasks.attempts


def test_a_scorer_that_cannot_run_fails_the_eval(stored, local_ray, tmp_path):
    """Tasks whose environment is gone from this host: every attempt's work raises, and the eval
    raises with the cause instead of scoring the model 0."""
    _, task_set = stored
    gone = tuple(t.model_copy(update={"env_root": str(tmp_path / "gone")}) for t in task_set.tasks)
    elsewhere = Lake.open(home=tmp_path / "home")
    write_task_set(elsewhere, task_set.model_copy(update={"tasks": gone}), config=DeriveConfig())
    with pytest.raises(RuntimeError, match=r"could not score 4 of 4 attempts \(a scorer failure, not the model's "
                                           r"answer\); first: task [0-9a-f]{24} \(calc calc/core.py::"):
        run_task(RepoTasksConfig.model_validate(EVAL | {"repo_set": None}), context(elsewhere, StubModel("reference")))


def test_no_stored_tasks_is_an_error(lake):
    with pytest.raises(LookupError, match="tasks.function_completion holds no tasks in this lake; materialize the "
                                          "asset tasks/function_completion"):
        run_task(RepoTasksConfig(), context(lake, StubModel("reference")))


def test_filters_and_the_deterministic_choice(stored):
    lake, task_set = stored
    ids = sorted(t.task_id for t in task_set.tasks)
    assert [t.task_id for t in select_tasks(lake, RepoTasksConfig(repo_set=REPO_SET, max_tasks=2))] == ids[:2]
    assert len(select_tasks(lake, RepoTasksConfig(repos=("calc",)))) == 4
    with pytest.raises(LookupError, match=r"none of the 4 stored function_completion tasks is from "
                                          r"repo_set='other', repos=\[\] \(repositories with tasks: \['calc'\]\)"):
        select_tasks(lake, RepoTasksConfig(repo_set="other"))
    with pytest.raises(LookupError, match="none of the 4"):
        select_tasks(lake, RepoTasksConfig(repos=("six",)))


def test_candidate_body_ends_with_the_function():
    completion = "\n        x = 1\n\n        return x\n\n    def other(self):\n        pass\n"
    assert candidate_body(completion, "    ") == "        x = 1\n\n        return x"
    assert candidate_body("\n  return 2  # two-space body\nprint()", "") == "  return 2  # two-space body"
    assert candidate_body(" return 3\n\ndef g():", "") == "return 3"  # continued on the signature's line
    assert candidate_body("\n\ndef g():\n    pass", "") == ""


def test_suite_and_config_validation():
    (task,) = suite("repo_tasks").tasks
    assert isinstance(task, RepoTasksConfig) and task.max_tasks == 50 and task.temperature == 0.0
    with pytest.raises(ValueError, match="lease_s=60.0 must exceed timeout_s=120.0"):
        RepoTasksConfig(lease_s=60)
    with pytest.raises(ValueError, match="kind"):
        RepoTasksConfig(kind="bug_fixing")
