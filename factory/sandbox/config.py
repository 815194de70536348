"""The sandbox's vocabulary: its limits (`SandboxConfig`), what one execution came to (`ExecResult`,
`Outcome`), and the error raised when no sandbox can be built (`SandboxUnavailable`).

Design: the config is a frozen pydantic model whose every field carries its unit, so a pool's limits
are one hashable value (the interpreter probe is cached on it). `classify` is the single place that
turns a wait status into an outcome, so the rules (documented on `Outcome`) are read in one spot and
tested without starting a sandbox.

Why `reason`: a bare "failed" hides whether a program raised, was cut by the file-size limit, or ran
out of memory; every result says which rule fired, and tests assert on it.
"""

from __future__ import annotations

import signal
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field


class SandboxUnavailable(RuntimeError):
    """No sandbox can be built here (bubblewrap missing, too old, or namespaces refused).

    Raised instead of ever running code unsandboxed; the message names what is missing and the fix.
    """


class SandboxConfig(BaseModel):
    """Limits of one sandboxed execution, and the width of the pool that runs them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout_s: float = Field(10.0, gt=0, description="Wall-clock limit per execution (seconds); the whole process tree is killed.")
    cpu_s: int = Field(10, gt=0, description="RLIMIT_CPU per process (CPU seconds): SIGXCPU at the limit, SIGKILL one second later.")
    memory_mb: int = Field(1024, gt=0, description="RLIMIT_AS per process (MiB); also the total cap of the memory cgroup where one is writable.")
    max_processes: int = Field(64, gt=0, description="Processes and threads the program may hold at once (RLIMIT_NPROC; pids cgroup where writable).")
    max_file_mb: int = Field(16, gt=0, description="RLIMIT_FSIZE (MiB): the largest file the program may write.")
    tmp_mb: int = Field(64, gt=0, description="Size of each private tmpfs, /tmp and /dev/shm (MiB).")
    tmp_files: int = Field(
        4096, gt=0,
        description="Files, directories and links each private tmpfs may hold (its nr_inodes): inodes are "
        "host kernel memory that no size cap or rlimit counts.",
    )
    max_output_bytes: int = Field(4096, ge=0, description="Bytes of stdout and of stderr kept each (bytes); the rest is read and dropped.")
    workers: int = Field(2, gt=0, description="Executions running at once (processes of the pool).")
    python: str | None = Field(None, description="Interpreter run inside the sandbox (path); None = sys.executable.")
    harden: bool = Field(
        True,
        description="Seccomp filter, inode-capped scratch tmpfs, only /sys/devices/system/cpu of /sys and "
        "masked /proc entries. False rebuilds the older, weaker sandbox, only to measure the cost (bench).",
    )


class Mount(BaseModel):
    """A host directory bound into the sandbox at `path` (read-only unless `writable`).

    For programs that work on trees of files (a repository's environment and sources, a wheelhouse):
    the host side stays where it is, the sandbox sees it at a fixed path, so what is built inside
    (a venv's shebangs, an editable install's finder) names the same paths on every host. A writable
    mount is written by the execution's unprivileged uid: give it a directory that uid may write.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(description="Absolute host path of an existing directory.")
    path: str = Field(pattern=r"^/[A-Za-z0-9_\-]+(/[A-Za-z0-9_.\-]+)*$",
                      description="Absolute path inside the sandbox; not under /tmp, /dev, /proc, /sys, /usr or /etc.")
    writable: bool = Field(False, description="Bind read-write instead of read-only.")
    owned: bool = Field(False, description="Hand the tree to the execution's uid before it starts (a scratch copy "
                        "whose programs set file times or modes, which only an owner may).")

    def model_post_init(self, _context) -> None:
        top = self.path.split("/")[1]
        if top in ("tmp", "dev", "proc", "sys", "usr", "etc", "sandbox", "bin", "lib", "lib64", "sbin"):
            raise ValueError(f"mount path {self.path!r} would shadow the sandbox's own /{top}")
        if not self.host.startswith("/"):
            raise ValueError(f"mount host path {self.host!r} must be absolute")


class Outcome(str, Enum):
    """How an execution ended.

    passed: exit status 0. failed: a nonzero exit (an uncaught exception, sys.exit(n), a write cut by
    the file-size limit). oom: MemoryError on stderr, or SIGKILL by the memory cgroup. timeout: the
    wall clock ran out, or RLIMIT_CPU fired (SIGXCPU, or SIGKILL after cpu_s CPU seconds). crashed:
    killed by any other signal (SIGSEGV, SIGABRT, ...).
    """

    PASSED = "passed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    OOM = "oom"
    CRASHED = "crashed"


class ExecResult(BaseModel):
    """What one execution came to."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    outcome: Outcome
    reason: str = Field(description="Which classification rule fired, in words (e.g. 'signal SIGSEGV').")
    returncode: int | None = Field(description="Exit status; -N when killed by signal N; None when killed on the wall clock.")
    stdout: str = Field(description="The first max_output_bytes of stdout, decoded as UTF-8 (invalid bytes replaced).")
    stderr: str = Field(description="The first max_output_bytes of stderr, decoded likewise.")
    truncated: bool = Field(description="True when stdout or stderr was longer than max_output_bytes.")
    duration_s: float = Field(description="Wall-clock time from start to reaping the sandbox (seconds).")
    cpu_s: float | None = Field(None, description="User+system CPU time of the program's main process (seconds); None if unknown.")


def classify(
    status: int | None, *, stderr: str, wall_timeout: bool, cpu_s: float | None, limit_cpu_s: int, cgroup_oom: bool
) -> tuple[Outcome, str, int | None]:
    """(outcome, reason, returncode) for a program's wait status (None: it was killed on the wall clock)."""
    if wall_timeout or status is None:
        return Outcome.TIMEOUT, "wall-clock timeout", None
    if _is_signaled(status):
        sig = _signal_of(status)
        name = _signal_name(sig)
        if sig == signal.SIGXCPU:
            return Outcome.TIMEOUT, f"cpu limit {limit_cpu_s}s ({name})", -sig
        if sig == signal.SIGKILL:
            if cgroup_oom:
                return Outcome.OOM, "killed by the memory cgroup (SIGKILL)", -sig
            if cpu_s is not None and cpu_s >= limit_cpu_s:
                return Outcome.TIMEOUT, f"cpu limit {limit_cpu_s}s (SIGKILL after {cpu_s:.1f} CPU s)", -sig
        if sig == signal.SIGXFSZ:
            return Outcome.FAILED, f"file-size limit ({name})", -sig
        return Outcome.CRASHED, f"signal {name}", -sig
    code = _exit_code(status)
    if code == 0:
        return Outcome.PASSED, "exit 0", 0
    if "MemoryError" in stderr:
        return Outcome.OOM, f"MemoryError (exit {code})", code
    if cgroup_oom:
        return Outcome.OOM, f"memory cgroup hit its limit (exit {code})", code
    return Outcome.FAILED, f"exit {code}", code


# Wait-status decoding kept local (os.W* are the same, but naming them here keeps classify pure and
# testable with plain ints on any platform).
def _is_signaled(status: int) -> bool:
    return (status & 0x7F) not in (0, 0x7F)


def _signal_of(status: int) -> int:
    return status & 0x7F


def _exit_code(status: int) -> int:
    return (status >> 8) & 0xFF


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
