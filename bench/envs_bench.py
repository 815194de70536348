"""Environment builds on the shipped corpus: builds per hour, success rate, outcomes by failure
class and phase, against the bare cost of the same test suites.

Method. `factory.envs.build.build_repos` builds a repository set (default: `configs/envs/corpus.py`'s
`corpus()`, 51 pinned PyPI sdists) as `factory envs build` does: fetch, resolve to wheels, build in
the sandbox, run the suite in the sandbox and rerun its failures twice; one repository at a time
unless `--parallel N`. Builds per hour is repositories / the builds' wall time. The wheelhouse is
cold in a fresh `--home` (every wheel downloaded) and warm when `--home` is reused (the header says
which); `--rebuild` builds the set again in the same home and counts identical environment digests.

Baseline, measured in the same run: each repository that got an environment has its test suite run
again, bare: the same interpreter (the base Python the sandbox uses), the same installed packages
(the environment's site-packages on PYTHONPATH under `python -S`: no global site-packages, and
its .pth finders skipped, since they name /repo), the
same test command and options, on a throwaway copy of the sources, in a plain subprocess. No
sandbox, no resolve, no build, no reruns. That is the floor of "run this repository's tests"; the
ratio builder / bare says what the builder costs beyond it, and sandboxed test phase / bare what
the sandbox and reruns cost. The brief proposed the host venv's own pytest: it lacks each
repository's dependencies, so most suites would not collect and the floor would be wrong.
Baseline runs are unsandboxed and run as the caller (root here: the base interpreter lives under
/root, which uid 65534 cannot enter), with HOME and TMPDIR in a scratch dir; a suite that behaves
differently as root (findpython's unreadable-file test) differs from its sandboxed run.

    .venv/bin/python bench/envs_bench.py                           # the corpus, from PyPI
    .venv/bin/python bench/envs_bench.py --repos demo --registry file:///…/simple
    .venv/bin/python bench/envs_bench.py --only six,pastel --home /tmp/h --json out.json

Not part of the tests: the corpus needs the network; ~4 minutes of builds on 2 cores, plus the bare runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")
UNITTEST_RAN = re.compile(r"Ran (\d+) tests?")
UNITTEST_BAD = re.compile(r"(failures|errors)=(\d+)")


def load_set(name: str, only: str | None):
    from configs.envs import repo_set
    from factory.envs.sources import RepoSet

    chosen = repo_set(name)
    if not only:
        return chosen
    wanted = [n.strip() for n in only.split(",") if n.strip()]
    unknown = sorted(set(wanted) - {r.name for r in chosen.repos})
    if unknown:
        sys.exit(f"--only: not in repository set {name!r}: {unknown}")
    return RepoSet(name=chosen.name, repos=tuple(r for r in chosen.repos if r.name in wanted))


def expected(name: str):
    from configs.envs.corpus import entry

    try:
        return entry(name)
    except ValueError:
        return None


# -- the builds ---------------------------------------------------------------------------------------
def run_builds(repo_set, home: Path, registry, commit: bool, log, bare_timeout: float | None,
               parallel: int = 1) -> dict:
    """Build the set and time it; with bare_timeout, each repository's bare baseline run too.

    One at a time (parallel 1), each repository is its own `build_repos` call and its bare run follows
    at once, so a pair sees the same machine load and no bare run overlaps a build (build_repos' worker
    thread would go on to the next repository while a progress callback runs). With parallel > 1, one
    call builds the set and the bare runs follow it. Wall, not CPU: bubblewrap's rusage leaves out the
    sandboxed program's, so CPU would undercount. Returns records, build wall, bare runs by repo."""
    from factory.envs.build import build_repos
    from factory.envs.sources import RepoSet

    lake = None
    if commit:
        from factory.lake import Lake

        lake = Lake.open(home=home)
    bares: dict[str, dict] = {}
    total, done, wall, bare_wall = len(repo_set.repos), 0, 0.0, 0.0

    def bare(r, line: str) -> dict:
        nonlocal bare_wall
        started, row = time.perf_counter(), row_of(r)
        if bare_timeout is not None and (b := bare_run(r, home, bare_timeout)) is not None:
            bares[r.repo] = row["bare"] = b
            line += f"   bare {b['seconds']:5.1f}s rc={b['rc']} {b['passed']}p/{b['failed']}f"
        bare_wall += time.perf_counter() - started
        print(line, flush=True)
        log.write(json.dumps(row) + "\n")
        log.flush()

    def progress(_done, _total, r):
        nonlocal done
        done += 1
        line = (f"[{done:>2}/{total}] {r.repo:<20} {r.failure_class.value:<22} resolve {r.resolve_s:6.1f}s "
                f"build {r.build_s:6.1f}s test {r.test_s:6.1f}s  {r.tests_passed}p/{r.tests_failed}f/{len(r.flaky)}fl")
        if parallel > 1:
            print(line, flush=True)
        else:
            pending.append(line)

    records, pending = [], []
    batches = [repo_set] if parallel > 1 else [RepoSet(name=repo_set.name, repos=(s,)) for s in repo_set.repos]
    for batch in batches:
        started = time.perf_counter()
        got = build_repos(batch, lake=lake, home=home, registry=registry, progress=progress, parallel=parallel)
        wall += time.perf_counter() - started
        records += got
        if parallel == 1:
            bare(got[0], pending.pop())
    if parallel > 1:
        for r in records:
            bare(r, f"       {r.repo:<20}")
    return {"records": records, "wall": wall, "bares": bares, "bare_wall": bare_wall, "parallel": parallel}


