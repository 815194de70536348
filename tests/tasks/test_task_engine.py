"""The task engine (factory.tasks.engine) on a real local Ray instance: many consumers get every task
scored exactly once in `tasks.attempts`; a worker killed mid-attempt (SIGKILL) is served again by
Ray's retry; one that dies on every try is recorded as crashed once the retries run out; a hanging
attempt hits its lease, is cancelled, served again and recorded as timeout; higher priorities start
first; a work error is recorded once, not retried, and is not final: the next request runs it again; a real function-completion task (built and
derived here) is scored through the engine by `ScoreWork`; a second driver process joining the
instance by address and asking for the same keys leaves one row per key; the instance listens on
loopback only; closing it leaves no Ray process.

Runs on CPU (bubblewrap for the sandboxed scoring test), no network beyond 127.0.0.1, ~60 s. Ray
takes ~10-15 s to start on the 2-core dev box, so the module shares one engine (the priority and
scoring tests open second engines on the same instance) and the last test closes it. The work
function is this module's `work`, driven by the candidate (JSON: what to do), pickled by value so
Ray workers need not import this test module.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import ray
import ray.cloudpickle

from factory.lake import Lake
from factory.lake.schemas import TASK_ATTEMPTS
from factory.tasks.engine import AttemptRequest, EngineConfig, EngineError, TaskEngine
from factory.tasks.engine_ray import memory_mb
from factory.tasks.engine_store import commit_results

pytestmark = pytest.mark.slow

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
# Long enough that a quick attempt never outlives it on a loaded machine (the suite's lanes side by
# side: with 1.5 s, one slow Ray worker start made a `tries == 1` test see 2); the hang test pays 2x.
LEASE_S = 5.0


def work(request):
    """What the candidate says: ok (reward 1), raise, sleep <s>, hang, kill the worker once (marker
    file) or on every try."""
    spec = json.loads(request.candidate)
    mode = spec["mode"]
    if mode == "kill":
        marker = Path(spec["marker"])
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "always_kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "hang":
        time.sleep(3600)
    elif mode == "sleep":
        time.sleep(spec["s"])
    elif mode == "raise":
        raise ValueError(f"no such thing as {spec.get('what', 'this')}")
    elif mode == "raise_once":
        marker = Path(spec["marker"])
        if not marker.exists():
            marker.write_text("raised")
            raise OSError("the environment is not there (yet)")
    return {"outcome": "passed", "reward": 1.0, "pid": os.getpid()}


def request(task_id: str, consumer: str = "", priority: int = 0, **spec) -> AttemptRequest:
    return AttemptRequest(task_id=task_id, candidate=json.dumps({"mode": "ok", **spec}, sort_keys=True),
                          consumer=consumer, priority=priority)


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Lake:
    return Lake.open(home=tmp_path_factory.mktemp("engine-home"))


@pytest.fixture(scope="module")
def engines() -> dict:
    """The module's engine, shared by its tests (one Ray start); closed at the end of the module."""
    held: dict[str, TaskEngine] = {}
    yield held
    if "engine" in held:
        held["engine"].close()


@pytest.fixture
def engine(engines, lake):
    """The module's engine, started again when a test before this one closed it (the close test,
    wherever a shuffled order puts it: `make test PYTEST_ARGS="-p randomly"`)."""
    if "engine" not in engines or engines["engine"].closed:
        engine = TaskEngine(EngineConfig(workers=2, lease_s=LEASE_S, max_retries=1, flush_s=0.5), work, lake=lake)
        print(f"\nray init {engine.init_s:.1f}s, {len(engine.processes())} processes, "
              f"{memory_mb(engine.processes()):.0f} MiB RSS")
        engines["engine"] = engine
    return engines["engine"]


def rows(lake: Lake) -> list[dict]:
    return lake.table("tasks.attempts").scan().to_arrow().to_pylist()


