"""Run untrusted Python code under bubblewrap, in a parallel worker pool.

    from factory.sandbox import Sandbox, SandboxConfig
    results = Sandbox(SandboxConfig(timeout_s=5, workers=4)).map(programs)
    [r.outcome for r in results]  # passed / failed / timeout / oom / crashed

Files: config.py (limits, results, classification), bwrap.py (availability probe and the bubblewrap
command line), launcher.py (first process inside: rlimits, uid drop, exact status), cgroup.py
(optional v1 pids/memory caps), runner.py (one execution), pool.py (the `Sandbox` pool).

Isolation: no network (own net namespace, only its own loopback), a read-only minimal root, a private
size-capped /tmp, own pid namespace, a clean environment, rlimits on CPU, address space, processes and
file size, a wall clock; as root the program runs under a throwaway unprivileged uid so the process
limit holds. Without a working bubblewrap every entry point raises `SandboxUnavailable`.
"""

from factory.sandbox.bwrap import check_available
from factory.sandbox.config import ExecResult, Outcome, SandboxConfig, SandboxUnavailable
from factory.sandbox.pool import Sandbox

__all__ = ["ExecResult", "Outcome", "Sandbox", "SandboxConfig", "SandboxUnavailable", "check_available"]
