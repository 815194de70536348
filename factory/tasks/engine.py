"""The task engine: serves (task, candidate) attempts to consumers on Ray and records each once.

    with TaskEngine(EngineConfig(workers=4, lease_s=120), work, lake=lake) as engine:
        results = engine.run([AttemptRequest(task_id=t, candidate=c, consumer="eval/repo_tasks")], progress=cb)

`work(request) -> {outcome, reward, ...}` is any picklable function, run in Ray worker processes;
`ScoreWork(tasks, sandbox_config)` is the one for real tasks (factory.tasks.score). Consumers are
threads that call `run` at the same time (each call blocks until its own requests are recorded), or
separate driver processes that each open an engine on one cluster (`address`): in one engine
duplicates collapse before they run; across engines both may run a key, and the table's
read-check-write commit keeps one row.

Design: Ray does the distributed work: tasks, retries of a try whose worker died (`max_retries`),
`ray.wait`, and `ray.cancel(force=True)` to end a try past its lease (which kills its worker, and
with it the sandbox: bubblewrap dies with its parent). The engine only decides what to submit
next: at most `workers` tries are in flight, and the rest wait in a heap ordered by priority, so a
late urgent request overtakes waiting ones (Ray has no task priorities, and queueing everything in
Ray would start them in submission order). A try past its lease is served again while tries remain,
then recorded as `timeout`; a try whose worker died on every retry is `crashed`.

Threads: `run` only hands requests to the dispatcher thread (which owns the heap and the in-flight
tries) and waits; a writer thread commits finished results in batches (`engine_store`), so a commit
never holds up dispatching; each waiter gets its results after the commit that makes them durable.
A key already in the table is answered from it without running (`cached=True`); the engine remembers
the final rows it wrote or read (up to `MEMO` keys), so a key asked again (an RL policy that repeats a
completion) is answered without scanning the table.

Local Ray: `ray.init(address="local")` on 127.0.0.1 without a dashboard, for the engine's lifetime;
on this 2-core machine it takes ~10-15 s and its processes hold ~1 GB (see `processes`). An engine
opened while Ray is already initialized uses that instance and leaves it running.
"""

from __future__ import annotations

import collections
import datetime as dt
import heapq
import itertools
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

import ray

from factory.lake import Lake
from factory.tasks.engine_model import (CRASHED, TIMEOUT, AttemptRequest, AttemptResult, EngineConfig,
                                        attempt_key, candidate_hash)
from factory.tasks.engine_ray import ray_processes, start_ray, stop_ray
from factory.tasks.engine_store import commit_results, recorded
from factory.tasks.engine_worker import Ledger, ScoreWork, serve_remote

__all__ = ["AttemptRequest", "AttemptResult", "EngineConfig", "EngineError", "ScoreWork", "TaskEngine", "attempt_key"]
log = logging.getLogger(__name__)
MEMO = 100_000  # final rows the engine keeps in memory to answer repeated keys without a table scan


class EngineError(RuntimeError):
    """The engine could not deliver a consumer's results (closed, failed, or the wait timed out)."""


@dataclass(eq=False)
class _Waiter:
    """One `run` call: its results arrive on `inbox` as (key, AttemptResult) or an exception."""

    keys: set[str]
    inbox: queue.Queue = field(default_factory=queue.Queue)


@dataclass
class _Entry:
    """One attempt key while the engine holds it (queued, running, or finished and not yet committed)."""

    request: AttemptRequest
    consumers: set[str]
    priority: int
    waiters: list[_Waiter]
    state: str = "queued"  # queued | running | done
    dispatch: int = 0  # submissions so far (a lease expiry submits again)
    tries: int = 0  # starts the ledger had counted at the last expiry
    check_at: float = 0.0  # monotonic time to ask the ledger about the lease again
    out: dict | None = None