def test_many_consumers_score_every_task_exactly_once(engine, lake):
    universe = [request(f"task-{i}") for i in range(20)]
    chosen = {f"consumer-{c}": [random.Random(c).choice(universe) for _ in range(30)] for c in range(4)}
    asks = {name: [r.model_copy(update={"consumer": name}) for r in picks] for name, picks in chosen.items()}
    got, start = {}, threading.Barrier(len(asks))

    def consume(name):
        start.wait()
        got[name] = engine.run(asks[name])

    threads = [threading.Thread(target=consume, args=(name,)) for name in asks]
    earlier = len(engine.start_log())  # what tests before this one started on the shared engine
    [t.start() for t in threads]
    [t.join(300) for t in threads]

    wanted, mine = {r.key for picks in asks.values() for r in picks}, {r.key for r in universe}
    table = [r for r in rows(lake) if r["attempt_key"] in mine]  # the module's lake holds other tests' rows too
    assert sorted(r["attempt_key"] for r in table) == sorted(wanted)  # every key once, none twice
    assert all(r["outcome"] == "passed" and r["reward"] == 1.0 and r["tries"] == 1 for r in table)
    started = [key for key, *_ in engine.start_log()[earlier:]]
    assert sorted(started) == sorted(wanted)  # duplicates collapsed before they ran: one start per key
    by_key = {r["attempt_key"]: r for r in table}
    for name, results in got.items():
        assert [r.attempt_key for r in results] == [r.key for r in asks[name]]
        assert all(r.engine_run == engine.run_id and not r.cached for r in results)
        for r in results:  # every consumer is told what the table says
            assert (r.outcome, r.tries, r.pid) == (by_key[r.attempt_key]["outcome"], 1, by_key[r.attempt_key]["pid"])
    askers = {r.key: set() for picks in asks.values() for r in picks}
    for name, picks in asks.items():
        for r in picks:
            askers[r.key].add(name)
    assert all(set(by_key[k]["consumers"]) <= askers[k] and by_key[k]["consumers"] for k in askers)

    again = engine.run(universe)  # a later run is answered from the table, nothing runs twice
    assert [r.cached for r in again] == [r.key in wanted for r in universe]
    assert len([r for r in rows(lake) if r["attempt_key"] in mine]) == len(universe)


def test_rows_already_in_the_table_are_skipped_across_engines(engine, lake):
    first = engine.run([request("across-engines")])[0]
    other = first.model_copy(update={"engine_run": "engine-elsewhere", "outcome": "failed", "cached": False})
    written, theirs = commit_results(lake, engine.config, [other])
    assert written == [] and theirs[first.attempt_key].engine_run == engine.run_id
    assert [r["outcome"] for r in rows(lake) if r["attempt_key"] == first.attempt_key] == ["passed"]


def test_killed_worker_is_served_again_and_recorded_once(engine, lake, tmp_path):
    marker = tmp_path / "killed"
    result = engine.run([request("killed", mode="kill", marker=str(marker))])[0]
    assert (result.outcome, result.reward, result.tries) == ("passed", 1.0, 2)
    assert result.pid != int(marker.read_text())  # the retry ran in a fresh worker process
    assert _gone([int(marker.read_text())], within_s=30)
    assert [r["tries"] for r in rows(lake) if r["attempt_key"] == result.attempt_key] == [2]


def test_a_worker_that_dies_on_every_try_is_recorded_as_crashed_once_retries_run_out(engine, lake):
    result = engine.run([request("always-dies", mode="always_kill")], timeout_s=60)[0]
    assert (result.outcome, result.reward, result.tries) == ("crashed", 0.0, 2)  # max_retries=1: two starts
    assert "WorkerCrashedError" in result.error
    assert [r["outcome"] for r in rows(lake) if r["attempt_key"] == result.attempt_key] == ["crashed"]


def test_hanging_attempt_hits_its_lease_is_retried_then_recorded_as_timeout(engine, lake):
    began = time.monotonic()
    result = engine.run([request("hangs", mode="hang")], timeout_s=60)[0]
    assert (result.outcome, result.reward, result.tries) == ("timeout", 0.0, 2)
    assert f"lease of {LEASE_S}s expired on each of 2 tries" in result.error
    assert time.monotonic() - began >= 2 * LEASE_S
    tries = [(t, pid) for key, _, t, pid, _ in engine.start_log() if key == result.attempt_key]
    assert [t for t, _ in tries] == [1, 2]
    assert _gone([pid for _, pid in tries], within_s=30)  # the cancel killed both workers (asynchronously)
    assert [r["outcome"] for r in rows(lake) if r["attempt_key"] == result.attempt_key] == ["timeout"]


