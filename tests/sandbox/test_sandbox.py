"""The bubblewrap sandbox, end to end with real bwrap: every outcome (passed, failed, timeout by wall
clock and by CPU limit, oom by MemoryError and by the memory cgroup, crashed by signal), network
isolation (loopback, DNS, external), the read-only filesystem and private /tmp, the clean
environment, output truncation, the file-size limit, fork bombs contained with and without cgroups,
no process outliving an execution, the pool's ordering and parallelism, and the refusals when
bubblewrap is missing or cannot build namespaces.

These run on CPU, need bubblewrap (`apt-get install bubblewrap`), and take ~30 s on two cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from factory.sandbox import (
    ExecResult,
    Outcome,
    Sandbox,
    SandboxConfig,
    SandboxUnavailable,
    cgroup,
    check_available,
)
from factory.sandbox import bwrap as bwrap_module
from factory.sandbox.config import classify

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)")

REPO = Path(__file__).resolve().parents[2]
# the wall clock well above the CPU limit: a loaded machine (this suite also runs inside the image beside other
# tests) must not turn a CPU-limit case into a wall-clock one
FAST = SandboxConfig(timeout_s=8, cpu_s=2, memory_mb=512, workers=2)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(FAST)


def run(sandbox: Sandbox, code: str, **kw) -> ExecResult:
    return sandbox.run(textwrap.dedent(code), **kw)


def survivors(marker: str) -> list[int]:
    """Pids of live processes whose command line contains `marker` (zombies have an empty one)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def leftover_cgroups() -> list[Path]:
    dirs = [cgroup._own_dir(c) for c in ("pids", "memory")]
    return [p for d in dirs if d is not None for p in d.glob(f"factory-sandbox-{os.getpid()}-*")]


# --- outcomes -------------------------------------------------------------------------------------


def test_passed_with_stdout_stdin_and_duration(sandbox):
    r = run(sandbox, "import sys\nprint('got', sys.stdin.read().upper())", stdin="hello")
    assert (r.outcome, r.reason, r.returncode) == (Outcome.PASSED, "exit 0", 0)
    assert r.stdout == "got HELLO\n" and r.stderr == "" and not r.truncated
    assert r.duration_s > 0 and r.cpu_s is not None


def test_exception_and_exit_codes_are_failed(sandbox):
    r = run(sandbox, "raise ValueError('boom')")
    assert (r.outcome, r.reason, r.returncode) == (Outcome.FAILED, "exit 1", 1)
    assert "ValueError: boom" in r.stderr and 'File "/sandbox/main.py", line 1' in r.stderr
    # 139 is what a shell (and bubblewrap) would print for SIGSEGV; the launcher's status tells them apart
    r = run(sandbox, "import sys; sys.exit(139)")
    assert (r.outcome, r.returncode) == (Outcome.FAILED, 139)


@pytest.mark.parametrize(
    "code, signal_name, returncode",
    [("import ctypes; ctypes.string_at(0)", "SIGSEGV", -11), ("import os; os.abort()", "SIGABRT", -6)],
)
def test_signal_deaths_are_crashed(sandbox, code, signal_name, returncode):
    r = run(sandbox, code)
    assert (r.outcome, r.reason, r.returncode) == (Outcome.CRASHED, f"signal {signal_name}", returncode)


@pytest.mark.parametrize(
    "code", ["x = bytearray(10**11)", "chunks = []\nwhile True:\n    chunks.append(bytearray(10**6))"], ids=["huge", "gradual"]
)
def test_memory_bombs_are_oom(code):
    # its own limits: the page faults of 512 MB are system CPU time, which on a loaded machine (the image
    # test runs this right after a build) outgrew FAST's 2 s before the memory ran out
    r = run(Sandbox(SandboxConfig(timeout_s=30, cpu_s=20, memory_mb=512, workers=1)), code)
    assert r.outcome is Outcome.OOM and r.reason == "MemoryError (exit 1)"
    assert r.stderr.rstrip().endswith("MemoryError")


# The CPU-limit tests give the wall clock room (60 s; idle they end after 1-2 s): on a loaded machine
# (the suite's lanes side by side) a program gets a fraction of a core, and the wall clock must not
# end it before its CPU seconds run out. The reason and the signal show which limit ended it.
def test_busy_loop_hits_the_cpu_limit():
    r = run(Sandbox(SandboxConfig(timeout_s=60, cpu_s=2, memory_mb=512)), "while True: pass")
    assert (r.outcome, r.reason, r.returncode) == (Outcome.TIMEOUT, "cpu limit 2s (SIGXCPU)", -24)
    assert r.duration_s > 1.5  # two CPU seconds take at least that much wall time


