"""The first process inside the sandbox: it applies the limits, drops root, runs the program, and
reports the program's exact wait status and CPU time to the host.

It runs under bubblewrap as `python -I -S /sandbox/launcher.py STATUS_FD UID CPU_S AS_BYTES NPROC
FSIZE_BYTES PYTHON /sandbox/main.py` (stdlib only, no site: it must start fast and import nothing the
program could have planted). It is not imported by the host.

Why a launcher at all:
- rlimits are set here, after bubblewrap built the namespaces, not in the host before it. For a
  non-root user bubblewrap creates a user namespace, and the kernel counts RLIMIT_NPROC per user
  namespace but also caps the parent namespace at the creator's limit: a limit set before the
  namespace exists would count every process the user owns on the host (a desktop's hundreds).
- As root the kernel never enforces RLIMIT_NPROC (uid 0 is exempt), so a fork bomb would only be
  stopped by the pids cgroup, which a CI machine may not let us write. The program therefore runs as
  an unprivileged uid picked by the host for this execution alone (so concurrent executions do not
  share one process budget), which makes RLIMIT_NPROC bind. Bubblewrap keeps us uid 0 with only
  CAP_SETUID/CAP_SETGID for exactly this step.
- bubblewrap reports a signal death as exit status 128+N, which cannot be told apart from
  sys.exit(128+N), and its rusage does not include the program's. Forking and waiting here gives the
  true status and the CPU seconds that tell a RLIMIT_CPU SIGKILL from any other SIGKILL.
"""

import os
import resource
import sys


def _limit(kind: int, value: int, hard: int | None = None) -> None:
    resource.setrlimit(kind, (value, value if hard is None else hard))


def _run_program(uid: int, cpu_s: int, as_bytes: int, nproc: int, fsize: int, python: str, main: str) -> None:
    """In the forked child: limits, then privileges, then exec. Never returns."""
    try:
        # The hard CPU limit sits one second above the soft one: SIGXCPU first (Python dies of it),
        # SIGKILL only if the program ignores SIGXCPU.
        _limit(resource.RLIMIT_CPU, cpu_s, cpu_s + 1)
        _limit(resource.RLIMIT_AS, as_bytes)
        _limit(resource.RLIMIT_FSIZE, fsize)
        _limit(resource.RLIMIT_CORE, 0)  # a crash must not write a core file anywhere
        _limit(resource.RLIMIT_NPROC, nproc)
        if uid >= 0:
            # Order matters: groups and gid while we still may, uid last (it drops the capabilities).
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        os.chdir("/tmp")
        os.execv(python, [python, "-B", main])
    except BaseException as exc:  # the program never started: say why on stderr, exit like a shell
        os.write(2, f"sandbox launcher: {exc!r}\n".encode())
        os._exit(127)


def main(argv: list[str]) -> int:
    status_fd, uid, cpu_s, as_bytes, nproc, fsize = (int(a) for a in argv[:6])
    python, program = argv[6], argv[7]
    # Nothing the host did not mean to hand over may reach the program: keep stdio and the status pipe.
    os.closerange(3, status_fd)
    os.closerange(status_fd + 1, 1 << 16)
    pid = os.fork()
    if pid == 0:
        os.close(status_fd)
        _run_program(uid, cpu_s, as_bytes, nproc, fsize, python, program)
    _, status, usage = os.wait4(pid, 0)
    os.write(status_fd, f"{status} {usage.ru_utime + usage.ru_stime:.3f}\n".encode())
    os.close(status_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
