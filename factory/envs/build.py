"""Building repository environments: resolve on the host, build and test in the sandbox.

`build_repos(repo_set, ...)` builds every repository of a set, one `BuildRecord` each (a failure is
a record, never an exception), and commits them (store.py). Per repository (`build_repo`):

1. fetch (sources.py) and plan (a `Builder`; the heuristic one reads the rule table);
2. *resolve* (host, network allowed, no repository or package code runs): the plan's requirements
   + test requirements + build-system requires + pytest, resolved to wheels only into the shared
   wheelhouse `$FACTORY_HOME/wheelhouse/`, and the lock;
3. *build* (sandbox, no network): `python -m venv --without-pip /env` with the base interpreter,
   the locked wheels installed with `--no-index --no-deps --require-hashes` from /wheels (read-only),
   then the project: `pip install -e /repo --no-deps --no-index --no-build-isolation`, or, when the
   backend cannot build editables, a .pth naming /repo/src or /repo (rule install.pth). No .pyc
   files (--no-compile, PYTHONDONTWRITEBYTECODE) and no pip cache: the trees are reproducible;
4. digest the staged venv + sources + lock and move them to `$FACTORY_HOME/envs/<digest>/` (a
   digest already there is that same environment: the staging copy is dropped);
5. *test* (sandbox, via `testrun.run_tests`): the whole suite, then the failed tests by id, twice;
   a test that passes on a rerun is `flaky`. outcomes.py says what counts as success.

Why the venv is built inside the sandbox at /env: its shebangs, pyvenv.cfg and editable finders
name /env and /repo, the paths every later run mounts it at, on any host.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from factory.envs.builder import Builder, HeuristicBuilder
from factory.envs.detect import BuildPlan
from factory.envs.digest import environment_digest
from factory.envs.environment import REPO_PATH, VENV_PATH, CaseOutcome, Environment
from factory.envs.outcomes import BuildRecord, FailureClass, classify_run
from factory.envs.registry import Lock, RegistryConfig, ResolutionError, has_only_sdists, resolve
from factory.envs.sources import FetchedSource, RepoSet, RepoSource, SourceError, fetch_source
from factory.envs.testrun import open_to_sandbox
from factory.home import factory_home
from factory.sandbox import Mount, Sandbox, SandboxConfig, SandboxUnavailable
from factory.version import canonical_json

BUILD_LIMITS = SandboxConfig(timeout_s=300, cpu_s=300, memory_mb=4096, max_file_mb=256, tmp_mb=512, tmp_files=65536,
                             max_processes=64, max_output_bytes=16384, workers=1)
MAX_ATTEMPTS = 3  # plans a builder may try per repository (the heuristic one stops after its first)
RERUNS = 2  # reruns of the failed tests, by id
RERUN_MAX = 200  # more failures than this: no reruns (a broken environment, not flakiness)
PIP = ["-m", "pip", "--python", f"{VENV_PATH}/bin/python", "install", "--no-cache-dir", "--no-compile",
       "--disable-pip-version-check", "--no-input"]

# The sandbox program of the build phase. It prints one JSON line per step and never raises:
# the host reads which step failed and its output from those lines.
_BUILD_PROGRAM = """
import json, os, subprocess, sys
PIP = {pip!r}
INSTALL = {install!r}
# pip's words when the backend cannot build an editable (the .pth fallback applies); any other
# failure of the editable install is the project's build error
EDITABLE_UNSUPPORTED = ("missing the 'build_editable' hook", "cannot be installed in editable mode",
                        "does not support PEP 660", "supports PEP 660")

def step(name, argv):
    done = subprocess.run(argv, capture_output=True, text=True)
    print(json.dumps({{"step": name, "rc": done.returncode, "tail": (done.stdout + done.stderr)[-2500:]}}), flush=True)
    return done

if step("venv", [sys._base_executable, "-m", "venv", "--without-pip", "/env"]).returncode:
    sys.exit(1)
if step("wheels", [sys.executable, *PIP, "--no-index", "--no-deps", "--require-hashes", "-r", "/wheels/.lock/requirements.txt"]).returncode:
    sys.exit(1)
mode = INSTALL
if mode == "editable":
    done = step("editable", [sys.executable, *PIP, "--no-index", "--no-deps", "--no-build-isolation", "-e", "/repo"])
    if done.returncode == 0:
        sys.exit(0)
    text = done.stdout + done.stderr
    if not any(words in text for words in EDITABLE_UNSUPPORTED):
        sys.exit(1)
    mode = "pth"
