"""The sandbox's seccomp filter: the kernel interfaces a Python program never needs, and exploits do.

Built with libseccomp (through `pyseccomp`, a ctypes binding with the API of libseccomp's own Python
bindings) and exported once as classic BPF; each execution hands the bytes to the launcher on an
fd, and the launcher loads them with prctl(PR_SET_SECCOMP) right before it execs the program
(launcher.py says why the launcher and not bubblewrap's --seccomp: it must mount the capped scratch
tmpfs first, and the filter forbids mounting).

Design: allow by default, deny by list. A Python program uses hundreds of syscalls (threads,
multiprocessing, subprocess, numpy, sockets on its own loopback); an allow-list would break it in
ways no test enumerates, while the attack surface the sandbox never needs is short and well known:

- namespaces: unshare/clone with any CLONE_NEW* flag, setns. A nested user namespace gives the
  program every capability inside it (CAP_NET_ADMIN, mount, netfilter): the road most container
  escapes take. clone3 answers ENOSYS, since its flags live in memory a filter cannot read; glibc
  then falls back to clone, whose flags argument the filter checks.
- io_uring, bpf, perf_event_open, userfaultfd, the key-management calls: large kernel interfaces
  behind many recent local-privilege CVEs.
- ptrace and its relatives (process_vm_readv/writev, pidfd_getfd, kcmp): reading or steering
  another process, the launcher included.
- every mount-API call, chroot, open_by_handle_at; module, kexec, reboot and swap calls.
- shmget and memfd_create: System V segments outlive their last detach, and memfds are tmpfs files
  on no mount of ours; neither counts towards any rlimit (a memfd only towards RLIMIT_FSIZE, once
  per fd), so without a memory cgroup they are unbounded host memory. POSIX shared memory
  (multiprocessing, shm_open) lives in the capped /dev/shm instead; the host's stdin memfd is
  created outside and stays usable.
- personality flags that weaken exploit mitigations (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, ...).
- sockets other than AF_UNIX, AF_INET, AF_INET6 and NETLINK_ROUTE (which glibc's getaddrinfo
  uses); raw and packet sockets in AF_INET/AF_INET6.
- syscall numbers newer than this libseccomp knows answer ENOSYS, as an older kernel would, so a
  kernel upgrade cannot add surface this list never saw.

Denials return EPERM (ENOSYS where the caller should fall back), never kill: a program gets a plain
OSError it can report. Only a syscall of a foreign ABI (x86 int 0x80 on x86_64, x32) kills the
process (SIGSYS, outcome "crashed"): no legitimate Python program makes one, and the filter's
argument checks are written for the native ABI. Integer arguments are compared on their low 32
bits, as the kernel reads them, so junk in the high half cannot slip past a rule.
"""

from __future__ import annotations

import errno
import functools
import os
import socket

from factory.sandbox.config import SandboxUnavailable

INSTALL_HINT = "install it with `pip install pyseccomp==0.1.2` and `apt-get install libseccomp2`"

# CLONE_NEW* flags (linux/sched.h). CLONE_NEWTIME (0x80) is only for unshare: in clone() that bit is
# part of the exit signal.
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME = 0x10000000, 0x20000000, 0x40000000, 0x00000080
CLONE_NAMESPACES = (CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET)

DENIED = (
    # namespaces (unshare and clone are denied only with CLONE_NEW* flags, below)
    "setns",
    # large kernel interfaces
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "bpf", "perf_event_open", "userfaultfd",
    "keyctl", "add_key", "request_key",
    # other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    # file systems and the machine
    "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
    "open_tree", "move_mount", "mount_setattr", "open_by_handle_at", "quotactl", "quotactl_fd",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "acct", "syslog", "iopl", "ioperm",
    # memory no rlimit bounds
    "shmget", "memfd_create", "memfd_secret",
)
# What must resolve for the filter to mean anything; the rest of DENIED may be absent on an arch.
REQUIRED = ("unshare", "clone", "clone3", "setns", "io_uring_setup", "bpf", "keyctl", "ptrace", "mount", "perf_event_open")

