"""The first process inside the sandbox: it builds the program's own namespace and scratch space,
applies the limits and the seccomp filter, drops root, runs the program, and reports the program's
exact wait status and CPU time to the host.

It runs under bubblewrap as `python -I -S /sandbox/launcher.py STATUS_FD UID CPU_S AS_BYTES NPROC
FSIZE_BYTES SCRATCH_BYTES SCRATCH_INODES SECCOMP_FD PYTHON /sandbox/main.py` (stdlib only, no site:
it must start fast and import nothing the program could have planted). It is not imported by the
host. SECCOMP_FD -1 skips the hardening steps below (only to measure their cost).

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

Hardening (why here and not in bubblewrap): without a memory cgroup, tmpfs inodes are host kernel
memory that no rlimit counts, and bubblewrap's --tmpfs takes a size but no inode count (1.5 M empty
files cost 1.6 GB). So the child enters a user and mount namespace of its own (unshare needs no
capability, as root or not; the parent, still in bubblewrap's namespace, writes its id maps) and
mounts fresh /tmp and /dev/shm with `size=` and `nr_inodes=`; mounts the host bound under them (an
interpreter in a /tmp checkout) are bound again on top. The seccomp filter, which forbids exactly
these unshare and mount calls, is loaded next, by this launcher rather than by bubblewrap's
--seccomp, which would apply it before the mounts. The program then runs in that user namespace
without any capability, and cannot reach the launcher: another user namespace, and no ptrace.
"""

import os
import resource
import sys

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 0x1, 0x2, 0x4, 0x20, 0x1000, 0x4000
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
SCRATCH = ("/tmp", "/dev/shm")  # /dev/shm: multiprocessing's semaphores live there
# /proc entries that show the host's kernel layout or other tenants (every task, timer, lock, key
# user), none of which a Python program reads; the world-readable ones are covered by /dev/null and
# read as empty. Bound here rather than by bubblewrap, whose every bind re-reads the mount table
# (3 ms for these).
PROC_MASKED = (
    "kallsyms", "kcore", "modules", "keys", "key-users", "timer_list", "sched_debug", "latency_stats",
    "locks", "kpagecount", "kpageflags", "kpagecgroup", "vmallocinfo", "slabinfo", "pagetypeinfo",
    "iomem", "ioports", "kmsg", "config.gz",
)


def _limit(kind: int, value: int, hard: int | None = None) -> None:
    resource.setrlimit(kind, (value, value if hard is None else hard))


def _run_program(uid: int, limits: list[int], harden: dict | None, python: str, main: str) -> None:
    """In the forked child: namespace and mounts, limits, privileges, filter, exec. Never returns."""
    cpu_s, as_bytes, nproc, fsize = limits
    start_dir = os.getcwd()  # bubblewrap's --chdir; the fresh /tmp mounted below would orphan it
    try:
        if harden is not None:
            _own_namespace(harden)
            _become(uid)  # before mounting: the mounts' directories must belong to a mapped uid
            _mount_private(harden)
        # The hard CPU limit sits one second above the soft one: SIGXCPU first (Python dies of it),
        # SIGKILL only if the program ignores SIGXCPU.
        _limit(resource.RLIMIT_CPU, cpu_s, cpu_s + 1)
        _limit(resource.RLIMIT_AS, as_bytes)
        _limit(resource.RLIMIT_FSIZE, fsize)
        _limit(resource.RLIMIT_CORE, 0)  # a crash must not write a core file anywhere
        _limit(resource.RLIMIT_NPROC, nproc)
        if harden is None:
            _become(uid)
        os.chdir(start_dir)
        if harden is not None:
            _load_seccomp(harden["libc"], harden["bpf"])
        # Hardened, we still hold every capability of our own user namespace here; exec as a uid
        # that is not root there clears them all.
        os.execv(python, [python, "-B", main])
    except BaseException as exc:  # the program never started: say why on stderr, exit like a shell
        os.write(2, f"sandbox launcher: {exc!r}\n".encode())
        os._exit(127)


def _become(uid: int) -> None:
    if uid >= 0:
        # Order matters: groups and gid while we still may, uid last (as root it drops the capabilities).
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _own_namespace(harden: dict) -> None:
    """Enter a new user+mount namespace and wait until the parent has written its id maps."""
    what = ("unshare(CLONE_NEWUSER|CLONE_NEWNS), which the sandbox needs to mount an inode-capped /tmp "
            "(are user namespaces off? sysctl user.max_user_namespaces must be > 0)")
    _check(harden["libc"].unshare(CLONE_NEWUSER | CLONE_NEWNS), what)
    os.write(harden["ready"], b"u")
    answer = os.read(harden["go"], 1)
    os.close(harden["ready"])
    os.close(harden["go"])
    if answer != b"g":
        raise RuntimeError("the launcher could not map this namespace's user and group ids")


