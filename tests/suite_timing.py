"""A pytest plugin that records where a test run's time goes, for `bench/suite_bench.py` and `.ci/run`.

tests/conftest.py hands it every session; it is active only when `FACTORY_SUITE_TIMING=<dir>` is set
(by bench/suite_bench.py): each pytest process then writes `<dir>/<label>-<pid>.json` at the end of its session with
- its wall time and CPU time (its own and its waited-for children's, from `getrusage`), and its tier
  label (`FACTORY_SUITE_TIER`, else the `-m` expression);
- every test's setup, call and teardown durations, outcome and tier marker, and the CPU time its
  process and the children it reaped spent from its setup to its teardown (a module fixture's
  share lands on the test that set it up or tore it down; a process nobody waits for is missed);
- every fixture setup's duration (name, scope, the test that paid for it);
- the servers started during the run, by kind: a sampler thread scans the process table every
  0.25 s for processes descended from this one (or carrying its tag in their environment, for
  servers that daemonize, like PostgreSQL) whose command line names a server, counting each
  (pid, start time) once; vLLM engines built in this process are counted at their constructor.

Under pytest-xdist the controller writes the tests, wall, CPU and servers, and each worker a file of
its own with the fixtures it set up. While a run goes on, `<label>-progress.jsonl` gets a line per
finished test (its durations and outcome). It changes nothing about how tests run: no fixture, no
marker, no ordering."""

from __future__ import annotations

import json
import os
import resource
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

ENV_DIR, ENV_TIER, ENV_TAG = "FACTORY_SUITE_TIMING", "FACTORY_SUITE_TIER", "FACTORY_SUITE_TIMING_TAG"
TIERS = ("check", "spark", "rest", "slow", "gpu")

# (kind, predicate over the argv list): the first match names a process. Only a server's main
# process matches (a Spark driver's JVM, not its executors; the postmaster, not its backends).
SERVERS: list[tuple[str, object]] = [
    ("Spark session (local driver)", lambda a: "org.apache.spark.deploy.SparkSubmit" in a and "pyspark-shell" in a),
    ("Spark standalone master", lambda a: "org.apache.spark.deploy.master.Master" in a),
    ("Spark standalone worker", lambda a: "org.apache.spark.deploy.worker.Worker" in a),
    ("SeaweedFS", lambda a: bool(a) and os.path.basename(a[0]) == "weed"),
    ("PostgreSQL", lambda a: bool(a) and os.path.basename(a[0]) == "postgres" and "-D" in a),
    ("Ray (gcs_server)", lambda a: bool(a) and os.path.basename(a[0]) == "gcs_server"),
    ("dagster dev", lambda a: _sub(a, ["dagster", "dev"]) or any(x.endswith("/dagster") for x in a) and "dev" in a),
    ("dagster CLI (other)", lambda a: any(os.path.basename(x) in ("dagster", "dagster-graphql", "dagster-webserver")
                                          for x in a[:2]) and "dev" not in a),
    ("vLLM server", lambda a: "vllm.entrypoints.openai.api_server" in a),
    ("make demo", lambda a: "factory.demo" in a),
    ("browser (chromedriver)", lambda a: bool(a) and os.path.basename(a[0]) == "chromedriver"),
    ("Prometheus", lambda a: bool(a) and os.path.basename(a[0]) == "prometheus"),
    ("uvicorn / factory serve / podium", lambda a: any("uvicorn" in x for x in a)
     or _sub(a, ["factory", "serve"]) or _sub(a, ["factory", "podium"])),
    ("torchrun", lambda a: "torch.distributed.run" in a or any(os.path.basename(x) == "torchrun" for x in a[:2])),
    ("trainer subprocess (factory.train)", lambda a: "factory.train" in a),
    ("image build (buildah)", lambda a: bool(a) and os.path.basename(a[0]) == "buildah" and "bud" in a),
]


def _sub(argv: list[str], words: list[str]) -> bool:
    names = [os.path.basename(x) for x in argv]
    return any(names[i:i + len(words)] == words for i in range(len(names)))


def classify(argv: list[str]) -> str | None:
    """The server kind `argv` starts, or None."""
    for kind, match in SERVERS:
        if match(argv):
            return kind
    return None


class ServerSampler(threading.Thread):
    """Counts server processes started below this one (see the module docstring)."""

    def __init__(self, tag: str, interval: float = 0.25):
        super().__init__(daemon=True, name="suite-timing-sampler")
        self.tag, self.interval, self.me = tag, interval, os.getpid()
        self.seen: dict[tuple[int, float], str] = {}
        self.stopping = threading.Event()

    def _ours(self, proc) -> bool:
        try:
            if any(p.pid == self.me for p in proc.parents()):
                return True
            return proc.environ().get(ENV_TAG) == self.tag
        except Exception:  # gone, or not ours to read
            return False

    def scan(self) -> None:
        import psutil

        for proc in psutil.process_iter(["pid", "create_time", "cmdline"]):
            key = (proc.info["pid"], proc.info["create_time"])
            if key in self.seen or proc.info["pid"] == self.me:
                continue
            kind = classify(proc.info["cmdline"] or [])
            if kind and self._ours(proc):
                self.seen[key] = kind

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.scan()

    def counts(self) -> Counter:
        return Counter(self.seen.values())


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def tier_of(keywords) -> str:
    """The tier marker among a report's keywords (conftest gives every item exactly one)."""
    names = [t for t in TIERS if t in keywords]
    return names[0] if names else "check"


