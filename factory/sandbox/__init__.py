"""Run untrusted Python code under bubblewrap, in a parallel worker pool.

    from factory.sandbox import Sandbox, SandboxConfig, checked_program
    results = Sandbox(SandboxConfig(timeout_s=5, workers=4)).map(programs)
    [r.outcome for r in results]  # passed / failed / timeout / oom / crashed
    # a check that must run to its end (evals, synthetic validators, rewards): never trust exit 0
    verdicts = Sandbox().map_checked([checked_program(code, test=test, entry_point="f")])

Files: config.py (limits, results, classification), bwrap.py (availability probe and the bubblewrap
command line), launcher.py (first process inside: own user + mount namespace, inode-capped scratch,
/proc masks, rlimits, uid drop, seccomp, exact status), seccomp.py (the syscall filter, built with
libseccomp), cgroup.py (optional v1 pids/memory caps), runner.py (one execution), pool.py (the
`Sandbox` pool), checked.py + harness.py (checks that pass only with the harness's per-run nonce).

Isolation: no network (own net namespace, only its own loopback), a read-only minimal root (of /sys
only the CPU topology), private /tmp and /dev/shm capped in bytes and inodes, own pid namespace, a
clean environment, a seccomp filter (no namespaces, io_uring, bpf, keyctl, ptrace, mount,
perf_event_open, raw sockets), rlimits on CPU, address space, processes and file size, a wall clock;
as root the program runs under a throwaway unprivileged uid so the process limit holds. Without a
working bubblewrap, user namespaces or libseccomp every entry point raises `SandboxUnavailable`.
"""

from factory.sandbox.bwrap import check_available
from factory.sandbox.checked import CheckedProgram, CheckVerdict, checked_program, verdict
from factory.sandbox.config import ExecResult, Mount, Outcome, SandboxConfig, SandboxUnavailable
from factory.sandbox.pool import Sandbox

__all__ = ["CheckVerdict", "CheckedProgram", "ExecResult", "Mount", "Outcome", "Sandbox", "SandboxConfig",
           "SandboxUnavailable", "check_available", "checked_program", "verdict"]