def test_a_work_error_is_recorded_once_without_retry(engine, lake):
    result = engine.run([request("broken", mode="raise", what="a broken candidate")])[0]
    assert (result.outcome, result.reward, result.tries) == ("error", 0.0, 1)
    assert result.error == "ValueError: no such thing as a broken candidate"


def test_a_failure_of_the_engine_is_not_final_the_next_request_runs_it_again(engine, lake, tmp_path):
    ask = request("transient", mode="raise_once", marker=str(tmp_path / "raised"))
    first = engine.run([ask])[0]
    assert first.outcome == "error" and "not there" in first.error
    second = engine.run([ask])[0]  # not answered from the failure row: it runs, and passes
    assert (second.outcome, second.cached) == ("passed", False)
    history = sorted((r["created_at"], r["outcome"]) for r in rows(lake) if r["attempt_key"] == ask.key)
    assert [outcome for _, outcome in history] == ["error", "passed"]
    third = engine.run([ask])[0]  # the final row answers from now on
    assert (third.outcome, third.cached) == ("passed", True)


def test_higher_priorities_start_first(engine, lake):
    lows = [request(f"low-{i}", "batch", priority=0, mode="sleep", s=0.4) for i in range(5)]
    highs = [request(f"high-{i}", "urgent", priority=5 + i) for i in range(3)]
    with TaskEngine(EngineConfig(workers=1, lease_s=30, flush_s=0.2), work, lake=lake) as one:
        batch = threading.Thread(target=one.run, args=(lows,))
        batch.start()
        deadline = time.monotonic() + 30
        while not one.start_log() and time.monotonic() < deadline:  # the first low one is running
            time.sleep(0.02)
        one.run(highs)
        batch.join(30)
        order = [key for key, *_ in one.start_log()]
    names = {r.key: r.task_id for r in lows + highs}
    assert [names[k] for k in order] == ["low-0", "high-2", "high-1", "high-0", "low-1", "low-2", "low-3", "low-4"]


CLAMP = 'def clamp(x, lo, hi):\n    """Clamp x into [lo, hi]."""\n    if x < lo:\n        return lo\n' \
        '    if x > hi:\n        return hi\n    return x\n'
CLAMP_TESTS = ("from calc.core import clamp\n\n\ndef test_low():\n    assert clamp(-5, 0, 10) == 0\n\n\n"
               "def test_high():\n    assert clamp(50, 0, 10) == 10\n")
REGISTRY = Path(os.environ.get("FACTORY_TEST_REGISTRY", Path(__file__).resolve().parents[2] / ".cache" / "registry"))


def test_real_tasks_are_scored_through_the_engine(engine, lake, tmp_path):
    """A function-completion task of a tiny repository built here (the envs builder, against the
    test mirror), scored by `ScoreWork` (factory.tasks.score in the sandbox) in Ray workers."""
    from factory.envs.build import build_repos
    from factory.envs.environment import Environment
    from factory.envs.registry import RegistryConfig
    from factory.envs.sources import RepoSet, RepoSource
    from factory.envs.testrun import test_sandbox_config
    from factory.sandbox import Sandbox
    from factory.tasks.derive import derive_tasks
    from factory.tasks.engine import ScoreWork
    from factory.tasks.model import DeriveConfig

    repo = tmp_path / "calc"
    files = {"pyproject.toml": '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
             '[project]\nname = "calc"\nversion = "0.1"\n', "calc/__init__.py": "", "calc/core.py": CLAMP,
             "tests/test_core.py": CLAMP_TESTS}
    for relative, text in files.items():
        (repo / relative).parent.mkdir(parents=True, exist_ok=True)
        (repo / relative).write_text(text)
    (record,) = build_repos(RepoSet(name="engine-fixture", repos=(RepoSource(name="calc", path=str(repo)),)),
                            home=tmp_path / "home", registry=RegistryConfig(index_url=(REGISTRY / "simple").as_uri()))
    assert record.failure_class.value == "passed", f"{record.failure_class}: {record.failure_detail}"
    env = Environment.load(record.env_uri.removeprefix("file://"))
    limits = test_sandbox_config(30)
    (task,) = derive_tasks(env, "function_completion", DeriveConfig(max_tasks=1, max_candidates=1), Sandbox(limits))

    asks = [AttemptRequest(task_id=task.task_id, candidate=task.reference, consumer="eval"),
            AttemptRequest(task_id=task.task_id, candidate="return lo", consumer="eval"),
            AttemptRequest(task_id=task.task_id, candidate=task.reference, consumer="rl")]
    with TaskEngine(EngineConfig(workers=2, lease_s=60, flush_s=0.2), ScoreWork([task], limits), lake=lake) as scorer:
        right, wrong, again = scorer.run(asks)
    assert (right.outcome, right.reward, right.tries) == ("passed", 1.0, 1)
    assert (wrong.outcome, wrong.reward) == ("failed", 0.0)
    assert json.loads(wrong.detail)["failing"] == ["tests/test_core.py::test_high"]
    assert again == right and right.consumers == ("eval", "rl")
    assert sum(r["task_id"] == task.task_id for r in rows(lake)) == 2