def row_of(r) -> dict:
    e = expected(r.repo)
    return {"repo": r.repo, "revision": r.revision, "class": r.failure_class.value,
            "expect": e.expect.value if e else None, "rule": r.rule, "detail": r.failure_detail,
            "resolve": r.resolve_outcome, "build": r.build_outcome, "test": r.test_outcome,
            "resolve_s": round(r.resolve_s, 2), "build_s": round(r.build_s, 2), "test_s": round(r.test_s, 2),
            "passed": r.tests_passed, "failed": r.tests_failed, "flaky": len(r.flaky),
            "collection_errors": r.collection_errors, "env_digest": r.env_digest}


# -- the baseline -------------------------------------------------------------------------------------
def bare_run(record, home: Path, timeout_s: float) -> dict | None:
    """The suite of `record`'s environment run directly (see the module docstring); None without one."""
    from factory.envs.build import envs_dir
    from factory.envs.environment import Environment, Runner

    if not record.env_digest:
        return None
    env = Environment.load(envs_dir(home) / record.env_digest)
    purelib = env.venv_dir / "lib" / f"python{env.python}" / "site-packages"
    scratch = Path(tempfile.mkdtemp(prefix="envs-bench-bare-"))
    try:
        repo, tmp = scratch / "repo", scratch / "tmp"
        shutil.copytree(env.src_dir, repo, symlinks=True)
        tmp.mkdir()
        for directory, _, files in os.walk(scratch):
            os.chmod(directory, 0o777)
            for f in files:
                if not os.path.islink(p := os.path.join(directory, f)):
                    os.chmod(p, 0o777 if os.stat(p).st_mode & 0o111 else 0o666)
        roots = [str(repo / "src")] if (repo / "src").is_dir() else []
        variables = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp), "TMPDIR": str(tmp), "LANG": "C.UTF-8",
                     "PYTHONPATH": os.pathsep.join([*roots, str(repo), str(purelib)]), "PYTHONDONTWRITEBYTECODE": "1"}
        python = getattr(sys, "_base_executable", sys.executable)
        if env.runner is Runner.UNITTEST:
            argv = [python, "-S", "-m", "unittest", "discover", *env.test_options, *env.test_args]
        else:
            argv = [python, "-S", "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(repo),
                    *env.test_options, *env.test_args]
        started = time.perf_counter()
        try:
            done = subprocess.run(argv, cwd=repo, env=variables, capture_output=True, text=True, timeout=timeout_s)
            out, rc = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            out, rc = str(exc.stdout or "") + str(exc.stderr or ""), "timeout"
        seconds = time.perf_counter() - started
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    passed, failed = counts(out, env.runner is Runner.UNITTEST)
    return {"seconds": seconds, "rc": rc, "passed": passed, "failed": failed}