class TaskEngine:
    """Runs attempts of `work` on Ray under `config` and records them in `lake` (see the module docstring)."""

    def __init__(self, config: EngineConfig, work, *, lake: Lake | None = None, asset_key: str = "tasks/attempts"):
        self.config, self.lake, self.asset_key = config, lake or Lake.open(), asset_key
        self.run_id = f"engine-{uuid.uuid4().hex[:12]}"
        started = time.perf_counter()
        self._owns_ray = start_ray(config)
        self.init_s = time.perf_counter() - started  # what starting (or joining) Ray took
        try:
            self._work = ray.put(work)  # shipped to the object store once, not pickled into every try
            self._ledger = Ledger.remote()
        except BaseException:  # e.g. an unpicklable work function: do not leave our instance running
            if self._owns_ray:
                stop_ray()
            raise
        self._sign = -1 if config.priority_order == "higher_first" else 1
        self._requests: queue.Queue = queue.Queue()
        self._batches: queue.Queue = queue.Queue()
        self._entries: dict[str, _Entry] = {}  # the dispatcher's (read by the others only once it failed)
        self._committing: dict[str, _Entry] = {}  # handed to the writer; under _lock
        self._lock = threading.Lock()
        self._heap: list[tuple[int, int, str]] = []
        self._order = itertools.count()
        self._inflight: dict[ray.ObjectRef, str] = {}
        self._pending: list[str] = []
        self._pending_since = 0.0
        self._closing = threading.Event()
        self._closed = False
        self._memo: collections.OrderedDict[str, AttemptResult] = collections.OrderedDict()  # under _lock
        self._failure: BaseException | None = None
        self._dispatcher = threading.Thread(target=self._guard, args=(self._dispatch_loop,), daemon=True,
                                            name="task-engine-dispatch")
        self._writer = threading.Thread(target=self._guard, args=(self._write_loop,), daemon=True,
                                        name="task-engine-write")
        self._dispatcher.start()
        self._writer.start()

    def __enter__(self) -> "TaskEngine":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    # -- consumers -------------------------------------------------------------------------------
    def run(self, requests: list[AttemptRequest], progress=None, *,
            timeout_s: float | None = None) -> list[AttemptResult]:
        """Score `requests` (duplicates allowed); one result each, in request order, once recorded.

        `progress(done, total)` is called in this thread as unique keys are recorded. Safe to call
        from several threads at once. Raises EngineError when the engine fails or closes first, or
        when `timeout_s` passes (the attempts go on; a later call gets their rows)."""
        waiter = _Waiter(keys={r.key for r in requests})
        with self._lock:  # against close: a request is either queued before the final drain or refused
            if self._failure is not None or self._closing.is_set():
                raise EngineError(f"task engine {self.run_id} is {'failed' if self._failure else 'closed'}") \
                    from self._failure
            if not requests:
                return []
            self._requests.put((waiter, list(requests)))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        results: dict[str, AttemptResult] = {}
        while len(results) < len(waiter.keys):
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                item = waiter.inbox.get(timeout=wait)
            except queue.Empty:
                raise EngineError(f"{len(waiter.keys) - len(results)} of {len(waiter.keys)} attempts not recorded "
                                  f"within timeout_s={timeout_s}") from None
            if isinstance(item, BaseException):
                raise EngineError(f"task engine {self.run_id} stopped before recording "
                                  f"{len(waiter.keys) - len(results)} attempts: {item}") from item
            results[item[0]] = item[1]
            if progress is not None:
                progress(len(results), len(waiter.keys))
        return [results[r.key] for r in requests]

    def start_log(self) -> list[tuple[str, int, int, int, str]]:
        """(attempt key, dispatch, try, pid, node) of the latest try starts, oldest first."""
        return ray.get(self._ledger.log.remote())

    def processes(self) -> list[int]:
        """PIDs of the local Ray instance's processes (gcs, raylet, agents, workers); [] when not ours."""
        return ray_processes() if self._owns_ray else []

    @property
    def closed(self) -> bool:
        """True once `close` ran: the engine serves nothing more."""
        return self._closed

    def close(self) -> None:
        """Commit what finished, cancel what did not (its waiters get EngineError), stop Ray if ours."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._closing.set()
        self._requests.put(None)
        self._dispatcher.join()
        self._batches.put(None)
        self._writer.join()
        if ray.is_initialized():
            ray.kill(self._ledger)
            if self._owns_ray:
                stop_ray()

    # -- dispatcher thread -------------------------------------------------------------------------
    def _guard(self, loop) -> None:
        try:
            loop()
        except BaseException as exc:  # noqa: BLE001 - handed to every waiter, then re-raised by run
            log.exception("task engine %s failed", self.run_id)
            self._failure = exc
            with self._lock:
                self._closing.set()
                waiters = {id(w): w for e in [*self._entries.values(), *self._committing.values()] for w in e.waiters}
            for waiter in waiters.values():
                waiter.inbox.put(exc)
            self._refuse_queued(exc)

    def _refuse_queued(self, exc: BaseException) -> None:
        """Fail the `run` calls whose requests were queued but never admitted."""
        with self._lock:
            while True:
                try:
                    item = self._requests.get_nowait()
                except queue.Empty:
                    return
                if item is not None:
                    item[0].inbox.put(exc)

    def _dispatch_loop(self) -> None:
        while not self._closing.is_set():
            idle = not self._inflight and not self._heap
            self._admit(block=idle)
            self._submit()
            self._collect()
            self._expire()
            self._hand_over(force=False)
        for ref in self._inflight:
            ray.cancel(ref, force=True)
        if self._failure is None:
            self._hand_over(force=True)  # finished work is recorded, even at close
        closed = self._failure or EngineError(f"task engine {self.run_id} closed before serving this attempt")
        for entry in self._entries.values():
            for waiter in entry.waiters:
                waiter.inbox.put(closed)
        self._refuse_queued(closed)

    def _admit(self, *, block: bool) -> None:
        arrivals = []
        try:
            arrivals.append(self._requests.get(timeout=0.2 if block else 0))
            while True:
                arrivals.append(self._requests.get_nowait())
        except queue.Empty:
            pass
        for item in arrivals:
            if item is not None:
                self._admit_one(*item)

    def _admit_one(self, waiter: _Waiter, requests: list[AttemptRequest]) -> None:
        new: dict[str, AttemptRequest] = {}
        for request in requests:
            key = request.key
            with self._lock:  # the writer reads waiters and consumers of entries it commits
                held = self._entries.get(key) or self._committing.get(key)
                if held is not None:
                    held.consumers.add(request.consumer)
                    if waiter not in held.waiters:
                        held.waiters.append(waiter)
            if held is not None:
                if held.state == "queued" and self._sign * request.priority < self._sign * held.priority:
                    held.priority = request.priority  # a more urgent ask moves it up; the old heap item goes stale
                    heapq.heappush(self._heap, (self._sign * held.priority, next(self._order), key))
            elif key in new:
                new[key] = new[key] if self._sign * new[key].priority <= self._sign * request.priority else request
            else:
                new[key] = request
        consumers: dict[str, set[str]] = {}
        for request in requests:
            consumers.setdefault(request.key, set()).add(request.consumer)
        with self._lock:
            known = {key: self._memo[key] for key in new if key in self._memo}
        for key, row in (known | recorded(self.lake, self.config.table, [k for k in new if k not in known])).items():
            del new[key]
            self._remember(row)
            waiter.inbox.put((key, row))
        for key, request in new.items():
            self._entries[key] = _Entry(request, consumers[key], request.priority, [waiter])
            heapq.heappush(self._heap, (self._sign * request.priority, next(self._order), key))

    def _submit(self) -> None:
        while self._heap and len(self._inflight) < self.config.workers:
            rank, _, key = heapq.heappop(self._heap)
            entry = self._entries.get(key)
            if entry is None or entry.state != "queued" or rank != self._sign * entry.priority:
                continue  # stale: already running or done, or re-queued at another priority
            entry.state, entry.dispatch = "running", entry.dispatch + 1
            entry.check_at = time.monotonic() + self.config.lease_s
            options = {"max_retries": max(0, self.config.max_retries - entry.tries), "retry_exceptions": False,
                       "num_cpus": self.config.attempt_cpus}
            ref = serve_remote.options(**options).remote([self._work], entry.request, entry.dispatch, self._ledger)
            self._inflight[ref] = key

    def _collect(self) -> None:
        if not self._inflight:
            return
        ready, rest = ray.wait(list(self._inflight), num_returns=1, timeout=self.config.tick_s)
        if ready and rest:
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        for ref in ready:
            entry = self._entries[self._inflight.pop(ref)]
            try:
                out = ray.get(ref)
            except ray.exceptions.RayError as exc:  # the worker died on every try Ray gave it (or Ray failed the task)
                tries = ray.get(self._ledger.tries.remote([entry.request.key]))[entry.request.key]
                out = _failed(CRASHED, tries, f"{type(exc).__name__}: {str(exc).strip()[:1500]}")
            self._done(entry, out)

    def _expire(self) -> None:
        now = time.monotonic()
        due = [(ref, key) for ref, key in self._inflight.items() if self._entries[key].check_at <= now]
        if not due:
            return
        running = ray.get(self._ledger.running_for.remote([(k, self._entries[k].dispatch) for _, k in due]))
        expired = []
        for ref, key in due:
            elapsed = running.get(key)
            if elapsed is None or elapsed < self.config.lease_s:  # not started yet, or time left
                left = self.config.tick_s if elapsed is None else self.config.lease_s - elapsed
                self._entries[key].check_at = now + left
            else:
                expired.append((ref, key))
        if not expired:
            return
        # A try whose worker died and whose Ray retry has not started yet also looks expired here
        # (its start is the dead try's): it is cancelled and served again all the same, within the
        # same bound on starts; only when that was the last try is it recorded as timeout, not crashed.
        tries = ray.get(self._ledger.retire.remote([(k, self._entries[k].dispatch) for _, k in expired]))
        for ref, key in expired:
            ray.cancel(ref, force=True)  # kills the worker process, and the sandbox under it; should Ray
            # still retry it (its worker died), the retired dispatch makes that try return at once
            del self._inflight[ref]
            entry = self._entries[key]
            entry.tries = tries[key]
            if entry.tries <= self.config.max_retries:
                entry.state = "queued"  # served again, in its place by priority
                heapq.heappush(self._heap, (self._sign * entry.priority, next(self._order), key))
            else:
                self._done(entry, _failed(TIMEOUT, entry.tries, f"lease of {self.config.lease_s}s expired on "
                                                               f"each of {entry.tries} tries"))

    def _done(self, entry: _Entry, out: dict) -> None:
        entry.state, entry.out = "done", out
        if not self._pending:
            self._pending_since = time.monotonic()
        self._pending.append(entry.request.key)

    def _hand_over(self, *, force: bool) -> None:
        """Pass finished results to the writer when a batch is full, old enough, or nothing else is running."""
        if not self._pending:
            return
        quiet = not self._inflight and not self._heap
        if not (force or quiet or len(self._pending) >= self.config.batch_rows
                or time.monotonic() - self._pending_since >= self.config.flush_s):
            return
        with self._lock:
            batch = [self._entries.pop(key) for key in self._pending]
            self._committing.update((e.request.key, e) for e in batch)
        self._pending = []
        self._batches.put(batch)

    # -- writer thread -----------------------------------------------------------------------------
    def _write_loop(self) -> None:
        while (batch := self._batches.get()) is not None:
            results = [self._result(entry) for entry in batch]
            _, theirs = commit_results(self.lake, self.config, results, asset_key=self.asset_key, run_id=self.run_id)
            self._ledger.forget.remote([r.attempt_key for r in results])
            for result in results:
                self._remember(theirs.get(result.attempt_key, result))
            with self._lock:
                for result in results:
                    entry = self._committing.pop(result.attempt_key)
                    for waiter in entry.waiters:
                        waiter.inbox.put((result.attempt_key, theirs.get(result.attempt_key, result)))

    def _remember(self, row: AttemptResult) -> None:
        if row.error:  # only final rows answer a request again
            return
        with self._lock:
            self._memo[row.attempt_key] = row if row.cached else row.model_copy(update={"cached": True})
            self._memo.move_to_end(row.attempt_key)
            while len(self._memo) > MEMO:
                self._memo.popitem(last=False)

    def _result(self, entry: _Entry) -> AttemptResult:
        request, out = entry.request, entry.out
        with self._lock:
            consumers = tuple(sorted(entry.consumers))
        return AttemptResult(attempt_key=request.key, task_id=request.task_id,
                             candidate_hash=candidate_hash(request.candidate), consumers=consumers,
                             priority=entry.priority, engine_run=self.run_id,
                             created_at=dt.datetime.now(dt.timezone.utc), **out)


def _failed(outcome: str, tries: int, error: str) -> dict:
    return {"outcome": outcome, "reward": 0.0, "detail": "{}", "error": error, "tries": tries, "duration_s": 0.0,
            "worker": "", "pid": None}
