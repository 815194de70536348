"""Where the test suite's time goes: each tier's wall and CPU time, the slowest tests and fixtures,
and how often each kind of server is started in one run.

Method. `--run` runs a suite command (default `make test`) with `FACTORY_SUITE_TIMING=<dir>`,
which turns on the timing plugin (`tests/suite_timing.py`, which tests/conftest.py hands every session):
it writes one JSON file per pytest process into the directory, then prints the report; `--report DIR` prints it again from such
a directory; `--compare BEFORE AFTER` prints two runs' tier tables side by side with the ratio
after/before. `--durations FILE` (with `--run` or `--report`) writes each test file's seconds (its
tests' setup + call + teardown) as JSON: tests/durations.json, from which tests/conftest.py hands
pytest-xdist the longest files first, so that a lane's workers end together. `.ci/run` prints the short form (`--top 20`) at the end of every CI run. `--coverage` (with
`make test`) adds line coverage of the core and the Dagster layer through pytest-cov, each lane's
data combined at the end.

A process's wall time runs from its plugin's start (after collection's imports) to its session's
end; its CPU time is its own plus its waited-for children's (`getrusage`), so a server killed and
reaped counts, a daemon that outlives the process does not. A fixture's time is its setup (a
session fixture is paid once, by the first test that asks). Server counts come from a process-table
sampler (every 0.25 s) plus a count of in-process vLLM engines (see tests/suite_timing.py). With
`--run`, a sampler of its own reads every process's CPU time from /proc every 0.5 s and sums it by
kind of process (`KINDS`: Spark's JVMs, `make demo`, trainers, `dagster dev`, Ray, ...), reaped or
not: what the pytest processes' figures miss.

    .venv/bin/python bench/suite_bench.py --run [--coverage] [--out DIR] [-- COMMAND ...]
    .venv/bin/python bench/suite_bench.py --report DIR [--top 30] [--durations tests/durations.json]
    .venv/bin/python bench/suite_bench.py --compare BEFORE_DIR AFTER_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import re
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]


def load(directory: Path) -> list[dict]:
    records = [json.loads(p.read_text()) for p in sorted(directory.glob("*.json")) if p.name != "run.json"]
    if not records:
        raise SystemExit(f"suite_bench: {directory} holds no timing records (was the suite run with "
                         f"FACTORY_SUITE_TIMING={directory}?)")
    return records


def summary(directory: Path) -> dict:
    records = load(directory)
    mains = [r for r in records if not r.get("worker")]
    run_file = directory / "run.json"
    run = json.loads(run_file.read_text()) if run_file.exists() else {}
    tests, fixtures, servers, cpu = {}, [], Counter(), {}
    for r in records:
        tests.update(r["tests"])
        cpu.update(r.get("test_cpu", {}))
        fixtures += r["fixtures"]
        servers.update(r["servers"])
    tiers: dict[str, dict] = defaultdict(lambda: {"tests": 0, "seconds": 0.0})
    for t in tests.values():
        tiers[t["tier"]]["tests"] += 1
        tiers[t["tier"]]["seconds"] += sum(t.get(w, 0.0) for w in ("setup", "call", "teardown"))
    return {"run": run, "processes": mains, "tests": tests, "fixtures": fixtures, "servers": servers, "tiers": tiers,
            "cpu": cpu}


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:5.1f} min"


def report(directory: Path, top: int) -> None:
    s = summary(directory)
    if s["run"]:
        print(f"suite: `{s['run']['command']}` took {s['run']['wall']:.0f} s wall ({_minutes(s['run']['wall'])}), "
              f"exit {s['run']['exit']}")
        if "machine_busy" in s["run"]:
            busy, wall, cores = s["run"]["machine_busy"], s["run"]["wall"], s["run"]["cores"]
            print(f"machine: {busy:.0f} core-seconds busy of {wall * cores:.0f} ({cores} cores x wall: "
                  f"{100 * busy / (wall * cores):.0f} %), whatever ran them (the demo lane, servers, daemons included)")
        if s["run"].get("cpu_by_kind"):
            kinds = s["run"]["cpu_by_kind"]
            print(f"CPU by kind of process ({sum(kinds.values()):.0f} s seen by a 0.5 s /proc sampler):")
            for kind, seconds in kinds.items():
                print(f"  {seconds:8.0f} s  {kind}")
        if "coverage" in s["run"]:
            print(f"line coverage of {COVERED}: {s['run']['coverage']} %")
    print("\npytest processes (wall from plugin start to session end; CPU = own + reaped children):")
    print(f"  {'process':<28} {'wall s':>8} {'CPU s':>8} {'tests':>6} {'exit':>5}")
    for p in s["processes"]:
        print(f"  {p['label']:<28} {p['wall']:8.0f} {p['cpu']:8.0f} {len(p['tests']):6d} {p['exitstatus']:5d}")
    print("\ntiers (the sum of their tests' setup + call + teardown):")
    for tier, t in sorted(s["tiers"].items(), key=lambda kv: -kv[1]["seconds"]):
        print(f"  {tier:<10} {t['tests']:5d} tests {t['seconds']:8.0f} s")
    outcomes = Counter(t["outcome"] for t in s["tests"].values())
    print("  outcomes: " + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())))
    durations = sorted(((sum(t.get(w, 0.0) for w in ("setup", "call", "teardown")), node, t["tier"])
                        for node, t in s["tests"].items()), reverse=True)
    print(f"\nthe {top} slowest tests (setup + call + teardown):")
    for seconds, node, tier in durations[:top]:
        print(f"  {seconds:7.1f} s  [{tier}] {node}")
    if top >= 30:
        print(f"\nthe {top} slowest fixture setups:")
        for f in sorted(s["fixtures"], key=lambda f: -f["seconds"])[:top]:
            print(f"  {f['seconds']:7.1f} s  {f['fixture']} ({f['scope']}) for {f['test']}")
    if s["cpu"]:
        files: Counter = Counter()
        for node, seconds in s["cpu"].items():
            files[node.split("::")[0]] += seconds
        print(f"\nthe {top} test files that spent the most CPU (their processes and reaped children, "
              f"{sum(files.values()):.0f} s in all):")
        for path, seconds in files.most_common(top):
            print(f"  {seconds:7.1f} s  {path}")
    print("\nservers started in this run:")
    for kind, n in sorted(s["servers"].items(), key=lambda kv: -kv[1]) or [("(none)", 0)]:
        print(f"  {n:4d}  {kind}")


def compare(before: Path, after: Path) -> None:
    a, b = summary(before), summary(after)
    print(f"  {'':<12} {'before':>10} {'after':>10} {'after/before':>13}")
    if a["run"] and b["run"]:
        print(f"  {'suite wall':<12} {a['run']['wall']:10.0f} {b['run']['wall']:10.0f} "
              f"{b['run']['wall'] / a['run']['wall']:13.2f}")
    for tier in sorted(set(a["tiers"]) | set(b["tiers"])):
        x, y = a["tiers"].get(tier, {"seconds": 0.0}), b["tiers"].get(tier, {"seconds": 0.0})
        ratio = f"{y['seconds'] / x['seconds']:13.2f}" if x["seconds"] else f"{'-':>13}"
        print(f"  {tier:<12} {x['seconds']:10.0f} {y['seconds']:10.0f} {ratio}")
    print(f"  {'tests':<12} {len(a['tests']):10d} {len(b['tests']):10d}")
    for kind in sorted(set(a["servers"]) | set(b["servers"])):
        print(f"  {kind[:40]:<40} {a['servers'].get(kind, 0):4d} -> {b['servers'].get(kind, 0):4d}")


COVERED = "factory, assets, resources, sensors, kernels"


def coverage_rc(out: Path) -> Path:
    """A coverage config for one run: every lane (and xdist worker) saves its own data file under
    `out`, combined at the end (`parallel`), over the core and the Dagster layer."""
    rc = out / "coverage.rc"
    rc.write_text(f"[run]\nsource = {COVERED}\nparallel = True\ndata_file = {out / '.coverage'}\n")
    return rc


def coverage_total(out: Path) -> str:
    rc, python = out / "coverage.rc", str(CHECKOUT / ".venv" / "bin" / "python")
    subprocess.run([python, "-m", "coverage", "combine", f"--rcfile={rc}"], cwd=CHECKOUT, capture_output=True)
    done = subprocess.run([python, "-m", "coverage", "report", f"--rcfile={rc}", "--format=total", "--precision=2"],
                          cwd=CHECKOUT, capture_output=True, text=True)
    return done.stdout.strip() or done.stderr.strip()


def _busy_seconds() -> float:
    """CPU seconds the whole machine spent busy so far (/proc/stat: all but idle and iowait): how
    close a run came to the cores' capacity, counting what no pytest process reaps."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