def test_ignoring_sigxcpu_still_ends_in_sigkill_timeout():
    patient = Sandbox(SandboxConfig(timeout_s=60, cpu_s=1, memory_mb=512))
    r = patient.run("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass")
    assert r.outcome is Outcome.TIMEOUT and r.returncode == -9
    assert r.reason.startswith("cpu limit 1s (SIGKILL after")


def test_wall_clock_timeout_kills_the_tree():
    marker = f"marker-{uuid.uuid4().hex}"
    quick = Sandbox(SandboxConfig(timeout_s=1, cpu_s=5, memory_mb=512))
    code = f"""
        import subprocess, sys, time
        for _ in range(3):
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"], start_new_session=True)
        print("started", flush=True)
        time.sleep(600)
    """
    r = run(quick, code)
    assert (r.outcome, r.reason, r.returncode) == (Outcome.TIMEOUT, "wall-clock timeout", None)
    assert r.stdout == "started\n"  # output written before the kill still arrives
    assert r.duration_s >= 1.0
    assert survivors(marker) == []


def test_detached_children_die_with_the_program(sandbox):
    marker = f"marker-{uuid.uuid4().hex}"
    code = f"""
        import os, subprocess, sys
        if os.fork() == 0:  # double fork + new session: the classic daemon escape
            os.setsid()
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"])
            os._exit(0)
        os.wait()
        print("parent done")
    """
    r = run(sandbox, code)
    assert r.outcome is Outcome.PASSED and r.stdout == "parent done\n"
    assert survivors(marker) == []


def test_file_size_and_tmpfs_limits_cut_big_writes(sandbox):
    r = run(sandbox, "open('/tmp/big', 'wb').write(b'x' * (100 << 20))")
    assert r.outcome is Outcome.FAILED and "[Errno 27] File too large" in r.stderr
    # many files under the per-file limit still stop at the tmpfs size (64 MiB), not the host's RAM
    r = run(sandbox, "for i in range(8):\n    open(f'/tmp/{i}', 'wb').write(b'x' * (15 << 20))")
    assert r.outcome is Outcome.FAILED and "[Errno 28] No space left on device" in r.stderr


def test_classify_rules_without_a_sandbox():
    sigkill, exit1 = 9, 1 << 8
    kw = dict(stderr="", wall_timeout=False, limit_cpu_s=10)
    assert classify(sigkill, cpu_s=0.5, cgroup_oom=True, **kw)[0] is Outcome.OOM
    assert classify(sigkill, cpu_s=11.0, cgroup_oom=False, **kw)[0] is Outcome.TIMEOUT
    assert classify(sigkill, cpu_s=0.5, cgroup_oom=False, **kw)[:2] == (Outcome.CRASHED, "signal SIGKILL")
    assert classify(exit1, cpu_s=0.1, cgroup_oom=True, **kw)[0] is Outcome.OOM
    assert classify(None, cpu_s=None, cgroup_oom=False, **{**kw, "wall_timeout": True})[0] is Outcome.TIMEOUT


# --- isolation ------------------------------------------------------------------------------------


def test_no_network_not_even_host_loopback(sandbox):
    code = """
        import socket
        for target in [("127.0.0.1", 22), ("127.0.0.1", 80), ("1.1.1.1", 80)]:
            try:
                socket.create_connection(target, timeout=2)
                print(target, "CONNECTED")
            except OSError as e:
                print(target, type(e).__name__)
        socket.getaddrinfo("example.com", 80)
    """
    r = run(sandbox, code)
    assert r.outcome is Outcome.FAILED and "CONNECTED" not in r.stdout
    assert "('127.0.0.1', 22) ConnectionRefusedError" in r.stdout  # the sandbox's own, empty loopback
    assert "('1.1.1.1', 80) OSError" in r.stdout  # Network is unreachable: no route out
    assert "socket.gaierror" in r.stderr  # DNS fails too


def test_filesystem_is_read_only_except_private_tmp(sandbox):
    name = f"sandbox-{uuid.uuid4().hex}"
    host_home = os.path.join(os.path.expanduser("~"), name)
    denied = ["/etc/" + name, str(REPO / name), host_home, "/usr/" + name, "/" + name, "/dev/" + name, "/sandbox/" + name]
    targets = denied + ["/tmp/" + name, "/dev/shm/" + name]
    code = f"""
        import json
        out = {{}}
        for path in {targets!r}:
            try:
                with open(path, "w") as f:
                    f.write("x")
                out[path] = "written"
            except OSError as e:
                out[path] = type(e).__name__
        print(json.dumps(out))
    """
    r = run(sandbox, code)
    assert r.outcome is Outcome.PASSED, r.stderr
    result = json.loads(r.stdout)
    assert {path: result[path] for path in targets[-2:]} == dict.fromkeys(targets[-2:], "written")
    assert all(result[path] in ("OSError", "PermissionError", "FileNotFoundError") for path in denied), result
    assert not any(os.path.exists(p) for p in targets)  # nothing reached the host, /tmp included


