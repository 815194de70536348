"""Sandbox hardening, end to end with real bwrap: each attack of issue 15 run inside the sandbox and
refused (nested user namespaces and the CAP_NET_ADMIN they bring, netfilter/raw/packet sockets,
io_uring, bpf, keyctl, ptrace, mount, perf_event_open, userfaultfd, SysV shm and memfds, personality,
files in /tmp without end (the issue's 1.5 M took 1.6 GB of host memory), the host's /sys and
sensitive /proc entries), that ordinary Python (threads, fork,
subprocess, multiprocessing, numpy, loopback sockets, stdin as a memfd) still works under the
filter, the same for a non-root host user, and the unhardened command line the benchmark compares.

Syscalls are made through ctypes with arguments that reach a different answer in the kernel when
nothing filters them (a NULL pointer: EFAULT, a bad fd: EBADF, or success), so EPERM here is the
filter's answer, not a missing capability's. These run on CPU, need bubblewrap, and take ~5 s.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pyseccomp
import pytest

from factory.sandbox import ExecResult, Outcome, Sandbox, SandboxConfig, SandboxUnavailable
from factory.sandbox import bwrap as bwrap_module

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)")

CONFIG = SandboxConfig(timeout_s=20, cpu_s=10, memory_mb=1024, workers=2)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(CONFIG)


def run_json(sandbox: Sandbox, code: str, stdin: str = "") -> dict:
    """Run `code` (which prints one JSON object last) and return that object."""
    result = sandbox.run(textwrap.dedent(code), stdin=stdin)
    assert result.outcome is Outcome.PASSED, f"{result.reason}: {result.stderr[-2000:]}"
    return json.loads(result.stdout.splitlines()[-1])


def nr(name: str) -> int:
    number = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    assert number >= 0, f"libseccomp does not know {name}"
    return number


# Prelude of every probe: `call(name, nr, *args)` records "ok" or the errno's name in `out`.
PRELUDE = """
    import ctypes, errno, json, os, socket, sys
    libc = ctypes.CDLL(None, use_errno=True)
    out, keep = {}, []
    def buf(data):  # a buffer that outlives the call (the kernel may write into it)
        keep.append(ctypes.create_string_buffer(data))
        return ctypes.addressof(keep[-1])
    def call(name, number, *args):
        result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args])
        out[name] = "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]
        return result