def counts(output: str, unittest: bool) -> tuple[int, int]:
    """Passed and failed (+ errors) from the runner's own summary: unittest's, or pytest's last line
    that has counts (with -qq, which an addopts -q makes of ours, pytest prints none: 0/0)."""
    if unittest:
        ran = sum(int(n) for n in UNITTEST_RAN.findall(output))
        bad = sum(int(n) for _, n in UNITTEST_BAD.findall(output))
        return ran - bad, bad
    found: Counter = Counter()
    for line in reversed(output.strip().splitlines()):
        if " in " in line and (hits := PYTEST_COUNTS.findall(re.sub(r"\d+ subtests? \w+", "", line))):
            for n, word in hits:
                found["error" if word.startswith("error") else word] += int(n)
            break
    return found["passed"], found["failed"] + found["error"]


# -- the report ---------------------------------------------------------------------------------------
def table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(c) for c in row] for row in rows]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def report(run: dict, header: str) -> str:
    records, bares, wall = run["records"], run["bares"], run["wall"]
    n = len(records)
    ok = [r for r in records if r.failure_class.value == "passed"]
    with_env = [r for r in records if r.env_digest]
    out = [header, "",
           f"builds: {n} in {wall:.0f} s = **{n / wall * 3600:.0f} builds/hour** ({run.get('parallel', 1)} at a time); "
           f"success rate **{len(ok)}/{n} = {len(ok) / max(n, 1):.0%}** (suite ran to its end); "
           f"environments built: {len(with_env)}/{n}", ""]
    by_class = defaultdict(list)
    for r in records:
        by_class[r.failure_class.value].append(r)
    rows = []
    for cls, rs in sorted(by_class.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        mean = lambda key: statistics.fmean(getattr(r, key) for r in rs)  # noqa: E731
        rows.append([cls, len(rs), f"{len(rs) / n:.0%}", f"{mean('resolve_s'):.1f}", f"{mean('build_s'):.1f}",
                     f"{mean('test_s'):.1f}", ", ".join(sorted(r.repo for r in rs))])
    out += ["By failure class (mean phase seconds):", "",
            table(["class", "builds", "share", "resolve s", "build s", "test s", "repositories"], rows), ""]
    rows = []
    for phase in ("resolve", "build", "test"):
        ran = [getattr(r, f"{phase}_s") for r in records if getattr(r, f"{phase}_outcome") != "skipped"]
        failed = sum(getattr(r, f"{phase}_outcome") == "failed" for r in records)
        if ran:
            rows.append([phase, len(ran), failed, f"{sum(ran):.0f}", f"{statistics.median(ran):.1f}",
                         f"{max(ran):.1f}", f"{sum(ran) / wall:.0%}"])
    out += ["By phase:", "", table(["phase", "ran", "failed", "total s", "median s", "max s", "share of wall"], rows), ""]
    timed_out = sorted(r for r, b in bares.items() if b["rc"] == "timeout")
    paired = [(r, bares[r.repo]) for r in with_env if bares.get(r.repo) and r.repo not in timed_out]
    if paired:
        builder_s = sum(r.resolve_s + r.build_s + r.test_s for r, _ in paired)
        test_s = sum(r.test_s for r, _ in paired)
        floor = sum(b["seconds"] for _, b in paired)
        out += [f"Baseline: bare test runs (same interpreter, packages and test command; no sandbox, resolve, build "
                f"or reruns), each right after its build, on the {len(paired)} repositories with an environment:", "",
                table(["", "builder (resolve+build+test)", "sandboxed test phase (with reruns)", "bare tests",
                       "builder / bare", "test phase / bare"],
                      [["wall s", f"{builder_s:.0f}", f"{test_s:.0f}", f"{floor:.0f}", f"**{builder_s / floor:.1f}x**",
                        f"**{test_s / floor:.1f}x**"]]),
                "", f"(The bare runs took {run['bare_wall']:.0f} s more, left out of the set's wall and builds/hour. "
                f"Left out of the ratio, the bare run hit its timeout: {', '.join(timed_out) or 'none'}.)", ""]
        differ = [f"{r.repo} ({r.tests_passed}p/{r.tests_failed}f vs {b['passed']}p/{b['failed']}f)" for r, b in paired
                  if (r.tests_passed, r.tests_failed) != (b["passed"], b["failed"])]
        out += [f"Sandboxed and bare counts differ for {len(differ)}: {', '.join(differ) or 'none'}", ""]
    rows = []
    for r in records:
        e, b = expected(r.repo), bares.get(r.repo)
        match = "" if e is None else ("yes" if e.expect.value == r.failure_class.value else f"no ({e.expect.value})")
        bare = "" if not b else f"{b['passed']}p/{b['failed']}f {b['seconds']:.1f}s"
        rows.append([r.repo, r.revision, r.failure_class.value, match, r.rule,
                     f"{r.tests_passed}/{r.tests_failed}/{len(r.flaky)}", f"{r.resolve_s:.1f}", f"{r.build_s:.1f}",
                     f"{r.test_s:.1f}", bare, r.failure_detail.replace("\n", " ").replace("|", "/")[:140]])
    if any(expected(r.repo) for r in records):
        agree = sum(1 for r in records if (e := expected(r.repo)) and e.expect.value == r.failure_class.value)
        out += [f"As expected (configs/envs/corpus.py `expect`): {agree}/{n}", ""]
    out += ["Per repository (tests passed/failed/flaky; bare = baseline passed/failed and seconds):", "",
            table(["repo", "version", "class", "as expected", "rule", "p/f/flaky", "resolve s", "build s", "test s",
                   "bare", "detail"], rows)]
    return "\n".join(out)


def rebuilt(first, again, wall: float) -> str:
    """The second pass: warm-wheelhouse throughput, and whether each environment came out the same."""
    before = {r.repo: r for r in first}
    built = [r for r in again if r.env_digest and before[r.repo].env_digest]
    same = [r.repo for r in built if r.env_digest == before[r.repo].env_digest]
    changed = sorted(r.repo for r in again if r.failure_class != before[r.repo].failure_class)
    return (f"Rebuild in the same home (warm wheelhouse): {len(again)} builds in {wall:.0f} s = "
            f"**{len(again) / wall * 3600:.0f} builds/hour**; same environment digest: **{len(same)}/{len(built)}**"
            + (f" (differ: {sorted(set(r.repo for r in built) - set(same))})" if len(same) < len(built) else "")
            + f"; class changed: {changed or 'none'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repos", default="corpus", help="repository set in configs/envs (default: corpus)")
    ap.add_argument("--only", help="comma-separated repository names of the set to build")
    ap.add_argument("--registry", default="https://pypi.org/simple",
                    help="simple index URL, or 'pip' for pip's configured index (default: PyPI)")
    ap.add_argument("--home", help="FACTORY_HOME to build in (reused: warm wheelhouse; default: a fresh temp dir)")
    ap.add_argument("--commit", action="store_true", help="also commit envs.builds/envs.tests to the home's lake")
    ap.add_argument("--no-baseline", action="store_true", help="skip the bare test runs")
    ap.add_argument("--bare-timeout", type=float, default=300.0, help="seconds per bare test run")
    ap.add_argument("--parallel", type=int, default=1, help="repositories built at once (build_repos' parallel)")
    ap.add_argument("--rebuild", action="store_true",
                    help="build the set a second time in the same home (warm wheelhouse): builds/hour and same digests")
    ap.add_argument("--json", help="write per-repository rows (JSON lines, as they finish) here")
    ap.add_argument("--markdown", help="also write the report here")
    args = ap.parse_args()

    from factory.envs.build import wheelhouse_dir
    from factory.envs.registry import RegistryConfig

    repo_set = load_set(args.repos, args.only)
    home = Path(args.home) if args.home else Path(tempfile.mkdtemp(prefix="envs-bench-"))
    home.mkdir(parents=True, exist_ok=True)
    registry = RegistryConfig(index_url=None if args.registry == "pip" else args.registry)
    wheels_before = len(list(wheelhouse_dir(home).glob("*.whl"))) if wheelhouse_dir(home).is_dir() else 0
    header = (f"# envs bench: set {repo_set.name!r}, {len(repo_set.repos)} repositories, index {args.registry}, "
              f"home {home}, wheelhouse {'warm (%d wheels)' % wheels_before if wheels_before else 'cold'}, "
              f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(header, flush=True)
    log_path = Path(args.json) if args.json else home / "envs_bench.jsonl"
    with log_path.open("w") as log:
        run = run_builds(repo_set, home, registry, args.commit, log, None if args.no_baseline else args.bare_timeout,
                         args.parallel)
    text = report(run, header)
    if args.rebuild:
        with (log_path.parent / (log_path.name + ".rebuild")).open("w") as log:
            again = run_builds(repo_set, home, registry, False, log, None, args.parallel)
        text += "\n\n" + rebuilt(run["records"], again["records"], again["wall"])
    print("\n" + text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")


if __name__ == "__main__":
    main()
