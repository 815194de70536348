"""Start-up time of the read commands (`factory tables`, `sql`, `lineage`, `evals`, ...) and of
queueing a sweep with no server (`factory sweep launch smoke_lr`), against a home.

Runs every read command of `factory/cli.py` as its own process (what a user types), `--repeat`
times, interleaving this checkout with a baseline checkout (`--base`, e.g. a `git worktree` of the
commit before a change, put first on PYTHONPATH), and prints for each the best wall time, the best
CPU time (user + sys of the child: less noisy than wall on a shared machine), the ratio against
the baseline, and which heavy packages the command imported (torch, pyspark, vllm, transformers,
mlflow, pyiceberg, pyarrow, duckdb, ...). The target (issue 16) is under 2 s wall on an idle
machine; the load average is printed at both ends, rerun when it is above ~1.

Every read command is read only in this checkout, so the bench never writes to the home (safe on a
demo's home); before issue 16 `sweep results` committed `sweeps.results` and a plot, so it is never
run on the baseline (`BASE_WRITES`). `sweep launch` writes (runs into the Dagster instance, each
cell's card into the home), so each of its runs, base and current alike, gets a scratch place
(`scratch_home`): a fresh DAGSTER_HOME with that checkout's configs/dagster.yaml, and a fresh
FACTORY_HOME whose deploy profile names the home's catalog explicitly (the lake is read, the cards
land in the scratch home). Its first run in this checkout may also capture the code location's
snapshots (jobs/queue_runs.py) when the code changed since the last launch: the first wall time is
printed apart. Not part of the tests.

    FACTORY_HOME=/tmp/demo3 DAGSTER_HOME=/tmp/demo3/dagster \\
        .venv/bin/python bench/cli_bench.py [--base /tmp/base_cli] [--repeat 3] [--only tables,sql]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "pyspark", "vllm", "transformers", "mlflow", "dagster", "pandas", "matplotlib", "pyiceberg",
         "pyarrow", "duckdb", "sqlalchemy", "tokenizers", "numpy", "rich")
COMMANDS = {
    "help": ["--help"],
    "tables": ["tables"],
    "sql": ["sql", "select count(*) as n from train.checkpoints"],
    "lineage": ["lineage", "train.checkpoints"],
    "drops": ["drops"],
    "mix list": ["mix", "list"],
    "mix show": ["mix", "show", "default"],
    "evals": ["evals"],
    "experiment list": ["experiment", "list"],
    "experiment show": ["experiment", "show", "smoke"],
    "sweep list": ["sweep", "list"],
    "sweep show": ["sweep", "show", "smoke_lr"],
    "sweep results": ["sweep", "results", "smoke_lr"],
    "doctor": ["doctor"],
    "deploy list": ["deploy", "list"],
    "deploy show": ["deploy", "show"],
    "sweep launch": ["sweep", "launch", "smoke_lr"],
}
BASE_WRITES = {"sweep results"}  # wrote to the home before issue 16: not run on --base
SCRATCH = {"sweep launch"}  # writes: every run in a scratch_home
# Runs `factory ...` in this interpreter and writes the heavy top-level packages it imported.
PROBE = """
import sys
from factory import cli
try:
    code = cli.main(sys.argv[2:])
finally:
    loaded = sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1].split(',')))
    print(','.join(loaded), file=sys.stderr)
sys.exit(code)
"""


@contextmanager
def scratch_home(checkout: Path):
    """Environment overrides that send a writing command's writes to a scratch directory (see above)."""
    from factory.deploy import load_profile
    from factory.home import factory_home, lake_dir

    home, profile = factory_home(), load_profile()
    if profile.catalog.kind == "sql":
        profile = profile.derive(**{"catalog.uri": profile.catalog.uri or f"sqlite:///{lake_dir(home) / 'catalog.db'}",
                                    "catalog.warehouse": profile.catalog.warehouse or (lake_dir(home) / "warehouse").as_uri()})
    scratch = Path(tempfile.mkdtemp(prefix="cli-bench-"))
    try:
        (scratch / "dagster").mkdir()
        shutil.copy(checkout / "configs" / "dagster.yaml", scratch / "dagster" / "dagster.yaml")
        (scratch / "profile.json").write_text(profile.model_dump_json())
        yield {"FACTORY_HOME": str(scratch / "home"), "DAGSTER_HOME": str(scratch / "dagster"),
               "FACTORY_DEPLOY": str(scratch / "profile.json")}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_once(checkout: Path, argv: list[str], scratch: bool = False) -> tuple[float, float, int, str]:
    """(wall s, cpu s, exit code, heavy packages imported) of one `factory argv` in a new process."""
    if scratch:
        with scratch_home(checkout) as env:
            return run_once_in(checkout, argv, env)
    return run_once_in(checkout, argv, {})


def run_once_in(checkout: Path, argv: list[str], overrides: dict[str, str]) -> tuple[float, float, int, str]:
    env = {**os.environ, **overrides, "PYTHONPATH": str(checkout), "COLUMNS": "200"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PROBE, ",".join(HEAVY), *argv], cwd=checkout, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = done.stderr.strip().splitlines()
    return wall, cpu, done.returncode, lines[-1] if lines else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, help="baseline checkout (e.g. git worktree add /tmp/base <commit>)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", help="comma-separated command names of COMMANDS")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(COMMANDS)
    variants = {"now": CHECKOUT, **({"base": args.base.resolve()} if args.base else {})}
    print(f"load average {os.getloadavg()[0]:.2f}; home {os.environ.get('FACTORY_HOME', '(default)')}")
    results: dict[str, dict[str, dict]] = {}
    for name in names:
        results[name] = {}
        runs: dict[str, list] = {v: [] for v in variants}
        for _ in range(args.repeat):
            for variant, checkout in variants.items():  # interleaved: both see the same load
                if variant == "now" or name not in BASE_WRITES:
                    runs[variant].append(run_once(checkout, COMMANDS[name], scratch=name in SCRATCH))
        for variant, got in runs.items():
            if not got:
                continue
            results[name][variant] = {"wall": min(r[0] for r in got), "cpu": min(r[1] for r in got),
                                      "first wall": got[0][0], "rc": got[-1][2], "heavy": got[-1][3]}
    header = f"{'command':<17} {'wall s':>7} {'cpu s':>6}"
    if args.base:
        header += f" {'base wall':>9} {'base cpu':>8} {'cpu ratio':>9}"
    print(header + "  rc  heavy imports (now)" + ("  | base" if args.base else ""))
    for name, r in results.items():
        now = r["now"]
        line = f"{name:<17} {now['wall']:>7.2f} {now['cpu']:>6.2f}"
        base = r.get("base")
        if args.base and base:
            line += f" {base['wall']:>9.2f} {base['cpu']:>8.2f} {now['cpu'] / base['cpu']:>9.2f}"
        elif args.base:
            line += f" {'(writes)':>9} {'-':>8} {'-':>9}"
        line += f"  {now['rc']:>2}  {now['heavy'] or '-'}" + (f"  | {base['heavy'] if base else '-'}" if args.base else "")
        print(line)
    for name in SCRATCH & set(results):
        firsts = ", ".join(f"{v} {r['first wall']:.2f} s" for v, r in results[name].items())
        print(f"{name}: first run's wall {firsts} (each run in a scratch DAGSTER_HOME and FACTORY_HOME)")
    print(f"load average {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