"""

# --- namespaces -----------------------------------------------------------------------------------

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x00020000, 0x10000000, 0x40000000, 17


def test_nested_user_namespaces_are_refused(sandbox):
    # The attack: a user namespace of one's own, then CAP_NET_ADMIN in a new net namespace.
    code = PRELUDE + f"""
    call("unshare user", {nr("unshare")}, {CLONE_NEWUSER})
    call("unshare user+net", {nr("unshare")}, {CLONE_NEWUSER | CLONE_NEWNET})
    call("unshare net", {nr("unshare")}, {CLONE_NEWNET})
    call("unshare mount", {nr("unshare")}, {CLONE_NEWNS})
    pid = call("clone user", {nr("clone")}, {CLONE_NEWUSER | SIGCHLD}, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)  # a child in a new user namespace: leave at once
    if pid > 0:
        os.waitpid(pid, 0)
    fd = os.open("/proc/self/ns/uts", os.O_RDONLY)
    call("setns", {nr("setns")}, fd, 0)
    done = __import__("subprocess").run(["unshare", "--user", "--map-root-user", "--net", "id", "-u"],
                                        capture_output=True, text=True)
    out["unshare(1)"] = [done.returncode, done.stdout.strip(), done.stderr.strip()[-80:]]
    caps = [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff")]
    out["CapEff"] = caps[0]
    print(json.dumps(out))
    """
    out = run_json(sandbox, code)
    for name in ("unshare user", "unshare user+net", "unshare net", "unshare mount", "clone user", "setns"):
        assert out[name] == "EPERM", out
    returncode, uid, stderr = out["unshare(1)"]
    assert returncode != 0 and uid == "" and "Operation not permitted" in stderr, out
    assert out["CapEff"] == "0000000000000000"


@pytest.mark.slow
def test_threads_fork_subprocess_multiprocessing_and_numpy_still_work(sandbox):
    # clone3 answers ENOSYS, so glibc's pthread_create falls back to clone without CLONE_NEW* flags
    code = PRELUDE + f"""
    def main():  # spawn re-imports the main module: only the guard below runs the probe
        import asyncio, concurrent.futures, multiprocessing, subprocess, tempfile, threading
        call("clone3", {nr("clone3")}, 0, 0)
        box = []
        t = threading.Thread(target=box.append, args=(1,)); t.start(); t.join()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            out["threads"] = sum(pool.map(abs, [-1, -2, -3])) + box[0]
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        out["subprocess"] = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout
        out["posix_spawn"] = os.waitstatus_to_exitcode(os.waitpid(os.posix_spawn("/bin/true", ["true"], {{}}), 0)[1])
        for method in ("fork", "spawn"):
            with multiprocessing.get_context(method).Pool(2) as pool:  # semaphores in /dev/shm
                out["pool " + method] = pool.map(abs, [-1, -2])
        lock = multiprocessing.Lock(); lock.acquire(); lock.release()
        a, b = socket.socketpair(); a.send(b"x"); out["socketpair"] = b.recv(1).decode()
        server = socket.create_server(("127.0.0.1", 0))
        client = socket.create_connection(server.getsockname()); conn, _ = server.accept()
        client.sendall(b"ping"); out["tcp loopback"] = conn.recv(4).decode()
        out["udp6"] = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).family.name
        out["netlink route"] = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).family.name
        out["asyncio"] = asyncio.run(asyncio.sleep(0, result="done"))
        with tempfile.NamedTemporaryFile(dir="/tmp") as f:
            out["tempfile"] = f.name.startswith("/tmp/")
        import numpy
        out["numpy"] = int((numpy.arange(1000) @ numpy.ones(1000)))
        out["cpu_count"] = os.cpu_count()
        out["affinity"] = len(os.sched_getaffinity(0))
        out["personality query"] = libc.personality(0xFFFFFFFF) >= 0
        print(json.dumps(out))
    if __name__ == "__main__":
        main()
    """
    out = run_json(sandbox, code)
    assert out == {
        "clone3": "ENOSYS", "threads": 7, "fork": 7, "subprocess": "42\n", "posix_spawn": 0,
        "pool fork": [1, 2], "pool spawn": [1, 2], "socketpair": "x", "tcp loopback": "ping",
        "udp6": "AF_INET6", "netlink route": "AF_NETLINK", "asyncio": "done", "tempfile": True,
        "numpy": 499500, "cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
        "personality query": True,
    }


def test_stdin_is_still_a_readable_truncatable_memfd(sandbox):
    # checked.py's harness reads its nonce from stdin and then empties it with ftruncate
    code = """
        import json, os, sys
        text = sys.stdin.read()
        os.ftruncate(0, 0)
        print(json.dumps({"text": text, "size": os.fstat(0).st_size, "link": os.readlink("/proc/self/fd/0")}))
    """
    out = run_json(sandbox, code, stdin="nonce-123\n")
    assert out["text"] == "nonce-123\n" and out["size"] == 0 and out["link"].startswith("/memfd:stdin")


# --- sockets --------------------------------------------------------------------------------------

NETLINK_NETFILTER, NETLINK_XFRM, AF_ALG, AF_VSOCK = 12, 6, 38, 40


def test_netfilter_raw_and_packet_sockets_are_refused(sandbox):
    # Each after the attempt to gain CAP_NET_ADMIN/CAP_NET_RAW in a namespace of one's own.
    cases = {
        "netfilter": (socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER),
        "xfrm": (socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_XFRM),
        "packet": (socket.AF_PACKET, socket.SOCK_RAW, 0),
        "raw ipv4": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
        "raw ipv6": (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6),
        "raw nonblocking": (socket.AF_INET, socket.SOCK_RAW | socket.SOCK_NONBLOCK, socket.IPPROTO_ICMP),
        "alg": (AF_ALG, socket.SOCK_SEQPACKET, 0),
        "vsock": (AF_VSOCK, socket.SOCK_STREAM, 0),
    }
    plain = {name: tuple(int(x) for x in args) for name, args in cases.items()}
    code = PRELUDE + f"""
    call("unshare user+net", {nr("unshare")}, {CLONE_NEWUSER | CLONE_NEWNET})
    for name, (family, kind, proto) in {plain!r}.items():
        try:
            socket.socket(family, kind, proto).close()
            out[name] = "ok"
        except OSError as e:
            out[name] = errno.errorcode[e.errno]
    print(json.dumps(out))
    """
    out = run_json(sandbox, code)
    assert out == {"unshare user+net": "EPERM", **dict.fromkeys(cases, "EPERM")}


# --- kernel interfaces ----------------------------------------------------------------------------

KEY_SPEC_PROCESS_KEYRING, KEY_SPEC_SESSION_KEYRING, UFFD_USER_MODE_ONLY = -2, -3, 1
ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC = 0x0040000, 0x0400000


def newest_known_syscall() -> int:
    known = []
    for number in range(1024):
        try:
            pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, number)
            known.append(number)
        except ValueError:
            continue
    return max(known)


# name -> (the call, what it answers now); unfiltered each gets success, EFAULT, EBADF or EINVAL
KERNEL_CASES = {
    "io_uring_setup": ("call(NAME, NR, 1, buf(120))", "EPERM"),
    "io_uring_enter": ("call(NAME, NR, -1, 0, 0, 0, 0, 0)", "EPERM"),
    "io_uring_register": ("call(NAME, NR, -1, 0, 0, 0)", "EPERM"),
    "bpf": ("call(NAME, NR, 0, 0, 0)", "EPERM"),
    "perf_event_open": ("call(NAME, NR, 0, 0, -1, -1, 0)", "EPERM"),
    "keyctl": (f"call(NAME, NR, 0, {KEY_SPEC_SESSION_KEYRING}, 1)", "EPERM"),
    "add_key": (f'call(NAME, NR, buf(b"user"), buf(b"k"), buf(b"v"), 1, {KEY_SPEC_PROCESS_KEYRING})', "EPERM"),
    "request_key": ('call(NAME, NR, buf(b"user"), buf(b"nothing"), 0, 0)', "EPERM"),
    "mount": ("call(NAME, NR, 0, 0, 0, 0, 0)", "EPERM"),
    "umount2": ("call(NAME, NR, 0, 0)", "EPERM"),
    "userfaultfd": (f"call(NAME, NR, {UFFD_USER_MODE_ONLY})", "EPERM"),
    "shmget": ("call(NAME, NR, 0, 1 << 20, 0o1600)", "EPERM"),  # IPC_PRIVATE, IPC_CREAT|0600
    "memfd_create": ('call(NAME, NR, buf(b"hoard"), 0)', "EPERM"),
    "personality": (f"call(NAME, NR, {ADDR_NO_RANDOMIZE})", "EPERM"),
    "process_vm_readv": ("call(NAME, NR, os.getpid(), 0, 0, 0, 0, 0)", "EPERM"),
    "kcmp": ("call(NAME, NR, os.getpid(), os.getpid(), 1, 0, 0)", "EPERM"),  # KCMP_VM
    "future syscall": ("call(NAME, NEWEST + 1, 0, 0, 0, 0)", "ENOSYS"),
}


@pytest.fixture(scope="module")
def kernel_answers(sandbox) -> dict:
    lines = [f"NEWEST = {newest_known_syscall()}"]
    for name, (expr, _) in KERNEL_CASES.items():
        number = "NEWEST + 1" if name == "future syscall" else nr(name)
        lines.append(expr.replace("NAME", repr(name)).replace("NR", str(number)))
    return run_json(sandbox, PRELUDE + "\n".join("    " + line for line in lines) + "\n    print(json.dumps(out))")


@pytest.mark.parametrize("name", list(KERNEL_CASES))
def test_kernel_interface_is_refused(kernel_answers, name):
    assert kernel_answers[name] == KERNEL_CASES[name][1], kernel_answers


def test_ptrace_of_another_process_is_refused(sandbox):
    code = PRELUDE + f"""
    import time
    pid = os.fork()
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    call("ptrace attach", {nr("ptrace")}, 16, pid, 0, 0)  # PTRACE_ATTACH: allowed on one's own child
    call("ptrace seize", {nr("ptrace")}, 0x4206, pid, 0, 0)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print(json.dumps(out))
    """
    assert run_json(sandbox, code) == {"ptrace attach": "EPERM", "ptrace seize": "EPERM"}


def test_the_program_runs_filtered_without_capabilities(sandbox):
    code = """
        import json
        print(json.dumps(dict(line.split(":\\t") for line in open("/proc/self/status").read().splitlines()
                              if line.startswith(("Cap", "Seccomp", "NoNewPrivs")))))
    """
    status = run_json(sandbox, code)
    assert status["Seccomp"] == "2" and status["NoNewPrivs"] == "1"  # 2: SECCOMP_MODE_FILTER
    assert {status[k] for k in ("CapInh", "CapPrm", "CapEff", "CapAmb")} == {"0000000000000000"}


# --- files and memory -----------------------------------------------------------------------------

ATTEMPTS = 12_000  # three times the default cap: unbounded before, 1.5 M files took 1.6 GB of host memory


def test_many_files_in_tmp_stop_at_the_inode_cap(sandbox):
    code = f"""
        import errno, json, os
        out = {{}}
        for scratch in ("/tmp", "/dev/shm"):
            made, error = 0, None
            try:
                for made in range({ATTEMPTS}):
                    open(f"{{scratch}}/f{{made}}", "w").close()
                made = {ATTEMPTS}
            except OSError as e:
                error = errno.errorcode[e.errno]
            vfs = os.statvfs(scratch)
            out[scratch] = [made, error, vfs.f_ffree]
        print(json.dumps(out))
    """
    out = run_json(sandbox, code)
    # SandboxConfig.tmp_files' default, all the program's own: the tmpfs root and the directories the
    # launcher makes for the interpreter's binds (a checkout under /tmp) are inodes on top of it
    cap = 4096
    assert out == dict.fromkeys(["/tmp", "/dev/shm"], [cap, "ENOSPC", 0])
    assert CONFIG.tmp_files == cap


def test_inode_cap_follows_the_config_and_counts_directories():
    small = Sandbox(SandboxConfig(timeout_s=10, cpu_s=5, memory_mb=512, tmp_files=50, workers=1))
    code = """
        import json, os
        made = 0
        try:
            while True:
                os.mkdir(f"/tmp/d{made}") if made % 2 else os.symlink("x", f"/tmp/l{made}")
                made += 1
        except OSError as e:
            print(json.dumps([made, e.strerror]))
    """
    assert run_json(small, code) == [50, "No space left on device"]


# --- what the program can see ---------------------------------------------------------------------


def test_only_the_cpu_part_of_sys_is_visible(sandbox):
    code = """
        import json, os
        print(json.dumps({
            "sys": sorted(os.listdir("/sys")),
            "cgroup": os.path.exists("/sys/fs/cgroup"),
            "net": os.path.exists("/sys/class/net"),
            "online": open("/sys/devices/system/cpu/online").read(),
            "cpu_count": os.cpu_count(),
        }))
    """
    out = run_json(sandbox, code)
    assert out == {
        "sys": ["devices"], "cgroup": False, "net": False,
        "online": Path("/sys/devices/system/cpu/online").read_text(), "cpu_count": os.cpu_count(),
    }


def test_sensitive_proc_entries_are_masked(sandbox):
    masked = [name for name in ("kallsyms", "modules", "keys", "key-users", "timer_list", "sched_debug",
                                "locks", "iomem", "ioports", "vmallocinfo") if os.path.exists(f"/proc/{name}")]
    code = f"""
        import json
        out = {{}}
        for name in {masked + ["self/status", "meminfo", "cpuinfo", "stat", "loadavg"]!r}:
            try:
                with open("/proc/" + name) as f:
                    out[name] = "read" if f.read(64) else "empty"
            except OSError as e:
                out[name] = type(e).__name__
        print(json.dumps(out))
    """
    out = run_json(sandbox, code)
    # world-readable ones are covered by /dev/null; the others are root's alone already
    expected = {name: "empty" if os.stat(f"/proc/{name}").st_mode & 0o004 else "PermissionError" for name in masked}
    assert len(masked) >= 5 and {name: out[name] for name in masked} == expected
    # what Python and its libraries read (os.getloadavg, psutil, multiprocessing) stays
    assert [out[n] for n in ("self/status", "meminfo", "cpuinfo", "stat", "loadavg")] == ["read"] * 5


# --- the same as a non-root host user -------------------------------------------------------------


def test_non_root_host_user_gets_the_same_hardening(as_nobody):
    # As `nobody` bubblewrap builds a user namespace, and the launcher nests its own inside it.
    code = """
        import json
        from factory.sandbox import Sandbox, SandboxConfig
        sandbox = Sandbox(SandboxConfig(timeout_s=8, cpu_s=4, memory_mb=512, tmp_files=100))
        probe = sandbox.run(
            "import ctypes, errno, json, os\\n"
            "libc = ctypes.CDLL(None, use_errno=True)\\n"
            "userns = 'ok' if libc.unshare(0x10000000) == 0 else errno.errorcode[ctypes.get_errno()]\\n"
            "made = 0\\n"
            "try:\\n"
            "    while made < 1000:\\n"
            "        open(f'/tmp/{made}', 'w').close(); made += 1\\n"
            "except OSError:\\n"
            "    pass\\n"
            "status = open('/proc/self/status').read()\\n"
            "print(json.dumps([os.getuid(), userns, made, 'Seccomp:\\\\t2' in status, os.path.exists('/sys/fs/cgroup')]))\\n"
        )
        print(json.dumps([probe.outcome.value, probe.stdout, probe.stderr]))
    """
    done = as_nobody(code)
    assert done.returncode == 0, done.stderr[-2000:]
    outcome, stdout, stderr = json.loads(done.stdout)
    assert outcome == "passed", stderr
    assert json.loads(stdout) == [65534, "EPERM", 100, True, False]


# --- configuration --------------------------------------------------------------------------------


def test_unhardened_command_line_is_the_older_one():
    # bench/infer_bench.py compares against this; it must really drop every hardening step
    args = dict(bwrap="bwrap", python=sys.executable, uid=40_000, code_fd=5, status_fd=6)
    hard = bwrap_module.build_argv(CONFIG, seccomp_fd=7, **args)
    soft = bwrap_module.build_argv(CONFIG.model_copy(update={"harden": False}), **args)
    pairs = lambda argv: {(a, b) for a, b in zip(argv, argv[1:])}  # noqa: E731
    assert ("/sys", "/sys") in pairs(soft) and ("/sys", "/sys") not in pairs(hard)
    assert ("--ro-bind", "/sys/devices/system/cpu") in pairs(hard)
    assert hard[-2] == soft[-2] == sys.executable and (hard[-3], soft[-3]) == ("7", "-1")  # the seccomp fd
    with pytest.raises(ValueError, match="seccomp_fd=-1 does not match harden=True"):
        bwrap_module.build_argv(CONFIG, **args)  # hardened without a filter would silently run unfiltered


def test_unhardened_sandbox_still_runs():
    r: ExecResult = Sandbox(CONFIG.model_copy(update={"harden": False, "workers": 1})).run(
        "import os\nprint(os.path.exists('/sys/fs/cgroup'), open('/proc/self/status').read().count('Seccomp:\\t0'))")
    assert (r.outcome, r.stdout) == (Outcome.PASSED, "True 1\n")


def test_missing_libseccomp_refuses_instead_of_running_unfiltered(monkeypatch):
    from factory.sandbox import seccomp

    seccomp.filter_bpf.cache_clear()
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "pyseccomp", None)  # `import pyseccomp` now raises ImportError
        with pytest.raises(SandboxUnavailable, match=r"seccomp filter needs libseccomp.*pip install pyseccomp"):
            Sandbox(CONFIG.model_copy(update={"timeout_s": 19}))  # a config whose probe is not cached
    assert len(seccomp.filter_bpf()) % 8 == 0  # back with the binding: classic BPF, 8 bytes an instruction
