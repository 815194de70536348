"""What runs inside Ray for the task engine: one try of an attempt (`serve_attempt`) and the ledger of
tries (`Ledger`, a Ray actor).

Design: a try is a plain Ray task. Ray itself retries it when its worker process dies (a SIGKILL,
an OOM kill, a lost node), up to the `max_retries` it was submitted with: that is the engine's
at-least-once delivery, not code of ours. What Ray does not tell the driver is when a try started
and how many tries there were, so each try first reports to the ledger: the driver measures leases
from the start of the current try (not from submission: a task can wait for a worker process to
start, seconds on a busy node), the result carries its try number, and the ordered start log shows
which request started first (how priorities are checked). The ledger times everything on its own
clock, so a driver and workers on different hosts never compare clocks. A dispatch the driver gave
up at its lease is retired in the ledger: should Ray still retry that cancelled try (its worker
died), the retry learns it at its start and returns at once instead of running unwatched.

A work function's exception becomes an `error` result here instead of a Ray task failure: it is
the work's verdict on the request (a bug, a bad candidate), and serving it again would give the
same answer. Only deaths of the worker are retried.
"""

from __future__ import annotations

import collections
import functools
import os
import time

import ray

from factory.tasks.engine_model import ERROR, AttemptRequest, normalize

START_LOG = 10_000  # starts kept for `Ledger.log` (the per-key counts are separate and forgotten once recorded)


@ray.remote(num_cpus=0)
class Ledger:
    """Starts of tries, per attempt key and in order (one per engine; sequential, so no locks)."""

    def __init__(self) -> None:
        self._tries: dict[str, int] = {}
        self._current: dict[str, tuple[int, float]] = {}  # key -> (dispatch, monotonic start of its latest try)
        self._retired: dict[str, int] = {}  # key -> the latest dispatch the driver gave up at its lease
        self._log: collections.deque = collections.deque(maxlen=START_LOG)

    def started(self, key: str, dispatch: int, pid: int, node: str) -> int:
        """Record a try's start; its number (1 = first) among all tries of `key`, or 0 when the
        driver has given its dispatch up (a Ray retry of a try cancelled at its lease: it must not run)."""
        if dispatch <= self._retired.get(key, 0):
            return 0
        self._tries[key] = self._tries.get(key, 0) + 1
        self._current[key] = (dispatch, time.monotonic())
        self._log.append((key, dispatch, self._tries[key], pid, node))
        return self._tries[key]

    def running_for(self, probes: list[tuple[str, int]]) -> dict[str, float]:
        """Seconds since the latest try of each (key, dispatch) started; keys not started yet are left out."""
        now, out = time.monotonic(), {}
        for key, dispatch in probes:
            current = self._current.get(key)
            if current is not None and current[0] == dispatch:
                out[key] = now - current[1]
        return out

    def tries(self, keys: list[str]) -> dict[str, int]:
        return {key: self._tries.get(key, 0) for key in keys}

    def retire(self, probes: list[tuple[str, int]]) -> dict[str, int]:
        """Give up these (key, dispatch) at their lease: later starts of them do not run. Their tries so far."""
        for key, dispatch in probes:
            self._retired[key] = max(dispatch, self._retired.get(key, 0))
        return self.tries([key for key, _ in probes])

    def forget(self, keys: list[str]) -> None:
        """Drop the counts of recorded keys (the ledger stays small over millions of attempts)."""
        for key in keys:
            self._tries.pop(key, None)
            self._current.pop(key, None)
            self._retired.pop(key, None)

    def log(self) -> list[tuple[str, int, int, int, str]]:
        """(key, dispatch, try, pid, node) of the latest starts, oldest first."""
        return list(self._log)


def serve_attempt(work_holder: list, request: AttemptRequest, dispatch: int, ledger) -> dict:
    """One try: report the start, run the work on `request`, and return what the driver needs for the row.

    `work_holder` is `[ObjectRef of the work function]`: wrapped so that Ray passes the reference
    instead of the value, and each worker process fetches and unpickles the work once (a scorer
    carrying thousands of tasks would otherwise be unpickled on every try)."""
    work = _work(work_holder[0])
    pid = os.getpid()
    node = ray.get_runtime_context().get_node_id()[:12]
    tries = ray.get(ledger.started.remote(request.key, dispatch, pid, node))
    if tries == 0:  # given up already; nobody waits for this result
        return {"outcome": "retired", "reward": 0.0, "detail": "{}", "error": "", "tries": 0, "duration_s": 0.0,
                "worker": f"{node}/{pid}", "pid": pid}
    started = time.perf_counter()
    try:
        outcome, reward, detail = normalize(work(request))
        error = ""
    except Exception as exc:  # the work's verdict on this request; see the module docstring
        outcome, reward, detail, error = ERROR, 0.0, "{}", f"{type(exc).__name__}: {exc}"[:2000]
    return {"outcome": outcome, "reward": reward, "detail": detail, "error": error, "tries": tries,
            "duration_s": time.perf_counter() - started, "worker": f"{node}/{pid}", "pid": pid}


serve_remote = ray.remote(serve_attempt)
_WORKS: dict[str, object] = {}  # this worker process's work functions, by object id


def _work(ref):
    if ref.hex() not in _WORKS:
        if len(_WORKS) >= 8:  # engines come and go in one cluster; keep the newest few
            _WORKS.clear()
        _WORKS[ref.hex()] = ray.get(ref)
    return _WORKS[ref.hex()]


class ScoreWork:
    """The engine's work for real tasks: `factory.tasks.score.score_candidate` on the task named by
    `request.task_id`, in a sandbox built once per worker process from `sandbox` (a SandboxConfig)."""

    def __init__(self, tasks, sandbox) -> None:
        self.tasks = {task.task_id: task for task in tasks}
        self.sandbox = sandbox

    def __call__(self, request: AttemptRequest):
        from factory.tasks.score import score_candidate

        task = self.tasks.get(request.task_id)
        if task is None:
            raise KeyError(f"task {request.task_id!r} is not among the {len(self.tasks)} tasks this engine serves")
        return score_candidate(task, request.candidate, _sandbox(self.sandbox))


@functools.lru_cache(maxsize=4)
def _sandbox(config):
    from factory.sandbox import Sandbox

    return Sandbox(config)
