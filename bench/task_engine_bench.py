"""Task-engine throughput: attempts per second through `factory.tasks.engine` against bare sandbox
executions per second of the same program (`Sandbox.map`), side by side; goal ratio >= 0.8.

The attempt is realistic in shape: a sandboxed Python program (the candidate text) that computes a
little and runs a few asserts, ~0.1-0.3 s with interpreter start. Bare: `Sandbox(workers=W).map` of
N such programs in this process. Engine: N requests with distinct candidates (the same program plus
a numbered comment, so N attempt keys) through a `TaskEngine(workers=W)` on a local Ray instance,
each try running its program with `Sandbox.run` in a Ray worker, results committed to
`tasks.attempts` of a temporary lake in batches: the engine's whole path, Iceberg included.

Both sides warm up first (the bare pool's interpreter probe; the Ray workers' start, imports and
sandbox probe), then `--rounds` rounds alternate bare and engine so that the load of other work on
the machine falls on both. Ray's start time and the instance's memory are printed too. The ratio is
engine/bare per round and overall (total attempts / total seconds on each side).

    .venv/bin/python bench/task_engine_bench.py [--n 40] [--workers 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from factory.lake import Lake  # noqa: E402
from factory.sandbox import Outcome, Sandbox, SandboxConfig  # noqa: E402
from factory.tasks.engine import AttemptRequest, EngineConfig, TaskEngine  # noqa: E402
from factory.tasks.engine_ray import memory_mb  # noqa: E402

PROGRAM = '''
import collections, json, re

def primes(n):
    sieve = bytearray([1]) * (n + 1)
    sieve[0:2] = b"\\0\\0"
    for i in range(2, int(n ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i::i] = bytes(len(sieve[i * i::i]))
    return [i for i, s in enumerate(sieve) if s]

found = primes(300_000)
assert len(found) == 25997, len(found)
assert found[:5] == [2, 3, 5, 7, 11]
words = collections.Counter(re.findall(r"[a-z]+", " ".join(json.dumps({"n": p}) for p in found[:20000])))
assert words["n"] == 20000
assert sum(p % 10 for p in found) > 0
print("ok")
'''


class RunProgram:
    """Engine work: run the candidate as a program in this worker's sandbox; reward 1 when it passed."""

    def __init__(self, config: SandboxConfig):
        self.config, self.sandbox = config, None  # built in the worker (each unpickles the work once)

    def __call__(self, request):
        if self.sandbox is None:
            self.sandbox = Sandbox(self.config)
        result = self.sandbox.run(request.candidate)
        return {"outcome": result.outcome.value, "reward": float(result.outcome is Outcome.PASSED),
                "sandbox_s": round(result.duration_s, 4)}


def programs(n: int, offset: int) -> list[str]:
    return [f"{PROGRAM}# attempt {offset + i}\n" for i in range(n)]


def bare(sandbox: Sandbox, n: int, offset: int) -> float:
    started = time.perf_counter()
    results = sandbox.map(programs(n, offset))
    wall = time.perf_counter() - started
    bad = [r for r in results if r.outcome is not Outcome.PASSED]
    assert not bad, f"bare: {len(bad)} programs did not pass: {bad[0].reason} {bad[0].stderr[-300:]}"
    return wall


def engined(engine: TaskEngine, n: int, offset: int) -> float:
    requests = [AttemptRequest(task_id="bench", candidate=p, consumer="bench") for p in programs(n, offset)]
    started = time.perf_counter()
    results = engine.run(requests)
    wall = time.perf_counter() - started
    bad = [r for r in results if r.outcome != "passed"]
    assert not bad, f"engine: {len(bad)} attempts did not pass: {bad[0].outcome} {bad[0].error} {bad[0].detail}"
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=40, help="programs per round and side")
    parser.add_argument("--workers", type=int, default=2, help="concurrent executions on each side")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    limits = dict(timeout_s=30, cpu_s=30, memory_mb=1024)
    pool = Sandbox(SandboxConfig(workers=args.workers, **limits))
    one = pool.run(PROGRAM)
    print(f"program: {one.outcome.value} in {one.duration_s:.3f}s alone (sandbox wall)")

    with tempfile.TemporaryDirectory(prefix="engine-bench-") as home:
        config = EngineConfig(workers=args.workers, lease_s=60, max_retries=1)
        with TaskEngine(config, RunProgram(SandboxConfig(workers=1, **limits)), lake=Lake.open(home=home)) as engine:
            pids = engine.processes()
            print(f"ray: init {engine.init_s:.1f}s, {len(pids)} processes, {memory_mb(pids):.0f} MiB RSS")
            engined(engine, 2 * args.workers, offset=-1000)  # warm-up: worker processes, imports, sandbox probe
            bare(pool, 2 * args.workers, offset=-1000)
            rows, totals = [], {"bare": 0.0, "engine": 0.0}
            for round_ in range(args.rounds):
                b = bare(pool, args.n, offset=round_ * args.n)
                e = engined(engine, args.n, offset=round_ * args.n)
                totals["bare"] += b
                totals["engine"] += e
                rows.append((round_, args.n / b, args.n / e))
            print(f"ray: {memory_mb(engine.processes()):.0f} MiB RSS after the runs")
    print(f"\n| round | bare sandbox exec/s | engine attempts/s | ratio |\n|---:|---:|---:|---:|")
    for round_, b, e in rows:
        print(f"| {round_} | {b:.2f} | {e:.2f} | {e / b:.2f} |")
    n = args.n * args.rounds
    b, e = n / totals["bare"], n / totals["engine"]
    print(f"| all ({n} each, workers={args.workers}) | {b:.2f} | {e:.2f} | {e / b:.2f} |")
    print(f"\nratio engine/bare = {e / b:.2f} (goal >= 0.8)")


if __name__ == "__main__":
    main()
