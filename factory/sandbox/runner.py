"""One sandboxed execution, start to reaped: spawn bubblewrap, stream its output under a byte cap,
enforce the wall clock, kill the whole tree, classify.

Design: the program text, stdin and the seccomp filter travel in memfds (bubblewrap copies the
program into the sandbox with --ro-bind-data; stdin is the memfd itself, readable and ftruncate-able;
the launcher reads and loads the filter), so nothing is written to the host's disk and no temp
directory needs cleaning. stdout and stderr are read as they come, through a selector, keeping the
first `max_output_bytes` of each and dropping the rest: a `while True: print(...)` cannot fill the
host's memory, and the pipes never back up and stall the program. The launcher inside reports the
program's real wait status and CPU time on a pipe (see launcher.py).

Killing: bubblewrap runs in its own session and process group; on timeout the group gets SIGKILL,
bubblewrap's `--die-with-parent` takes the sandbox's pid-namespace init down with it, and the kernel
then kills everything left in that namespace. Where a cgroup exists, every process in it is killed
too. Nothing the program forked can outlive the execution.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time

from factory.sandbox.bwrap import build_argv
from factory.sandbox.cgroup import CgroupScope
from factory.sandbox.config import ExecResult, Mount, Outcome, SandboxConfig, SandboxUnavailable, classify
from factory.sandbox.seccomp import filter_bpf

_HOST_ENV = {"PATH": "/usr/bin:/bin"}  # bubblewrap itself gets nothing from our environment either
_GRACE_S = 5.0  # after SIGKILL, how long a dying tree may take to close its pipes and be reaped
_CHUNK = 1 << 16


class _Capture:
    """The first `limit` bytes of a stream, and whether there were more."""

    def __init__(self, limit: int):
        self.limit = limit
        self.data = bytearray()
        self.overflow = False

    def add(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        if len(chunk) > room:
            self.overflow = True
        self.data += chunk[: max(room, 0)]

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def execute(config: SandboxConfig, code: str, *, stdin: str, bwrap: str, python: str, uid: int,
            mounts: tuple[Mount, ...] = (), env: dict[str, str] | None = None, cwd: str = "/tmp") -> ExecResult:
    """Run `code` once in a fresh sandbox; `uid` is the unprivileged uid to run as (-1: keep ours).
    `mounts`, `env` and `cwd` are build_argv's."""
    texts = code.encode(), stdin.encode()  # before any fd exists: an unencodable text leaks none
    seccomp_fd = _memfd("seccomp", filter_bpf()) if config.harden else -1
    code_fd = _memfd("main.py", texts[0])
    stdin_fd = _memfd("stdin", texts[1])
    status_read, status_write = os.pipe()
    passed = (code_fd, status_write) + ((seccomp_fd,) if config.harden else ())
    scope = None
    try:
        argv = build_argv(
            config, bwrap=bwrap, python=python, uid=uid, code_fd=code_fd, status_fd=status_write, seccomp_fd=seccomp_fd,
            mounts=mounts, env=env, cwd=cwd,
        )
        scope = CgroupScope.create(max_processes=config.max_processes, memory_mb=config.memory_mb)
        if scope is not None:
            argv = scope.wrap(argv)
        start = time.monotonic()
        proc = subprocess.Popen(
            argv,
            stdin=stdin_fd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=passed,
            start_new_session=True,
            env=_HOST_ENV,
        )
    except BaseException:
        os.close(status_read)
        if scope is not None:
            scope.remove()
        raise
    finally:  # the child holds its own copies now
        for fd in (*passed, stdin_fd):
            os.close(fd)
    try:
        stdout, stderr, timed_out = _collect(proc, config, start + config.timeout_s, scope)
        duration = time.monotonic() - start
        status, cpu_s = _read_status(status_read)
        cgroup_oom = scope.oom_killed() if scope is not None else False
    finally:
        os.close(status_read)
        if proc.returncode is None:  # only when _collect raised: never leave a tree or a zombie behind
            _kill_tree(proc, scope)
            proc.wait(timeout=_GRACE_S)
        if scope is not None:
            scope.remove()
    err_text = stderr.text()
    if status is not None or timed_out:
        outcome, reason, returncode = classify(
            status, stderr=err_text, wall_timeout=timed_out, cpu_s=cpu_s, limit_cpu_s=config.cpu_s, cgroup_oom=cgroup_oom
        )
    elif proc.returncode == 1 and err_text.startswith("bwrap:"):  # bubblewrap could not build it: nothing ran
        raise SandboxUnavailable(f"bubblewrap could not start the sandbox: {err_text.strip()}")
    elif cgroup_oom:  # the OOM killer took the launcher itself
        outcome, reason, returncode = Outcome.OOM, "sandbox killed by the memory cgroup", proc.returncode
    else:  # e.g. the program killed the launcher (possible when it shares the launcher's uid)
        reason = f"sandbox died before reporting a status (bubblewrap exit {proc.returncode})"
        outcome, returncode = Outcome.CRASHED, proc.returncode
    return ExecResult(
        outcome=outcome,
        reason=reason,
        returncode=returncode,
        stdout=stdout.text(),
        stderr=err_text,
        truncated=stdout.overflow or stderr.overflow,
        duration_s=duration,
        cpu_s=cpu_s,
    )


def _collect(
    proc: subprocess.Popen, config: SandboxConfig, deadline: float, scope: CgroupScope | None
) -> tuple[_Capture, _Capture, bool]:
    """Drain stdout/stderr until both close, then reap; kill the tree if `deadline` passes first."""
    assert proc.stdout is not None and proc.stderr is not None
    out, err = _Capture(config.max_output_bytes), _Capture(config.max_output_bytes)
    captures = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    timed_out = False
    with selectors.DefaultSelector() as selector:
        for fd in captures:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if timed_out:  # the grace period is over too: stop reading, whatever still holds the pipe
                    break
                timed_out = True
                _kill_tree(proc, scope)
                deadline = time.monotonic() + _GRACE_S
                continue
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, _CHUNK)
                if chunk:
                    captures[key.fd].add(chunk)
                else:
                    selector.unregister(key.fd)
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:  # pipes closed early (the program closed fds 1 and 2) but it runs on
        timed_out = True
        _kill_tree(proc, scope)
        proc.wait(timeout=_GRACE_S)
    proc.stdout.close()
    proc.stderr.close()
    return out, err, timed_out


def _kill_tree(proc: subprocess.Popen, scope: CgroupScope | None) -> None:
    if proc.returncode is None:  # once reaped, the pid (and so the group id) may belong to someone else
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if scope is not None:
        scope.kill_all()


def _read_status(fd: int) -> tuple[int | None, float | None]:
    """The launcher's 'STATUS CPU_SECONDS' line, or (None, None) if it never wrote one."""
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)
    ready = selector.select(1.0)  # writers are gone once the sandbox is reaped; this only guards a stuck one
    selector.close()
    line = os.read(fd, 256).decode() if ready else ""
    fields = line.split()
    if len(fields) != 2:
        return None, None
    return int(fields[0]), float(fields[1])


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