purelib = subprocess.run(["/env/bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True).stdout.strip()
root = "/repo/src" if os.path.isdir("/repo/src") else "/repo"
with open(os.path.join(purelib, "_factory_repo.pth"), "w") as f:
    f.write(root + "\\n")
print(json.dumps({{"step": "pth", "rc": 0, "tail": root}}), flush=True)
"""


def envs_dir(home: Path) -> Path:
    return home / "envs"


def wheelhouse_dir(home: Path) -> Path:
    return home / "wheelhouse"


def build_repos(repo_set: RepoSet, *, lake=None, home: str | Path | None = None, registry: RegistryConfig | None = None,
                sandbox: Sandbox | None = None, limits: SandboxConfig | None = None, builder: Builder | None = None,
                progress: Callable[[int, int, BuildRecord], None] | None = None, parallel: int = 1,
                run_id: str = "") -> list[BuildRecord]:
    """Build every repository of `repo_set` (see the module docstring); commits to `lake` when given.

    `sandbox` runs the test phase (default: `testrun.test_sandbox_config(workers=parallel)`), `limits`
    the build phase (default BUILD_LIMITS). `parallel` repositories build at once (threads: each
    waits on pip or a sandbox; the wheelhouse and the environment store take concurrent writers).
    `progress(done, total, record)` is called as each repository finishes. Records keep the set's order.
    `run_id` (a Dagster run's) is stamped on the commits and lineage rows.
    """
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from factory.envs.testrun import test_sandbox_config

    root = factory_home(home)
    registry = registry or RegistryConfig()
    builder = builder or HeuristicBuilder()
    build_box = Sandbox((limits or BUILD_LIMITS).model_copy(update={"workers": parallel}))
    test_box = sandbox or Sandbox(test_sandbox_config(workers=parallel))

    def one(source: RepoSource) -> BuildRecord:
        return build_repo(source, repo_set=repo_set.name, home=root, registry=registry, build_sandbox=build_box,
                          test_sandbox=test_box, builder=builder)

    records: list[BuildRecord | None] = [None] * len(repo_set.repos)
    with ThreadPoolExecutor(max(parallel, 1), thread_name_prefix="envs-build") as pool:
        futures = {pool.submit(one, source): i for i, source in enumerate(repo_set.repos)}
        for done, future in enumerate(as_completed(futures), 1):
            records[futures[future]] = record = future.result()
            if progress is not None:
                progress(done, len(records), record)
    built = [r for r in records if r is not None]
    if lake is not None:
        from factory.envs.store import write_builds

        write_builds(lake, built, repo_set=repo_set.name, run_id=run_id)
    return built


def build_repo(source: RepoSource, *, repo_set: str, home: Path, registry: RegistryConfig, build_sandbox: Sandbox,
               test_sandbox: Sandbox, builder: Builder, max_attempts: int = MAX_ATTEMPTS) -> BuildRecord:
    """One repository's build, start to record; never raises for the repository's own faults.

    The source is fetched once (kept pristine for the builder to read); each attempt builds a copy.
    After a failed attempt the builder may `revise` its plan (builder.py); the last attempt's record
    is returned, its `attempt` saying how many there were.
    """
    build_id = uuid.uuid4().hex
    staging = envs_dir(home) / ".staging" / build_id
    staging.mkdir(parents=True)
    base = dict(build_id=build_id, repo=source.name, repo_set=repo_set, builder=builder.name)
    try:
        try:
            fetched = fetch_source(source, staging / "pristine", registry)
        except (SourceError, OSError) as exc:
            return _record(base, revision="", origin=source.name, failure_class=FailureClass.RESOLUTION_FAILED,
                           failure_detail=f"fetch failed: {exc}"[:2000], rule="source.fetch", resolve_outcome="failed")
        base.update(revision=fetched.revision, origin=fetched.origin)
        plan = builder.plan(fetched)
        for attempt in range(1, max_attempts + 1):
            work = staging / f"attempt-{attempt}"
            work.mkdir()
            shutil.copytree(fetched.src_dir, work / "src", symlinks=True)
            copy = fetched.model_copy(update={"src_dir": str(work / "src")})
            record = _phases(copy, plan, {**base, "attempt": attempt}, work, home, registry, build_sandbox, test_sandbox)
            if record.failure_class is FailureClass.PASSED or attempt == max_attempts:
                return record
            plan = builder.revise(fetched, plan, record)
            if plan is None:
                return record
        raise AssertionError("unreachable: the last attempt returns")
    except SandboxUnavailable:
        raise  # the machine's fault, not the repository's: every other build would fail the same way
    except Exception as exc:  # a builder bug must not stop the set; the record keeps the traceback
        import traceback

        detail = "".join(traceback.format_exception(exc))[-2000:]
        return _record({"revision": "", "origin": source.name, **base}, failure_class=FailureClass.BUILD_ERROR,
                       rule="builder.internal", failure_detail=f"builder error: {detail}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _record(base: dict, **fields) -> BuildRecord:
    """A record from the fields gathered so far, `fields` winning (a failing phase names its own rule)."""
    return BuildRecord(**{**base, **fields})


def _phases(fetched: FetchedSource, plan: BuildPlan, base: dict, staging: Path, home: Path, registry: RegistryConfig,
            build_sandbox: Sandbox, test_sandbox: Sandbox) -> BuildRecord:
    base.update(rule=plan.rule, rules_json=canonical_json(plan.rules))
    if plan.backend is None:
        return _record(base, failure_class=FailureClass.NO_BUILD_SYSTEM, rule="backend.none",
                           failure_detail="no pyproject.toml [build-system], setup.py or setup.cfg [metadata]")
    started = time.monotonic()
    lock, failure = _resolve_phase(plan, registry, wheelhouse_dir(home))
    base.update(resolve_s=time.monotonic() - started)
    if lock is None:
        return _record(base, resolve_outcome="failed", **failure)
    base.update(resolve_outcome="ok", lock_hash=lock.hash)
    started = time.monotonic()
    failure = _build_phase(plan, lock, fetched, staging, home, build_sandbox)
    base.update(build_s=time.monotonic() - started)
    if "install" in failure:  # built; the install rule that worked (the .pth fallback or the editable install)
        plan = plan.model_copy(update={"rules": {**plan.rules, "install": failure.pop("install")}})
        base.update(rules_json=canonical_json(plan.rules))
    if failure:
        return _record(base, build_outcome="failed", **failure)
    env = _store_environment(fetched, plan, lock, staging, home)
    base.update(build_outcome="ok", env_digest=env.digest, env_uri=Path(env.root).as_uri())
    started = time.monotonic()
    fields = _test_phase(env, plan, test_sandbox)
    return _record(base, test_s=time.monotonic() - started, **fields)


def _resolve_phase(plan: BuildPlan, registry: RegistryConfig, wheelhouse: Path) -> tuple[Lock | None, dict]:
    if plan.python_requires:
        try:
            ok = SpecifierSet(plan.python_requires).contains(f"{registry.python}.0", prereleases=True)
        except InvalidSpecifier:
            ok = True  # an unreadable specifier does not block: pip checks wheels' own Requires-Python
        if not ok:
            return None, dict(failure_class=FailureClass.RESOLUTION_FAILED, rule=plan.rules.get("python", ""),
                              failure_detail=f"requires python {plan.python_requires}; the sandbox has {registry.python}")
    wanted = [*plan.build_requires, *plan.requirements, *plan.test_requirements]
    try:
        return resolve(wanted, registry, wheelhouse, constraints=list(plan.constraints)), {}
    except OSError as exc:  # the index or a wheel could not be read
        return None, dict(failure_class=FailureClass.RESOLUTION_FAILED, rule=plan.rules.get("deps", ""),
                          failure_detail=f"index unreachable: {exc}"[:2000])
    except ResolutionError as exc:
        sdist_only = [m for m in exc.missing if has_only_sdists(registry, m)]
        names = sdist_only or list(exc.missing)
        rule = _rule_of(plan, names[0]) if names else plan.rules.get("deps", "")
        if sdist_only:
            return None, dict(failure_class=FailureClass.NO_WHEEL, rule=rule,
                              failure_detail=f"no wheel on the index for {', '.join(sdist_only)} (sdist only)")
        return None, dict(failure_class=FailureClass.RESOLUTION_FAILED, rule=rule, failure_detail=str(exc)[:2000])


def _rule_of(plan: BuildPlan, requirement: str) -> str:
    name = requirement.split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip().lower()
    for reqs, part in ((plan.requirements, "deps"), (plan.test_requirements, "testdeps"), (plan.build_requires, "backend")):
        if any(r.lower().replace("_", "-").startswith(name.replace("_", "-")) for r in reqs):
            return plan.rules.get(part, "")
    return plan.rules.get("deps", "")


def _build_phase(plan: BuildPlan, lock: Lock, fetched: FetchedSource, staging: Path, home: Path,
                 sandbox: Sandbox) -> dict:
    venv, src = staging / "venv", Path(fetched.src_dir)
    venv.mkdir()
    wheels = wheelhouse_dir(home)
    lock_name = uuid.uuid4().hex
    lock_dir = wheels / ".lock" / lock_name  # the requirements file travels inside the read-only /wheels mount
    lock_dir.mkdir(parents=True)
    try:
        (lock_dir / "requirements.txt").write_text(lock.requirements_text())
        open_to_sandbox(staging)
        open_to_sandbox(wheels / ".lock")
        program = _BUILD_PROGRAM.format(pip=PIP, install=plan.install).replace(
            "/wheels/.lock/requirements.txt", f"/wheels/.lock/{lock_name}/requirements.txt")
        mounts = (Mount(host=str(venv), path=VENV_PATH, writable=True), Mount(host=str(src), path=REPO_PATH, writable=True),
                  Mount(host=str(wheels), path="/wheels"))
        result = sandbox.run(program, mounts=mounts, env={"PIP_CONFIG_FILE": "/dev/null"}, cwd=REPO_PATH)
    finally:
        shutil.rmtree(lock_dir, ignore_errors=True)
    steps = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"step"')]
    failed = next((s for s in steps if s["rc"] != 0), None)
    if result.outcome.value == "passed":
        return {"install": "install.pth" if any(s["step"] == "pth" for s in steps) else "install.editable"}
    if result.outcome.value in ("timeout", "oom", "crashed"):
        cls = FailureClass.TIMEOUT if result.outcome.value == "timeout" else FailureClass.SANDBOX_LIMIT
        return dict(failure_class=cls, rule=plan.rules.get("install", ""),
                    failure_detail=f"build {result.outcome.value} ({result.reason}): {result.stderr[-1000:]}")
    where = failed["step"] if failed else "sandbox"
    rule = plan.rules.get("backend", "") if where in ("editable", "pth") else plan.rules.get("install", "")
    tail = failed["tail"] if failed else result.stderr[-1500:]
    return dict(failure_class=FailureClass.BUILD_ERROR, rule=rule, failure_detail=f"step {where} failed: {tail}"[-2000:])


def _store_environment(fetched: FetchedSource, plan: BuildPlan, lock: Lock, staging: Path, home: Path) -> Environment:
    lock_bytes = lock.to_bytes()
    digest = environment_digest(staging / "venv", Path(fetched.src_dir), lock_bytes)
    final = envs_dir(home) / digest
    if not final.exists():
        built = staging / "built"
        built.mkdir()
        (staging / "venv").rename(built / "venv")
        Path(fetched.src_dir).rename(built / "src")
        (built / "lock.json").write_bytes(lock_bytes)
        for directory in (built, built / "venv", built / "src"):
            os.chmod(directory, 0o755)
        try:
            built.rename(final)
        except OSError:  # another builder stored the same digest first: same content
            if not final.exists():
                raise
    env = Environment(repo=fetched.source.name, revision=fetched.revision, digest=digest, root=str(final),
                      python=lock.python, lock_hash=lock.hash, runner=plan.runner or "pytest",
                      test_args=plan.test_args, test_options=plan.test_options, rule=f"{plan.rules.get('backend', '')}+{plan.rules.get('runner', '')}")
    env.save()
    return env


def _test_phase(env: Environment, plan: BuildPlan, sandbox: Sandbox) -> dict:
    from factory.envs.testrun import run_tests

    runner_rule = plan.rules.get("runner", "runner.none")
    if plan.runner is None:
        return dict(failure_class=FailureClass.TEST_COLLECTION_ERROR, rule="runner.none", test_outcome="failed",
                    failure_detail="no tests found (no tests/ or test/ directory, no test_*.py, no pytest config)")
    report = run_tests(env, sandbox)
    cases = {c.test_id: c for c in report.cases}
    flaky: list[str] = []
    failing = [c.test_id for c in report.cases if c.outcome in (CaseOutcome.FAILED, CaseOutcome.ERROR)]
    if report.completed and 0 < len(failing) <= RERUN_MAX:
        for _ in range(RERUNS):
            rerun = run_tests(env, sandbox, test_ids=failing)
            recovered = [i for i in failing if rerun.completed and rerun.outcome_of(i) is CaseOutcome.PASSED]
            flaky += recovered
            failing = [i for i in failing if i not in recovered]
            if not failing:
                break
    cls, detail = classify_run(report, tuple(c for i, c in cases.items() if i not in flaky), runner_rule)
    return dict(failure_class=cls, failure_detail=detail, rule=runner_rule if cls is not FailureClass.PASSED else plan.rule,
                test_outcome="ok" if report.completed else "failed", tests=tuple(cases.values()), flaky=tuple(flaky),
                collection_errors=len(report.collection_errors))