# personality(2) flags that switch off exploit mitigations. Each is matched together with the top
# nibble being 0, so the query personality(0xffffffff) still works.
RISKY_PERSONALITY = (0x0040000, 0x0100000, 0x0200000, 0x0400000, 0x0800000, 0x8000000)
SOCKET_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK)
NETLINK_ROUTE = 0
SOCK_TYPE_MASK, SOCK_PACKET = 0xF, 10
FUTURE_SYSCALLS = 64  # numbers past the newest one libseccomp knows that answer ENOSYS


def _seccomp():
    try:
        import pyseccomp
    except (ImportError, RuntimeError) as exc:  # RuntimeError: the binding is there, libseccomp.so is not
        raise SandboxUnavailable(f"the sandbox's seccomp filter needs libseccomp ({exc}); {INSTALL_HINT}") from exc
    return pyseccomp


@functools.cache
def filter_bpf() -> bytes:
    """The filter as classic BPF for this machine's architecture (built once per process)."""
    sc = _seccomp()
    built = build_filter(sc)
    fd = os.memfd_create("seccomp-bpf")
    try:
        with os.fdopen(os.dup(fd), "wb") as out:
            built.export_bpf(out)
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def build_filter(sc):
    """The libseccomp filter object (`sc` is the pyseccomp module); see the module docstring."""
    missing = [name for name in REQUIRED if sc.resolve_syscall(sc.Arch.NATIVE, name) < 0]
    if missing:
        raise SandboxUnavailable(f"libseccomp does not know {', '.join(missing)} on this machine; {INSTALL_HINT}")
    eperm, low32 = sc.ERRNO(errno.EPERM), 0xFFFFFFFF
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    for name in DENIED:
        if sc.resolve_syscall(sc.Arch.NATIVE, name) >= 0:
            f.add_rule(eperm, name)
    for flag in CLONE_NAMESPACES:
        f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for flag in (*CLONE_NAMESPACES, CLONE_NEWTIME):
        f.add_rule(eperm, "unshare", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for flag in RISKY_PERSONALITY:
        f.add_rule(eperm, "personality", sc.Arg(0, sc.MASKED_EQ, 0xF0000000 | flag, flag))
    for family in range(socket.AF_NETLINK):
        if family not in SOCKET_FAMILIES:
            f.add_rule(eperm, "socket", sc.Arg(0, sc.MASKED_EQ, low32, family))
    f.add_rule(eperm, "socket", sc.Arg(0, sc.GT, socket.AF_NETLINK))  # high-half junk lands here too
    f.add_rule(eperm, "socket", sc.Arg(0, sc.MASKED_EQ, low32, socket.AF_NETLINK), sc.Arg(2, sc.NE, NETLINK_ROUTE))
    for family in (socket.AF_INET, socket.AF_INET6):
        for kind in (socket.SOCK_RAW, SOCK_PACKET):
            f.add_rule(eperm, "socket", sc.Arg(0, sc.MASKED_EQ, low32, family), sc.Arg(1, sc.MASKED_EQ, SOCK_TYPE_MASK, kind))
    newest = max(nr for nr in range(1024) if _known(sc, nr))
    for nr in range(newest + 1, newest + 1 + FUTURE_SYSCALLS):
        f.add_rule(sc.ERRNO(errno.ENOSYS), nr)
    try:
        f.set_attr(sc.Attr.CTL_OPTIMIZE, 2)  # a binary tree of syscall numbers (libseccomp >= 2.5)
    except OSError:
        pass  # older libseccomp: the same rules, checked in a linear chain
    return f


def _known(sc, nr: int) -> bool:
    try:
        sc.resolve_syscall(sc.Arch.NATIVE, nr)
    except ValueError:
        return False
    return True
