"""Finding bubblewrap, proving it can build a sandbox here, and composing its command line.

Design: the sandbox's root is a fresh tmpfs into which only what a Python program needs is bound,
read-only: /usr, /etc, /sys/devices/system/cpu (os.cpu_count, numpy and torch read it), the /bin
and /lib links, and the interpreter's prefixes (a venv and its base) at their own paths. Home
directories, /run (docker.sock and friends: a read-only bind does not stop connect() on a unix
socket), /var, the rest of /sys (other tenants' cgroup usage under /sys/fs/cgroup, the host's
interfaces under /sys/class/net), the project checkout and every other host path are simply absent.
/proc is the sandbox's own (the launcher covers the entries that describe the host's kernel or
other tenants), /dev a minimal one, /tmp and /dev/shm private size-capped tmpfs (the launcher mounts
inode-capped ones over them); the root and /dev are then remounted read-only. Namespaces: pid, net
(nothing but the sandbox's own, empty loopback), ipc, uts, cgroup, and the launcher's own user and
mount namespace inside. The environment is cleared and rebuilt from `_ENV`. The seccomp filter
(seccomp.py) travels to the launcher on an fd.

Why not `--unshare-all` as root: it adds a user namespace that maps only uid 0, and the launcher could
then not switch to the unprivileged uid that makes RLIMIT_NPROC bind (see launcher.py). As root we
list the namespaces ourselves and keep only CAP_SETUID/CAP_SETGID for the launcher; as another user
bubblewrap adds the user namespace itself.

`harden=False` (SandboxConfig.harden) composes the older command line: all of /sys, the whole of
/proc, no filter and no inode cap. It exists so bench/infer_bench.py can measure what hardening costs.

`require_bwrap` runs bubblewrap once per binary (cached, failures too) so a machine that has it but
forbids namespaces (a container without CAP_SYS_ADMIN, Ubuntu's AppArmor userns restriction) fails at
pool construction with bubblewrap's own words, never by silently running code unsandboxed.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from factory.sandbox.config import Mount, SandboxConfig, SandboxUnavailable

INSTALL_HINT = "install it with `apt-get install bubblewrap` (Debian/Ubuntu; `dnf install bubblewrap` on Fedora)"
MIN_VERSION = (0, 7, 0)  # --size and --perms on --tmpfs/--dir arrived in 0.7 (Ubuntu 24.04 ships 0.9)
LAUNCHER = Path(__file__).with_name("launcher.py")
SANDBOX_DIR = "/sandbox"  # where the launcher and the program live inside; never a host path
_SYSTEM_DIRS = ("usr", "etc", "sys")  # "sys" only when not hardened; then just _SYS_KEPT
_SYS_KEPT = "/sys/devices/system/cpu"  # online/possible CPUs: sysconf(_SC_NPROCESSORS_*), OpenBLAS, torch
_SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")  # symlinks into /usr on merged-usr systems
_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "USER": "sandbox",  # getpass.getuser() would otherwise fail on the launcher's passwd-less uid
    "LOGNAME": "sandbox",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",  # output written before a timeout kill must reach the host
    "PYTHONIOENCODING": "utf-8",
}


def find_bwrap() -> str:
    """The bubblewrap binary on PATH, or SandboxUnavailable naming it and how to install it."""
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(
            "bubblewrap (`bwrap`) is not on PATH, and untrusted code is never run unsandboxed; " + INSTALL_HINT
        )
    return path


def check_available() -> None:
    """Raise SandboxUnavailable unless bubblewrap can build a sandbox here."""
    require_bwrap()


def require_bwrap() -> str:
    """The path of a bubblewrap proven to build our namespaces here, or SandboxUnavailable."""
    bwrap = find_bwrap()
    problem = _probe(bwrap)
    if problem:
        raise SandboxUnavailable(problem)
    return bwrap


@functools.cache
def _probe(bwrap: str) -> str | None:
    """What stops `bwrap` from building our namespaces, or None. Run once per binary."""
    try:
        version_text = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap at {bwrap} cannot be run ({exc!r}); {INSTALL_HINT}"
    found = re.search(r"(\d+)\.(\d+)\.(\d+)", version_text)
    version = tuple(int(g) for g in found.groups()) if found else (0, 0, 0)
    if version < MIN_VERSION:
        want = ".".join(map(str, MIN_VERSION))
        return f"bubblewrap {version_text.strip() or '?'} at {bwrap} is older than {want}; {INSTALL_HINT}"
    true = os.path.realpath(shutil.which("true") or "/bin/true")
    argv = [bwrap, *namespace_args(), *system_mounts(tmp_mb=1), "--", true]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={})
    if done.returncode != 0:
        return (
            f"bubblewrap at {bwrap} cannot create the sandbox's namespaces here: {done.stderr.strip()!r}. "
            "In a container, run it with CAP_SYS_ADMIN or unprivileged user namespaces allowed "
            "(sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 the AppArmor profile for bwrap)."
        )
    return None


def resolve_interpreter(python: str | None) -> str:
    """The absolute path of the interpreter to run inside (default: this process's)."""
    chosen = python or sys.executable
    found = shutil.which(chosen)
    if not found:
        raise SandboxUnavailable(f"interpreter {chosen!r} for the sandbox was not found")
    return os.path.abspath(found)


@functools.cache
def interpreter_roots(python: str) -> tuple[str, ...]:
    """Host directories the interpreter needs: its prefix (a venv) and base prefix, real paths."""
    if python == sys.executable:
        prefixes = [sys.prefix, sys.base_prefix]
    else:
        query = [python, "-I", "-c", "import sys; print(sys.prefix); print(sys.base_prefix)"]
        try:
            done = subprocess.run(query, capture_output=True, text=True, check=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxUnavailable(f"interpreter {python} for the sandbox does not run here: {exc!r}") from exc
        prefixes = done.stdout.split("\n")[:2]
    roots = {os.path.realpath(p) for p in prefixes} | {os.path.dirname(os.path.realpath(python))}
    return tuple(sorted(roots))


def namespace_args() -> list[str]:
    args = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    args += ["--hostname", "sandbox", "--die-with-parent", "--new-session"]
    if os.geteuid() == 0:
        # Privileged bubblewrap keeps every capability by default; the launcher needs two, for setuid.
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    return args


def system_mounts(*, tmp_mb: int, harden: bool = True) -> list[str]:
    args: list[str] = []
    for name in _SYSTEM_DIRS:
        if os.path.isdir(f"/{name}") and not (harden and name == "sys"):
            args += ["--ro-bind", f"/{name}", f"/{name}"]
    if harden and os.path.isdir(_SYS_KEPT):
        # parents 0755 by hand: bubblewrap would make them 0700, unreadable to the program's uid
        parents = ["/sys", "/sys/devices", "/sys/devices/system"]
        args += [arg for parent in parents for arg in ("--perms", "0755", "--dir", parent)]
        args += ["--ro-bind", _SYS_KEPT, _SYS_KEPT]
    for name in _SYSTEM_LINKS:
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--dev", "/dev"]
    for scratch in ("/tmp", "/dev/shm"):  # /dev/shm: multiprocessing's semaphores live there
        args += ["--perms", "1777", "--size", str(tmp_mb << 20), "--tmpfs", scratch]
    return args


def interpreter_mounts(roots: tuple[str, ...]) -> list[str]:
    """Bind each root read-only at its own path, creating world-traversable parents on the tmpfs root.

    Parents are created 0755 on purpose: bubblewrap would make them 0700, and the program's
    unprivileged uid could then not reach an interpreter that lives under /root (pyenv) or /home.
    """
    # Only host binds cover a root. /tmp and /dev/shm are the sandbox's own tmpfs: an interpreter
    # under the host's /tmp (a CI checkout in /tmp) must be bound on top of it, or it vanishes.
    covered = {"/" + name for name in _SYSTEM_DIRS + _SYSTEM_LINKS}
    created: set[str] = {"/tmp", "/dev", "/dev/shm", "/proc"}  # exist already; never re-create them
    args: list[str] = []
    for root in roots:
        if _under(root, covered):
            continue
        parts = Path(root).parts
        for depth in range(2, len(parts)):
            parent = str(Path(*parts[:depth]))
            if parent not in created and not _under(parent, covered):
                args += ["--perms", "0755", "--dir", parent]
                created.add(parent)
        args += ["--ro-bind", root, root]
        covered.add(root)
    return args


def build_argv(
    config: SandboxConfig, *, bwrap: str, python: str, uid: int, code_fd: int, status_fd: int, seccomp_fd: int = -1,
    mounts: tuple[Mount, ...] = (), env: dict[str, str] | None = None, cwd: str = "/tmp",
) -> list[str]:
    """The full bubblewrap command for one execution (the program text arrives on `code_fd`, the
    seccomp filter's BPF on `seccomp_fd`, which must be given when `config.harden`). `mounts` are
    host directories bound at their sandbox paths, `env` is added to the clean environment, and the
    program starts in `cwd`."""
    if config.harden != (seccomp_fd >= 0):
        raise ValueError(f"seccomp_fd={seccomp_fd} does not match harden={config.harden}")
    environment = {**_ENV, **(env or {})}
    env_args = ["--clearenv"] + [arg for key, value in environment.items() for arg in ("--setenv", key, value)]
    files = ["--perms", "0755", "--dir", SANDBOX_DIR, "--ro-bind", str(LAUNCHER), f"{SANDBOX_DIR}/launcher.py"]
    files += ["--perms", "0444", "--ro-bind-data", str(code_fd), f"{SANDBOX_DIR}/main.py"]
    # Without our own uid (not root) bubblewrap's init and the launcher count against RLIMIT_NPROC too
    # (hardened, only the launcher does: its own user namespace holds just it and the program).
    nproc = config.max_processes + (0 if uid >= 0 else 2)
    limits = [config.cpu_s, config.memory_mb << 20, nproc, config.max_file_mb << 20]
    # + 1 inode: the tmpfs root directory takes one, and tmp_files counts what the program creates
    scratch = [config.tmp_mb << 20, config.tmp_files + 1, seccomp_fd]
    launch = [python, "-I", "-S", f"{SANDBOX_DIR}/launcher.py", str(status_fd), str(uid), *map(str, limits + scratch)]
    launch += [python, f"{SANDBOX_DIR}/main.py"]
    return [
        bwrap,
        *namespace_args(),
        *system_mounts(tmp_mb=config.tmp_mb, harden=config.harden),
        *interpreter_mounts(interpreter_roots(python)),
        *files,
        *user_mounts(mounts),
        # Last, once every mount point exists: without this the tmpfs root and /dev stay writable (and
        # unbounded) for a non-root host user, who owns them inside its user namespace.
        *("--remount-ro", "/", "--remount-ro", "/dev"),
        *env_args,
        "--chdir",
        cwd,
        "--",
        *launch,
    ]


def user_mounts(mounts: tuple[Mount, ...]) -> list[str]:
    """Bind each mount's host directory at its sandbox path, parents made 0755 on the tmpfs root."""
    args: list[str] = []
    created: set[str] = set()
    for mount in mounts:
        if not os.path.isdir(mount.host):
            raise FileNotFoundError(f"sandbox mount {mount.path}: host directory {mount.host} does not exist")
        parts = Path(mount.path).parts
        for depth in range(2, len(parts)):
            parent = str(Path(*parts[:depth]))
            if parent not in created:
                args += ["--perms", "0755", "--dir", parent]
                created.add(parent)
        args += ["--bind" if mount.writable else "--ro-bind", os.path.realpath(mount.host), mount.path]
        created.add(mount.path)
    return args


def _under(path: str, roots: set[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)