# What a process is, by its command line (the first match): where the machine's CPU went, whatever
# process reaped it or none did (a JVM, a daemon, an orphan of a killed group).
KINDS: list[tuple[str, str]] = [
    ("Spark JVMs (drivers, masters, workers, executors)", r"java .*org\.apache\.spark"),
    ("other JVMs", r"(^|/)java "),
    ("Spark Python workers", r"pyspark\.(daemon|worker)"),
    ("make demo (its Dagster session, runs, trainer, vLLM)", r"factory\.demo|jobs/cli_session\.py"),
    ("trainer subprocesses (factory.train, torchrun)", r"factory\.train\b|torch\.distributed\.run|torchrun"),
    ("RL / SFT subprocesses", r"factory\.posttrain"),
    ("dagster dev: webserver, daemon, code servers", r"dagster(-webserver|-daemon)? |dagster api grpc|dagster code-server"
     r"|dagster dev|dagster-webserver|dagster-daemon"),
    ("dagster run and step workers, the dagster CLI", r"dagster (api execute|asset|job|instance)|dagster-graphql"),
    ("Ray (gcs, raylet, workers)", r"ray/|raylet|gcs_server|default_worker\.py|ray::"),
    ("SeaweedFS", r"(^|/)weed "),
    ("PostgreSQL", r"postgres"),
    ("Prometheus", r"prometheus"),
    ("Chromium", r"chrom"),
    ("image build (buildah, podman)", r"buildah|podman|runc|debootstrap"),
    ("sandbox (bubblewrap)", r"bwrap"),
    ("the factory CLI", r"bin/factory |factory\.cli"),
    # an xdist worker is `python -c "import sys;exec(eval(sys.stdin.readline()))"` (execnet)
    ("pytest (workers and their in-process work)", r"pytest|xdist|execnet|exec\(eval\(sys\.stdin"),
    ("pip, uv (bench requirements, environment builds)", r"(^|/)(pip|uv)( |$)|-m pip"),
    ("other Python", r"python"),
]


