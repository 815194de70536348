"""Optional per-execution cgroups (v1 `pids` and `memory`): a hard cap on the whole process tree.

Why, when rlimits exist: RLIMIT_AS caps each process, not the tree, so 64 processes of 1 GiB each
are 64 GiB; and tmpfs pages written to /tmp count towards no rlimit at all. A memory cgroup caps the
sum, and its OOM kill is recorded, so such a death is classified as oom rather than a crash. A pids
cgroup backs RLIMIT_NPROC up.

Design: one child cgroup per execution under the cgroup this process already lives in (so any limit
the machine set on us still applies above it), joined by a `/bin/sh` wrapper that writes its own pid
and then execs bubblewrap, so every descendant is born inside and nothing races the move. Afterwards
every process left in it is killed and the directory removed.

Fallback (documented in the module and in the pool): where cgroup v1 is not mounted or not writable
(cgroup v2 hosts, unprivileged users, most CI runners) `create` returns None once and for all, and
the sandbox relies on rlimits plus the per-execution uid, which still contain a fork bomb, and on
the launcher's /tmp and /dev/shm, capped in bytes and in inodes (tmpfs inodes are kernel memory a
memory cgroup would have counted; see launcher.py), and on the seccomp filter's refusal of SysV
shared memory, the other memory no rlimit sees (seccomp.py).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)

V1_MOUNT = Path("/sys/fs/cgroup")
HEADROOM_MB = 64  # bubblewrap and the launcher live in the cgroup too; the program's RLIMIT_AS should bind first
_COUNTER = itertools.count()


@functools.cache
def _own_dir(controller: str) -> Path | None:
    """This process's cgroup directory for a v1 controller, if mounted where we expect and writable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            directory = V1_MOUNT / controller / path.lstrip("/")
            # Trust the guess only if we are really listed there (a cgroup namespace can shift paths).
            procs = directory / "cgroup.procs"
            if procs.is_file() and os.access(directory, os.W_OK) and str(os.getpid()) in procs.read_text().split():
                return directory
    return None


class CgroupScope:
    """The cgroups of one execution; use `wrap` on its command, then `remove` when it is over."""

    def __init__(self, dirs: dict[str, Path]):
        self.dirs = dirs

    @classmethod
    def create(cls, *, max_processes: int, memory_mb: int) -> CgroupScope | None:
        """New pids+memory cgroups for one execution, or None where cgroup v1 is not ours to write."""
        global _USABLE
        if not _usable():
            return None
        name = f"factory-sandbox-{os.getpid()}-{next(_COUNTER)}"
        memory = (memory_mb + HEADROOM_MB) << 20
        settings = {
            "pids": {"pids.max": max_processes + 4},  # + sh/bwrap, bwrap's init, the launcher
            "memory": {"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory, "memory.swappiness": 0},
        }
        scope = cls({})
        try:
            for controller, values in settings.items():
                directory = _own_dir(controller) / name  # type: ignore[operator]  # _usable() checked both
                directory.mkdir()
                scope.dirs[controller] = directory
                for key, value in values.items():
                    if (directory / key).exists():  # memsw only exists with swap accounting on
                        (directory / key).write_text(str(value))
        except OSError as exc:
            log.warning("sandbox: cgroup v1 not usable (%r); relying on rlimits and a private uid", exc)
            scope.remove()
            _USABLE = False  # one warning, then the fallback for the life of the process
            return None
        return scope

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run by a shell that first joins every cgroup of this scope."""
        procs = [str(d / "cgroup.procs") for d in self.dirs.values()]
        joins = " && ".join(f'echo $$ > "${i}"' for i in range(1, len(procs) + 1))
        return ["/bin/sh", "-c", f'{joins} && shift {len(procs)} && exec "$@"', "sh", *procs, *argv]

    def oom_killed(self) -> bool:
        """Whether the memory cgroup's OOM killer fired (or, on kernels without the counter, it hit the cap)."""
        directory = self.dirs.get("memory")
        if directory is None:
            return False
        fields = dict(line.split() for line in (directory / "memory.oom_control").read_text().splitlines())
        if "oom_kill" in fields:
            return int(fields["oom_kill"]) > 0
        return int((directory / "memory.failcnt").read_text()) > 0

    def kill_all(self) -> None:
        """SIGKILL every process still in the scope (belt and braces next to the pid namespace)."""
        for directory in self.dirs.values():
            for pid in _pids(directory):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def remove(self) -> None:
        """Kill what is left and delete the cgroups; rmdir fails while killed tasks are still exiting."""
        for directory in self.dirs.values():
            deadline = time.monotonic() + 5.0
            while directory.exists():
                self.kill_all()
                try:
                    directory.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        log.warning("sandbox: could not remove cgroup %s", directory)
                        break
                    time.sleep(0.002)


_USABLE: bool | None = None  # decided on first use; tests set it to False to exercise the fallback


def _usable() -> bool:
    global _USABLE
    if _USABLE is None:
        _USABLE = _own_dir("pids") is not None and _own_dir("memory") is not None
    return _USABLE


def _pids(directory: Path) -> list[int]:
    try:
        return [int(p) for p in (directory / "cgroup.procs").read_text().split()]
    except OSError:
        return []