def _mount_private(harden: dict) -> None:
    """Fresh size- and inode-capped tmpfs on /tmp and /dev/shm, with the host's binds under them
    kept, and the sensitive /proc entries covered."""
    libc = harden["libc"]
    keep = _submounts(SCRATCH)  # opened before the new tmpfs hides them
    made = _mount_points([path for path, _ in keep])
    for scratch in SCRATCH:
        # The directories made for the binds are inodes too: the program still gets `inodes` of its own.
        inodes = harden["inodes"] + sum(p.startswith(scratch + "/") for p in made)
        options = f"size={harden['bytes']},nr_inodes={inodes},mode=1777".encode()
        _check(libc.mount(b"tmpfs", scratch.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options), f"mount {scratch}")
    for directory in made:
        os.mkdir(directory, 0o755)
    for top in [p for p in made if os.path.dirname(p) in SCRATCH]:
        # Made by the program's own uid, so writable by it: a read-only bind of each top directory
        # keeps the host paths of the binds (a checkout under /tmp) as unwritable as the host's are.
        _check(libc.mount(top.encode(), top.encode(), None, MS_BIND | MS_REC, None), f"bind {top}")
        flags = MS_BIND | MS_REC | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
        _check(libc.mount(None, top.encode(), None, flags, None), f"remount {top} read-only")
    for path, fd in keep:
        source = f"/proc/self/fd/{fd}".encode()
        _check(libc.mount(source, path.encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
        os.close(fd)
    for name in PROC_MASKED:
        entry = f"/proc/{name}"
        try:
            readable = os.stat(entry).st_mode & 0o004  # 0400 ones are closed to the program already
        except FileNotFoundError:  # which entries exist depends on the kernel's configuration
            continue
        if readable:
            _check(libc.mount(b"/dev/null", entry.encode(), None, MS_BIND, None), f"cover {entry}")


def _map_ids(pid: int, uid: int) -> None:
    """Write the child's id maps from bubblewrap's namespace: the one uid and gid it may be inside.

    As root (CAP_SETUID/CAP_SETGID) that is the execution's uid, which the child then switches to;
    uid 0 is not mapped (that would take CAP_SETFCAP too). Otherwise an unprivileged user may map
    only itself, and only once setgroups is off.
    """
    if uid >= 0:
        _write(f"/proc/{pid}/uid_map", f"{uid} {uid} 1\n")
        _write(f"/proc/{pid}/gid_map", f"{uid} {uid} 1\n")
    else:
        _write(f"/proc/{pid}/uid_map", f"{os.geteuid()} {os.geteuid()} 1\n")
        _write(f"/proc/{pid}/setgroups", "deny")
        _write(f"/proc/{pid}/gid_map", f"{os.getegid()} {os.getegid()} 1\n")


def _mount_points(paths: list[str]) -> list[str]:
    """Every directory to make under the scratch roots so that each of `paths` exists, parents first."""
    needed: set[str] = set()
    for path in paths:
        while os.path.dirname(path) not in SCRATCH and path not in SCRATCH:
            needed.add(path)
            path = os.path.dirname(path)
        needed.add(path)
    return sorted(needed - set(SCRATCH), key=lambda p: (p.count("/"), p))


def _submounts(roots: tuple[str, ...]) -> list[tuple[str, int]]:
    """(path, O_PATH fd) of the outermost mounts strictly under `roots`, from /proc/self/mountinfo."""
    with open("/proc/self/mountinfo") as f:
        points = sorted({_unescape(line.split()[4]) for line in f})
    chosen: list[str] = []
    for point in points:  # sorted: a mount's parent directory comes before it
        if any(point.startswith(root + "/") for root in roots) and not any(point.startswith(c + "/") for c in chosen):
            chosen.append(point)
    return [(point, os.open(point, os.O_PATH)) for point in chosen]


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as \\ooo octal escapes."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _libc():
    import ctypes  # only when hardening: it is the one import that costs (about 2 ms)

    libc = ctypes.CDLL(None, use_errno=True)
    # Explicit types: flags are unsigned long, and prctl's variadic arguments must be full words.
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p)
    libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong)
    libc.unshare.argtypes = (ctypes.c_int,)
    return libc


def _load_seccomp(libc, bpf: bytes) -> None:
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    program = ctypes.create_string_buffer(bpf, len(bpf))
    fprog = SockFprog(len(bpf) // 8, ctypes.addressof(program))  # 8 bytes per sock_filter instruction
    # bubblewrap sets no_new_privs already; set it again so loading never depends on that.
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "seccomp filter")


def _check(result: int, what: str) -> None:
    if result != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())  # id maps must arrive in one write
    finally:
        os.close(fd)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def main(argv: list[str]) -> int:
    status_fd, uid, cpu_s, as_bytes, nproc, fsize, scratch_bytes, scratch_inodes, seccomp_fd = (int(a) for a in argv[:9])
    python, program = argv[9], argv[10]
    harden = None
    if seccomp_fd >= 0:
        harden = {"libc": _libc(), "bpf": _read_all(seccomp_fd), "bytes": scratch_bytes, "inodes": scratch_inodes}
    # Nothing the host did not mean to hand over may reach the program: keep stdio and the status pipe.
    os.closerange(3, status_fd)
    os.closerange(status_fd + 1, 1 << 16)
    if harden is not None:
        ready_r, harden["ready"] = os.pipe()
        harden["go"], go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(status_fd)
        if harden is not None:
            os.close(ready_r)
            os.close(go_w)
        _run_program(uid, [cpu_s, as_bytes, nproc, fsize], harden, python, program)
    if harden is not None:
        os.close(harden["ready"])
        os.close(harden["go"])
        try:
            if os.read(ready_r, 1) == b"u":  # EOF instead: the child failed and says why itself
                _map_ids(pid, uid)
                os.write(go_w, b"g")
        except OSError as exc:
            os.write(2, f"sandbox launcher: cannot map the program's ids: {exc!r}\n".encode())
        os.close(ready_r)
        os.close(go_w)
    _, status, usage = os.wait4(pid, 0)
    os.write(status_fd, f"{status} {usage.ru_utime + usage.ru_stime:.3f}\n".encode())
    os.close(status_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