class CpuByKind(threading.Thread):
    """Scans /proc every `interval` s and keeps each process's latest user + system time, so a
    process's CPU counts by its kind (KINDS) whoever reaps it; one that lives less than an interval
    is missed, which is why the machine's busy time is printed beside the sum."""

    def __init__(self, interval: float = 0.5):
        super().__init__(daemon=True, name="cpu-by-kind")
        self.interval, self.stopping = interval, threading.Event()
        self.tick = os.sysconf("SC_CLK_TCK")
        self.cpu: dict[tuple[int, int], float] = {}  # (pid, start time) -> seconds so far
        self.kind: dict[tuple[int, int], str] = {}
        self.me = os.getpid()

    def scan(self) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == self.me:
                continue
            try:
                fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
                key = (int(entry.name), int(fields[19]))
                self.cpu[key] = (int(fields[11]) + int(fields[12])) / self.tick
                if key not in self.kind:
                    argv = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    self.kind[key] = next((k for k, pattern in KINDS if re.search(pattern, argv)), "other")
            except (OSError, ValueError, IndexError):
                continue

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.scan()

    def totals(self, before: dict) -> dict[str, float]:
        """CPU seconds by kind since `before` (a copy of `cpu` taken at the start)."""
        out: Counter = Counter()
        for key, seconds in self.cpu.items():
            out[self.kind.get(key, "other")] += seconds - before.get(key, 0.0)
        return {k: round(v, 1) for k, v in out.most_common() if v >= 0.05}


def run(out: Path, command: list[str], top: int, coverage: bool = False) -> int:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, FACTORY_SUITE_TIMING=str(out))
    if coverage:  # make's PYTEST_ARGS, not PYTEST_ADDOPTS: that would reach the pytest runs tests start
        command = [*command, f"PYTEST_ARGS=--cov --cov-config={coverage_rc(out)} --cov-report="]
    sampler = CpuByKind()
    sampler.scan()
    before = dict(sampler.cpu)
    sampler.start()
    start, busy = time.time(), _busy_seconds()
    code = subprocess.call(command, cwd=CHECKOUT, env=env)
    sampler.stopping.set()
    record = {"command": " ".join(command), "wall": time.time() - start, "exit": code,
              "machine_busy": _busy_seconds() - busy, "cores": os.cpu_count(), "cpu_by_kind": sampler.totals(before)}
    if coverage:
        record["coverage"] = coverage_total(out)
    (out / "run.json").write_text(json.dumps(record))
    report(out, top)
    print(f"\ntiming records: {out}")
    return code


def write_durations(directory: Path, path: Path) -> None:
    per_file: Counter = Counter()
    for test_id, t in summary(directory)["tests"].items():
        per_file[test_id.split("::")[0]] += sum(t.get(w, 0.0) for w in ("setup", "call", "teardown"))
    path.write_text(json.dumps({f: round(s, 1) for f, s in sorted(per_file.items())}, indent=0) + "\n")
    print(f"{len(per_file)} test files' seconds written to {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--run", action="store_true", help="run COMMAND (default: make test) and report")
    mode.add_argument("--report", type=Path, metavar="DIR", help="report a finished run's records")
    mode.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--out", type=Path, help="where --run writes its records (default: a new temp dir)")
    parser.add_argument("--coverage", action="store_true",
                        help=f"with --run of make test: line coverage of {COVERED} (pytest-cov), combined")
    parser.add_argument("--top", type=int, default=30, help="how many slowest tests (and fixtures, at 30+)")
    parser.add_argument("--durations", type=Path, metavar="FILE",
                        help="write each test file's seconds to FILE (tests/durations.json orders the lanes)")
    parser.add_argument("command", nargs="*", help="the suite command after --, default: make test")
    args = parser.parse_args()
    if args.report:
        report(args.report, args.top)
        if args.durations:
            write_durations(args.report, args.durations)
        return 0
    if args.compare:
        compare(*args.compare)
        return 0
    out = args.out or Path(tempfile.mkdtemp(prefix="suite-timing-"))
    code = run(out, args.command or ["make", "test"], args.top, args.coverage)
    if args.durations:
        write_durations(out, args.durations)
    return code


if __name__ == "__main__":
    sys.exit(main())