SECOND_DRIVER = """
import sys
from factory.lake import Lake
from factory.tasks.engine import AttemptRequest, EngineConfig, TaskEngine

def work(request):
    return {"outcome": "passed", "reward": 1.0}

config = EngineConfig(address=sys.argv[1], workers=2, attempt_cpus=0.01)  # leave the CPUs to the first driver
with TaskEngine(config, work, lake=Lake.open(home=sys.argv[2])) as engine:
    print("ready", flush=True)
    sys.stdin.readline()
    results = engine.run([AttemptRequest(task_id=f"two-drivers-{i}", candidate=sys.argv[3], consumer="second")
                          for i in range(12)])
    print("ran", sum(not r.cached for r in results), flush=True)
"""


def test_two_driver_processes_on_one_instance_record_each_key_once(engine, lake):
    import subprocess

    address = ray._private.worker._global_node.address  # the GCS, on 127.0.0.1
    candidate = request("any", mode="sleep", s=0.5).candidate  # the same pairs as this driver's (its work ignores it)
    second = subprocess.Popen([sys.executable, "-c", SECOND_DRIVER, address, str(lake.home), candidate],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert second.stdout.readline().strip() == "ready"
        second.stdin.write("go\n")
        second.stdin.flush()
        mine = engine.run([request(f"two-drivers-{i}", "first", mode="sleep", s=0.5) for i in range(12)], timeout_s=60)
        assert second.wait(60) == 0
        ran = int(second.stdout.readline().split()[1])
    finally:
        if second.poll() is None:
            second.kill()
    keys = {r.attempt_key for r in mine}
    assert len(keys) == 12
    table = [r for r in rows(lake) if r["task_id"].startswith("two-drivers-")]
    assert sorted(r["attempt_key"] for r in table) == sorted(keys)  # one row per key, whoever ran it
    assert {c for r in table for c in r["consumers"]} <= {"first", "second"}
    print(f"second driver ran {ran} of 12, this one {sum(not r.cached for r in mine)}")


def test_listens_on_loopback_only_and_close_leaves_no_ray_process(engine, lake):
    engine.run([request("before-close")])  # tasks.attempts exists whichever tests ran before this one
    pids = engine.processes()
    assert len(pids) >= 5  # gcs, raylet, agents, workers
    addresses = {c.laddr.ip for pid in pids if psutil.pid_exists(pid)
                 for c in psutil.Process(pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    assert addresses and addresses <= {"127.0.0.1", "::ffff:127.0.0.1"}, addresses
    session = ray._private.worker._global_node.get_session_dir_path()
    engine.close()
    assert not ray.is_initialized()
    with pytest.raises(EngineError, match="is closed"):
        engine.run([request("after-close")])
    assert [p for p in pids if _alive(p)] == []
    stragglers = [p.pid for p in psutil.process_iter(["cmdline"]) if session in " ".join(p.info["cmdline"] or ())]
    assert stragglers == []
    assert {f.name for f in TASK_ATTEMPTS.fields} <= set(lake.table("tasks.attempts").schema().column_names)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone(pids: list[int], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