def test_host_files_are_not_visible(sandbox):
    r = run(sandbox, f"import os, json\nprint(json.dumps([os.listdir('/'), os.path.exists({str(REPO / 'factory')!r})]))")
    top, checkout_visible = json.loads(r.stdout)
    assert {"usr", "etc", "tmp", "proc", "dev", "sandbox"} <= set(top) and not set(top) & {"home", "run", "var", "mnt"}
    assert checkout_visible is False  # only the interpreter's prefixes are bound, not the checkout


def test_environment_is_clean_and_uid_unprivileged(sandbox, monkeypatch):
    monkeypatch.setenv("FACTORY_SECRET", "hunter2")
    r = run(sandbox, "import os, json\nprint(json.dumps([dict(os.environ), os.getuid(), os.getcwd()]))")
    env, uid, cwd = json.loads(r.stdout)
    assert "hunter2" not in r.stdout and "FACTORY_SECRET" not in env
    assert env["HOME"] == "/tmp" and env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and cwd == "/tmp"
    assert uid != 0 if os.geteuid() == 0 else uid == os.geteuid()


def test_output_is_truncated_with_a_flag():
    small = Sandbox(SandboxConfig(timeout_s=2, cpu_s=5, memory_mb=512, max_output_bytes=1000))
    r = small.run("import sys\nprint('a' * 100_000)\nsys.stderr.write('e' * 10)")
    assert r.outcome is Outcome.PASSED and r.truncated
    assert r.stdout == "a" * 1000 and r.stderr == "e" * 10
    # an endless flood is drained (the program is not stalled on a full pipe) and never buffered
    r = small.run("while True:\n    print('x' * 1000)")
    assert r.outcome is Outcome.TIMEOUT and r.truncated and len(r.stdout) == 1000
    assert not small.run("print('ok')").truncated


# --- processes and memory -------------------------------------------------------------------------

# Each bomb first re-executes itself with a marker argument of its test's own, so that the survivors
# looked for are its own processes, not those of a sandbox another test runs at the same time.
MARKED = "import os, sys\nif sys.argv[-1] != {marker!r}:\n    os.execv(sys.executable, [sys.executable, *sys.argv, {marker!r}])\n"
FORK_BOMB = "while True:\n    os.fork()"
STUBBORN_FORK_BOMB = "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass"


@pytest.mark.parametrize("use_cgroups", [True, False], ids=["cgroups", "rlimits-only"])
@pytest.mark.slow
def test_fork_bomb_is_contained_and_host_unaffected(use_cgroups, monkeypatch):
    if use_cgroups and not cgroup._usable():
        pytest.skip("cgroup v1 pids/memory not writable here; the rlimits-only case covers this machine")
    monkeypatch.setattr(cgroup, "_USABLE", use_cgroups)
    bombs = Sandbox(SandboxConfig(timeout_s=2, cpu_s=2, memory_mb=256, max_processes=32, workers=2))
    marker = f"marker-{uuid.uuid4().hex}"
    plain, stubborn = bombs.map([MARKED.format(marker=marker) + bomb for bomb in (FORK_BOMB, STUBBORN_FORK_BOMB)])
    # the first dies of its first refused fork; the second keeps the tree full until the wall clock
    assert plain.outcome is Outcome.FAILED and "BlockingIOError" in plain.stderr
    assert stubborn.outcome is Outcome.TIMEOUT
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork
    assert survivors(marker) == []  # and nothing of the bombs is left
    assert leftover_cgroups() == []


@pytest.mark.skipif(not cgroup._usable(), reason="needs writable cgroup v1 memory (falls back to rlimits elsewhere)")
def test_memory_cgroup_caps_the_whole_tree():
    # each child stays under its own RLIMIT_AS, but together they are 3x the cap: only a cgroup sees that
    code = """
        import os, time
        kids = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                block = bytearray(200 << 20)
                time.sleep(1)  # hold it while the others allocate
                os._exit(0)
            kids.append(pid)
        statuses = [os.waitpid(pid, 0)[1] for pid in kids]
        raise SystemExit(1 if any(os.WIFSIGNALED(s) for s in statuses) else 0)
    """
    r = run(Sandbox(SandboxConfig(timeout_s=20, cpu_s=10, memory_mb=256)), code)
    assert r.outcome is Outcome.OOM and r.reason == "memory cgroup hit its limit (exit 1)"
    assert leftover_cgroups() == []


