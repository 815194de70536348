"""`Sandbox`: a pool that runs untrusted Python programs under bubblewrap, `workers` at a time.

Design: each execution is a fresh bubblewrap process (see runner.py), so the pool is only a bounded
semaphore plus a thread pool for `map`; threads are enough because each one just waits on a child
process. `map_checked` runs checked.py's harness programs and judges each by its end-of-check
marker, never by exit status alone: that is how every eval, validator and reward runs code.

Construction is eager: it proves bubblewrap works here and that the interpreter starts inside under
these limits, so a misconfigured machine fails at `Sandbox(...)`, not on the first of a thousand
programs.

Processes as root: the kernel never enforces RLIMIT_NPROC for uid 0, so when the host runs as root
each execution gets its own unprivileged uid from `_UidPool` for as long as it runs; RLIMIT_NPROC
then counts exactly that execution's processes (a shared uid would make concurrent executions share
one budget). As any other user bubblewrap's user namespace gives each execution its own count. Where
cgroup v1 is writable, per-execution pids and memory cgroups cap the tree as well (cgroup.py).
"""

from __future__ import annotations

import functools
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager

from factory.health import metrics as health
from factory.sandbox.bwrap import require_bwrap, resolve_interpreter
from factory.sandbox.checked import CheckedProgram, CheckVerdict, verdict
from factory.sandbox.config import ExecResult, Mount, Outcome, SandboxConfig, SandboxUnavailable
from factory.sandbox.runner import execute

_DEFAULT = SandboxConfig()


class _UidPool:
    """Unprivileged uids handed to running executions, one each, when the host is root.

    The range sits below 65534 (nobody) and above the usual login uids, and inside the 65536 uids a
    rootless container maps. The start is random so two pools in different processes rarely pick
    the same uid; if they do, the two executions only share a process budget (they cannot see each
    other: each has its own pid namespace and filesystem view).
    """

    FIRST, COUNT = 40_000, 20_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy: set[int] = set()
        self._next = random.randrange(self.COUNT)

    @contextmanager
    def lease(self) -> Iterator[int]:
        """A uid for one execution, or -1 when we are not root (bubblewrap's user namespace suffices)."""
        if os.geteuid() != 0:
            yield -1
            return
        with self._lock:
            while (uid := self.FIRST + self._next % self.COUNT) in self._busy:
                self._next += 1
            self._next += 1
            self._busy.add(uid)
        try:
            yield uid
        finally:
            with self._lock:
                self._busy.discard(uid)


_UIDS = _UidPool()


class Sandbox:
    """Runs untrusted Python code under bubblewrap with the limits of `config`, `workers` at a time."""

    def __init__(self, config: SandboxConfig = _DEFAULT):
        self.config = config
        self._bwrap = require_bwrap()
        self._python = resolve_interpreter(config.python)
        self._slots = threading.BoundedSemaphore(config.workers)
        problem = _interpreter_problem(config, self._bwrap, self._python)
        if problem:
            raise SandboxUnavailable(problem)

    def run(self, code: str, *, stdin: str = "", mounts: tuple[Mount, ...] = (), env: dict[str, str] | None = None,
            cwd: str = "/tmp") -> ExecResult:
        """Run one program (the text of a `__main__` module) with `stdin` as its standard input.

        `mounts` bind host directories inside (a repository, its environment), `env` adds variables
        to the clean environment, `cwd` is where the program starts (a mount's path, or /tmp).
        """
        queued = time.perf_counter()
        with self._slots, _UIDS.lease() as uid:
            started = time.perf_counter()  # the wait for a slot is the pool's queue (factory_sandbox_queue_wait_seconds)
            for mount in mounts:
                if mount.owned and uid >= 0:
                    _chown_tree(mount.host, uid)
            result = execute(self.config, code, stdin=stdin, bwrap=self._bwrap, python=self._python, uid=uid,
                             mounts=mounts, env=env, cwd=cwd)
        health.sandbox_execution(result.outcome.value, started - queued, time.perf_counter() - started)
        return result

    def map(self, codes: list[str], progress: Callable[[int, int], None] | None = None, *,
            stdins: list[str] | None = None) -> list[ExecResult]:
        """Run every program, `workers` at a time; results in input order.

        `stdins[i]` is program i's standard input (default: empty). `progress(done, total)` is
        called from this thread after each program finishes.
        """
        if stdins is not None and len(stdins) != len(codes):
            raise ValueError(f"{len(stdins)} stdins for {len(codes)} programs: give one per program")
        inputs = stdins if stdins is not None else [""] * len(codes)
        results: list[ExecResult | None] = [None] * len(codes)
        with ThreadPoolExecutor(self.config.workers, thread_name_prefix="sandbox") as pool:
            futures = {pool.submit(self.run, code, stdin=stdin): index
                       for index, (code, stdin) in enumerate(zip(codes, inputs))}
            try:
                for done, future in enumerate(as_completed(futures), start=1):
                    results[futures[future]] = future.result()
                    if progress is not None:
                        progress(done, len(codes))
            except BaseException:
                pool.shutdown(cancel_futures=True)  # do not start the rest; running ones finish
                raise
        return results  # type: ignore[return-value]  # every slot was filled above

    def map_checked(self, programs: list[CheckedProgram],
                    progress: Callable[[int, int], None] | None = None) -> list[CheckVerdict]:
        """Run checked programs (checked.py) like `map`; a verdict each, PASSED only if the checks ran to the end."""
        results = self.map([p.text for p in programs], progress, stdins=[p.stdin for p in programs])
        return [verdict(result, program.nonce) for program, result in zip(programs, results)]


def _chown_tree(root: str, uid: int) -> None:
    """Give `root` and everything under it (links themselves, not their targets) to `uid`."""
    os.chown(root, uid, uid, follow_symlinks=False)
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(directory, name), uid, uid, follow_symlinks=False)


@functools.lru_cache(maxsize=64)
def _interpreter_problem(config: SandboxConfig, bwrap: str, python: str) -> str | None:
    """Why `python` cannot run a trivial program in the sandbox under `config`, or None (cached)."""
    with _UIDS.lease() as uid:
        result = execute(config, "import sys\nprint(sys.version_info[0])", stdin="", bwrap=bwrap, python=python, uid=uid)
    if result.outcome is Outcome.PASSED and result.stdout.strip() == "3":
        return None
    return (
        f"interpreter {python} cannot run inside the sandbox under {config!r}: "
        f"{result.outcome.value} ({result.reason}); stderr: {result.stderr.strip()[-1000:]!r}"
    )