class Recorder:
    def __init__(self, out: Path, label: str, worker: str | None):
        self.out, self.label, self.worker = out, label, worker
        self.tests: dict[str, dict] = {}
        self.fixtures: list[dict] = []
        self.engines = 0
        self.tag = os.environ.get(ENV_TAG) if worker else uuid.uuid4().hex
        os.environ[ENV_TAG] = self.tag
        self.sampler = ServerSampler(self.tag)
        self.wall0, self.cpu0 = time.time(), _cpu_seconds()
        out.mkdir(parents=True, exist_ok=True)
        if not worker:  # the controller's sampler sees its workers' descendants
            self.sampler.start()
        self._count_engines()
        self.current, self.uses, self.cpu = "(collection)", {}, {}
        if os.environ.get("FACTORY_SUITE_PROBE"):
            self._probe()

    def _count_engines(self) -> None:
        try:
            from factory.infer import vllm_engine
        except Exception:  # the plugin must never break a run
            return
        original, recorder = vllm_engine.VLLMEngine.__init__, self

        def counted(engine, *args, **kwargs):
            recorder.engines += 1
            return original(engine, *args, **kwargs)

        vllm_engine.VLLMEngine.__init__ = counted

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        start = time.perf_counter()
        yield
        self.fixtures.append({"fixture": fixturedef.argname, "scope": fixturedef.scope,
                              "test": request.node.nodeid, "seconds": time.perf_counter() - start})

    def pytest_runtest_logreport(self, report):
        if self.worker:
            return
        node = report.nodeid.split("@")[0]  # xdist's loadgroup appends "@<group>"
        entry = self.tests.setdefault(node, {"tier": tier_of(report.keywords), "outcome": "passed"})
        entry[report.when] = report.duration
        if report.failed or (report.skipped and entry["outcome"] != "failed"):
            entry["outcome"] = "failed" if report.failed else "skipped"
        if report.when == "teardown":  # a line per finished test, readable while the run goes on
            with open(self.out / f"{self.label}-progress.jsonl", "a") as progress:
                progress.write(json.dumps({"test": node, **entry}) + "\n")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        self.current, cpu0 = item.nodeid, _cpu_seconds()
        yield
        self.cpu[item.nodeid.split("@")[0]] = _cpu_seconds() - cpu0

    def _probe(self) -> None:
        """Record, per test, each inet socket bound or connected and each subprocess started in this
        process (what decides a test's tier: the `check` tier allows neither a socket nor a server)."""
        import socket
        import subprocess

        recorder, bind, connect, popen = self, socket.socket.bind, socket.socket.connect, subprocess.Popen.__init__

        def note(kind: str, detail: str) -> None:
            recorder.uses.setdefault(recorder.current, {}).setdefault(kind, set()).add(detail[:120])

        def probed_bind(sock, address):
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                note("socket", f"bind {address}")
            return bind(sock, address)

        def probed_connect(sock, address):
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                note("socket", f"connect {address}")
            return connect(sock, address)

        def probed_popen(proc, args, *a, **kw):
            argv = [args] if isinstance(args, (str, bytes)) else list(args)
            note("subprocess", " ".join(os.path.basename(str(x)) for x in argv[:4]))
            return popen(proc, args, *a, **kw)

        socket.socket.bind, socket.socket.connect, subprocess.Popen.__init__ = probed_bind, probed_connect, probed_popen

    def pytest_sessionfinish(self, session):
        self.sampler.stopping.set()
        if not self.worker:
            self.sampler.scan()
        servers = dict(self.sampler.counts())
        if self.engines:
            servers["vLLM engine (in process)"] = self.engines
        record = {"label": self.label, "pid": os.getpid(), "wall": time.time() - self.wall0,
                  "cpu": _cpu_seconds() - self.cpu0, "exitstatus": int(session.exitstatus),
                  "worker": self.worker, "tests": self.tests, "test_cpu": self.cpu,
                  "uses": {t: {k: sorted(v) for k, v in u.items()} for t, u in self.uses.items()}, "fixtures": self.fixtures, "servers": servers}
        self.out.mkdir(parents=True, exist_ok=True)
        name = f"{self.label}-{self.worker or 'main'}-{os.getpid()}.json"
        (self.out / name).write_text(json.dumps(record))


def activate(config) -> None:
    """Register the recorder when FACTORY_SUITE_TIMING names a directory (from conftest's pytest_configure)."""
    out = os.environ.get(ENV_DIR)
    if not out:
        return
    # Under pytest-xdist the controller records tests (their reports reach it), wall, CPU and servers;
    # each worker records the fixtures it set up and the engines it built.
    worker = getattr(config, "workerinput", {}).get("workerid")
    label = os.environ.get(ENV_TIER) or config.getoption("markexpr") or "all"
    config.pluginmanager.register(Recorder(Path(out), label.replace(" ", "_"), worker), "factory-suite-timing")