def test_non_root_host_user_namespace_path(as_nobody):
    # As `nobody` bubblewrap builds a user namespace and the launcher keeps the caller's uid: the
    # process limit must then count this sandbox alone, not every process the user owns.
    code = """
        import json
        from factory.sandbox import Sandbox, SandboxConfig
        sandbox = Sandbox(SandboxConfig(timeout_s=4, cpu_s=2, memory_mb=512, max_processes=16))
        bomb = sandbox.run("import os\\nwhile True:\\n    os.fork()")
        probe = sandbox.run("import os\\nprint(os.getuid())\\nopen('/x', 'w')")
        print(json.dumps([bomb.outcome.value, bomb.stderr, probe.stdout, probe.stderr]))
    """
    done = as_nobody(code)
    bomb_outcome, bomb_stderr, uid, probe_stderr = json.loads(done.stdout)
    assert bomb_outcome == "failed" and "BlockingIOError" in bomb_stderr
    assert uid == "65534\n" and "Read-only file system" in probe_stderr


# --- the pool -------------------------------------------------------------------------------------


def test_map_keeps_order_and_runs_workers_at_a_time(sandbox):
    code = "import time\nstart = time.time()\ntime.sleep(0.05)\nprint({i}, start, time.time())"
    seen = []
    results = sandbox.map([code.format(i=i) for i in range(40)], progress=lambda done, total: seen.append((done, total)))
    assert [r.outcome for r in results] == [Outcome.PASSED] * 40
    rows = [r.stdout.split() for r in results]
    assert [int(row[0]) for row in rows] == list(range(40))
    assert seen == [(done, 40) for done in range(1, 41)]
    spans = [(float(row[1]), float(row[2])) for row in rows]
    overlap = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    assert overlap == FAST.workers


# --- refusal --------------------------------------------------------------------------------------


def test_refuses_without_bubblewrap(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no bwrap anywhere
    with pytest.raises(SandboxUnavailable, match=r"bubblewrap.*apt-get install bubblewrap"):
        check_available()
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        Sandbox(FAST)


def test_refuses_when_namespaces_are_forbidden(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text(
        "#!/bin/sh\n"
        '[ "$1" = --version ] && { echo "bubblewrap 0.9.0"; exit 0; }\n'
        'echo "bwrap: No permissions to create new namespace" >&2; exit 1\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(SandboxUnavailable, match="cannot create the sandbox's namespaces.*No permissions"):
        Sandbox(FAST)
    with pytest.raises(SandboxUnavailable, match="cannot create"):  # cached, still refused
        check_available()


def test_refuses_when_bubblewrap_fails_to_build_the_real_sandbox(monkeypatch, tmp_path):
    # passes the namespace probe (which runs `true`) but cannot mount what an execution needs
    fake = tmp_path / "bwrap"
    fake.write_text(
        "#!/bin/sh\n"
        '[ "$1" = --version ] && { echo "bubblewrap 0.9.0"; exit 0; }\n'
        'for last; do :; done; case "$last" in */true) exit 0;; esac\n'
        'echo "bwrap: Can\'t mount proc on /newroot/proc: Operation not permitted" >&2; exit 1\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    check_available()  # the probe alone is satisfied
    with pytest.raises(SandboxUnavailable, match="could not start the sandbox: bwrap: Can't mount proc"):
        Sandbox(FAST)


def test_refuses_old_bubblewrap(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text('#!/bin/sh\necho "bubblewrap 0.4.0"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(SandboxUnavailable, match="older than 0.7.0"):
        check_available()


def test_config_is_frozen_and_strict():
    with pytest.raises(ValidationError):
        SandboxConfig(timeout=3)  # a typo, not silently ignored
    with pytest.raises(ValidationError):
        FAST.timeout_s = 1
    with pytest.raises(SandboxUnavailable, match="not found"):
        Sandbox(SandboxConfig(python="/nonexistent/python3"))
    assert bwrap_module.resolve_interpreter(None) == os.path.abspath(sys.executable)


def test_sandbox_module_never_imports_dagster():
    code = "import sys, factory.sandbox; sys.exit('dagster' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0



def test_an_interpreter_under_the_hosts_tmp_is_bound_over_the_private_tmp(tmp_path):
    """A checkout (and its venv) under /tmp, as CI clones are: the sandbox's own /tmp must not hide it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    assert str(venv).startswith("/tmp/")
    result = Sandbox(SandboxConfig(workers=1, python=str(venv / "bin" / "python"))).run(
        "import sys; print(sys.prefix)")
    assert result.outcome is Outcome.PASSED, result.stderr
    assert result.stdout.strip() == str(venv)
