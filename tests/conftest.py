"""Shared fixtures. Everything here is real and local: a pyiceberg `SqlCatalog` on sqlite with a
`file://` warehouse under the test's own `tmp_path` — no servers, no network, runs on CPU.

Both catalogs: a module that sets `pytestmark = pytest.mark.usefixtures("catalog")` runs each test
twice, on the sqlite catalog (`[sql]`) and on an Iceberg REST catalog over S3 (`[rest]`, marked
`rest`): ONE SeaweedFS (`weed mini`, S3 + REST) on free loopback ports for the whole session,
started the first time a `[rest]` test runs (~2–7 s) and stopped by PID at the end. Each `[rest]`
test gets an empty lake — a fresh S3 Tables bucket as its warehouse (~5 ms) — and the profile in
`FACTORY_DEPLOY_JSON`, so the factory code and the processes it starts (the trainer, the CLI)
open that same lake. `lake`, `lake_at(home)` and `build_training_lake` honour the parameter;
`rest_profile` is the running server's profile (warehouse `s3://warehouse`) for tests that need
the server itself.

`corpus` builds refined-like tables (the `REFINED_DOCUMENTS` schema) from real standard-library
text — the modules of a few packages as code, top-level modules' docstrings as prose — and commits
them to a lake; the mix, tokenizer, Dagster mix-asset and `factory mix` CLI tests all use it.

`build_training_lake(home)` adds a 512-token BPE `default` and mix `default` (what
`configs.experiments.smoke()` asks for); `trained_checkpoints` trains a shortened smoke run on
such a lake once per session, for the export, inference, eval and eval-asset tests;
`rest_trained_checkpoints` trains the same run once per session on a REST warehouse, and
`trained_on_catalog` is either one (`[sql]` / `[rest]`) for the tests that exercise the lake. `run_rows`
writes checkpoint and eval rows with the project's own writers, without training (sweep results
and auto-mixer tests)."""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sysconfig
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from _pytest.nodeid import NodeId

from factory.lake import CommitStamp, Lake
from factory.lake.schemas import REFINED_DOCUMENTS
import suite_timing
from shared_servers import pytest_runtest_makereport, register, shared_servers_alive, unregister  # noqa: F401
from signal_guard import pytest_runtest_protocol  # noqa: F401  (a test's signal handlers end with it)

STDLIB = Path(sysconfig.get_paths()["stdlib"])


class Corpus:
    """Rows of real standard-library text shaped like a refined table, and a way to commit them.

    A row's `doc_id` is `sha256("<table>/<path>")[:24]` (path relative to the stdlib directory, or
    the module's file name for a docstring), so the same table and file always give the same id;
    `source` is the table name without its namespace (`refined.python_stdlib` -> `python_stdlib`)."""

    stamp = CommitStamp(asset_key="test", config_hash="")

    @staticmethod
    def row(table: str, path: str, text: str, kind: str) -> dict:
        return {"doc_id": hashlib.sha256(f"{table}/{path}".encode()).hexdigest()[:24], "source": table.split(".")[1],
                "path": path, "text": text, "language": "python" if kind == "code" else "text", "kind": kind,
                "bytes": len(text.encode()), "content_sha256": hashlib.sha256(text.encode()).hexdigest()}

    def code(self, table: str, packages: list[str]) -> list[dict]:
        """The non-empty `.py` files of the stdlib `packages` (recursively, each in path order) as code."""
        rows = []
        for package in packages:
            for path in sorted((STDLIB / package).rglob("*.py")):
                text = path.read_text(encoding="utf-8")
                if text.strip():
                    rows.append(self.row(table, str(path.relative_to(STDLIB)), text, "code"))
        return rows

    def docstrings(self, table: str, skip: int = 0, count: int = 40) -> list[dict]:
        """Module docstrings (prose) of top-level stdlib modules, in name order, at least 300 chars:
        `count` of them after the first `skip`."""
        rows = []
        for path in sorted(STDLIB.glob("*.py")):
            try:
                doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
            except (SyntaxError, UnicodeDecodeError):
                continue
            if doc and len(doc) >= 300:
                rows.append(self.row(table, path.name, doc, "prose"))
        return rows[skip:skip + count]

    def write(self, lake: Lake, table: str, rows: list[dict], chunks: int = 1) -> int:
        """Commit `rows` to `table` as `chunks` appends (several data files; no rows: one empty
        append) and return the last snapshot id."""
        step, snapshot = max(1, -(-len(rows) // chunks)), None
        for i in range(0, max(len(rows), 1), step):
            data = pa.Table.from_pylist(rows[i:i + step], schema=REFINED_DOCUMENTS.as_arrow())
            snapshot = lake.commit(table, data, self.stamp, schema=REFINED_DOCUMENTS).snapshot_id
        return snapshot


def pytest_configure(config):
    # The CLI's tables and messages wrap at the terminal's width (80 columns when stdout is a file),
    # and an xdist worker's tmp paths are longer: wide enough that no test depends on a path's length.
    os.environ["COLUMNS"] = "200"
    suite_timing.activate(config)  # where the time goes, when bench/suite_bench.py asks (FACTORY_SUITE_TIMING)


# -- tiers: every test belongs to exactly one (README "Tests": which command runs which) -------------
TIERS = ("check", "loopback", "spark", "rest", "slow", "gpu")
# Session fixtures too costly to build once per xdist worker: the tests that use one run on one worker.
ONE_PER_RUN = ("demo_home",)
READS = "-reads"  # the group of a ONE_PER_RUN fixture's tests marked demo_reads (see _demo_made_elsewhere)
# Each test file's seconds in a measured run (bench/suite_bench.py --durations): the longest groups go
# first, so that a lane's workers end together instead of one starting `make demo` last (longest
# processing time first; the lanes run with --no-loadscope-reorder, which keeps this order). A file
# it does not know counts 0 s; a stale figure only changes the order, never what runs.
DURATIONS = Path(__file__).with_name("durations.json")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: `-m check` must see the markers given here
def pytest_collection_modifyitems(config, items):
    """A test with no tier marker is in `check`, the fast hermetic tier; a test with two is an error
    (which command would run it?). Under pytest-xdist's `--dist loadgroup` a test file runs on one
    worker (its module fixtures are built once), and the tests of a fixture in ONE_PER_RUN run on
    one worker, whatever their file (one `make demo` per run). The groups come longest first
    (DURATIONS; the sort is stable: a group's tests keep their order)."""
    twice, groups = [], {}
    for item in items:
        tiers = {m.name for m in item.iter_markers() if m.name in TIERS}
        callspec = getattr(item, "callspec", None)
        if len(tiers) > 1 and callspec is not None:  # the [rest] case of a slow or spark test is slow or spark
            dropped = {m.name for m in callspec.marks if m.name in TIERS}
            item.own_markers[:] = [m for m in item.own_markers if m.name not in dropped]
        tiers = sorted({m.name for m in item.iter_markers() if m.name in TIERS})
        if getattr(config.option, "loadgroup", False):  # an xdist worker under `--dist loadgroup`
            home = next((f for f in ONE_PER_RUN if f in item.fixturenames), None)
            if home and item.get_closest_marker("demo_reads") and _demo_made_elsewhere():
                home += READS  # reads of a home no worker makes: a second worker runs them beside the rest
            groups[item] = home or item.nodeid.split("::")[0]
            _group(item, groups[item])
        if not tiers:
            item.add_marker(pytest.mark.check)
        elif len(tiers) > 1:
            twice.append(f"{item.nodeid}: {', '.join(tiers)}")
    if groups:
        _longest_first(items, groups)
    if twice:
        raise pytest.UsageError("a test belongs to exactly one tier of " + ", ".join(TIERS) + "; these carry several:\n  "
                                + "\n  ".join(twice))


def _demo_made_elsewhere() -> bool:
    """The demo home comes from the demo lane or a finished home (tests/integration/conftest.py):
    the demo_home fixture only waits for it, so two workers may use it without a second `make demo`."""
    return bool(os.environ.get("FACTORY_TEST_DEMO_RUN") or os.environ.get("FACTORY_TEST_DEMO_HOME"))


def _longest_first(items: list, groups: dict) -> None:
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    weight: dict[str, float] = {}
    for group, file in {(groups[item], item.nodeid.split("::")[0]) for item in items}:
        # the demo home's reads wait for the demo lane anyway: last, for the first worker to drain
        weight[group] = 0.0 if group.endswith(READS) else weight.get(group, 0.0) + seconds.get(file, 0.0)
    items.sort(key=lambda item: -weight[groups[item]])


def _group(item, name: str) -> None:
    """Put `item` in xdist group `name`: `--dist loadgroup` sends the tests whose node id ends in the
    same `@name` to one worker. (pytest-xdist 3.8 appends it from an `xdist_group` marker by setting
    `item._nodeid`, which pytest 9.2 no longer reads: its node ids live in `item._id`.)"""
    item._id = NodeId.parse(f"{item.nodeid}@{name}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """The `check` tier is hermetic: a test in it (or a fixture it sets up) that creates an inet socket
    fails with pytest-socket's SocketBlockedError; every other tier may. (`make check` also runs
    the tier in a network namespace of its own, so a subprocess cannot reach a server either.)"""
    from pytest_socket import disable_socket, enable_socket

    if item.get_closest_marker("check") is not None:
        disable_socket(allow_unix_socket=True)
    else:
        enable_socket()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item):
    """Sockets back on for teardown: the last test's teardown also stops the session's servers."""
    from pytest_socket import enable_socket

    enable_socket()


DEPLOY_VARIABLES = ("FACTORY_DEPLOY", "FACTORY_DEPLOY_JSON")


def _restore(before: dict[str, str | None]) -> None:
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def restore_deploy_environment():
    """Every test ends with the profile variables it started with. `factory --deploy X` hands its
    profile to the processes it starts by exporting them (settings.export), and monkeypatch's
    `delenv` of an unset variable records nothing to restore, so a CLI test would otherwise leak
    its profile into every test after it."""
    before = {name: os.environ.get(name) for name in DEPLOY_VARIABLES}
    yield
    _restore(before)


@pytest.fixture(autouse=True, scope="module")
def restore_deploy_environment_per_module():
    """The same for a module-scoped fixture that runs the CLI (set up before any test's own
    fixture takes its snapshot): the next module starts clean."""
    before = {name: os.environ.get(name) for name in DEPLOY_VARIABLES}
    yield
    _restore(before)


@pytest.fixture(scope="session")
def corpus() -> Corpus:
    """Builds and commits refined-like rows of standard-library text (see `Corpus`)."""
    return Corpus()


@dataclass
class SeaweedFS:
    """The session's SeaweedFS: its `Server` (stopped by PID) and the profile it serves."""

    server: object
    profile: object


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory):
    """One `weed mini` (S3 + Iceberg REST) on free 127.0.0.1 ports for the session."""
    from factory.deploy import seaweed
    from factory.deploy.servers import free_port

    root = tmp_path_factory.mktemp("seaweedfs")
    profile = seaweed.rest_profile(free_port(), free_port())
    server = seaweed.start_seaweedfs(root / "data", profile, root / "weed.log")
    register("seaweedfs", "the session's SeaweedFS (S3 + Iceberg REST)", server, marker="rest")
    try:
        yield SeaweedFS(server, profile)
    finally:
        unregister("seaweedfs")
        server.stop()


@pytest.fixture(scope="session")
def rest_profile(seaweedfs):
    """The running SeaweedFS's `DeployConfig` (the loopback profile on this session's ports)."""
    return seaweedfs.profile


class CatalogUnderTest:
    """One test's catalog: `kind` (sql | rest), its `profile`, `lake(home)` to open it, and
    `other()` for a second, independent lake (another REST warehouse; sql lakes differ by home)."""

    def __init__(self, kind: str, profile, rest=None):
        self.kind, self.profile, self._rest = kind, profile, rest

    def lake(self, home) -> Lake:
        from factory.deploy import open_lake

        return open_lake(self.profile, Path(home))

    def other(self) -> "CatalogUnderTest":
        return self if self._rest is None else CatalogUnderTest(self.kind, _fresh_warehouse(self._rest), self._rest)


def _fresh_warehouse(rest_profile):
    from factory.deploy.seaweed import create_warehouse

    return create_warehouse(rest_profile, f"t-{uuid.uuid4().hex[:16]}")


@pytest.fixture(params=["sql", pytest.param("rest", marks=pytest.mark.rest)])
def catalog(request, monkeypatch) -> CatalogUnderTest:
    """The catalog a test runs on (see the module docstring); its profile is handed down in
    `FACTORY_DEPLOY_JSON`."""
    from configs.deploy import embedded
    from factory.deploy import profile_env

    if request.param == "sql":
        chosen = CatalogUnderTest("sql", embedded())
    else:
        rest = request.getfixturevalue("rest_profile")
        chosen = CatalogUnderTest("rest", _fresh_warehouse(rest), rest)
    for name, value in profile_env(chosen.profile).items():
        monkeypatch.setenv(name, value)
    return chosen


def _test_catalog(request) -> CatalogUnderTest | None:
    return request.getfixturevalue("catalog") if "catalog" in request.fixturenames else None


@pytest.fixture
def lake_at(request):
    """`lake_at(home)` -> the lake of this test's catalog with its local state in `home`."""
    chosen = _test_catalog(request)
    return (lambda home: Lake.open(home=home)) if chosen is None else chosen.lake


def stored_files(table, under: str = "", suffix: str = ".parquet") -> set[str]:
    """The files (full URIs) that really exist below `table.location()/under`, listed on its own
    storage (local disk or S3) through pyarrow's file system with the table's FileIO properties —
    not through the catalog, so orphans count."""
    from pyarrow import fs as pafs
    from pyiceberg.io.pyarrow import PyArrowFileIO

    location = f"{table.location()}/{under}".rstrip("/")
    io = PyArrowFileIO(table.io.properties)
    scheme, netloc, path = io.parse_location(location)
    filesystem = io.fs_by_scheme(scheme, netloc)
    infos = filesystem.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    prefix = "file://" if scheme == "file" else f"{scheme}://"
    return {prefix + i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(suffix)}


@pytest.fixture(scope="session")
def list_stored_files():
    """`stored_files(table, under="", suffix=".parquet")` (see there)."""
    return stored_files


@pytest.fixture
def lake(tmp_path, lake_at):
    """An empty lake with `FACTORY_HOME` = `tmp_path` (its state lives in `tmp_path/lake`; put
    test inputs in another subdirectory): embedded sqlite, or the `catalog` the module opted into."""
    return lake_at(tmp_path)


# The packages are chosen so that every one of the smoke experiment's 8 logical loader shards holds
# training documents of every source (shards are drawn from document-id hashes; a source with an
# empty shard fails the loader with "has no training documents in logical shard ...").
CODE = {"refined.python_stdlib": ["json", "email", "xml"],  # 55 modules
        "refined.site_packages": ["urllib", "http", "logging", "importlib"]}  # 37 modules
DOCS = "refined.package_docs"  # 40 module docstrings


def _build_training_lake(home: Path, corpus: Corpus, *, tokenizer: bool = True, mix: bool = True,
                         heldout_fraction: float | None = None, profile=None) -> Lake:
    """The refined tables at `home`, then (optionally) the tokenizer, then (optionally) mix `default`
    v1 (with `heldout_fraction` instead of the spec's, when given). ~3 s on CPU. The lake is the
    `profile`'s, else the one a `catalog` test handed down in FACTORY_DEPLOY_JSON, else embedded."""
    from configs.mixes import mix_spec
    from factory import settings
    from factory.deploy import load_profile, open_lake
    from factory.mix import register_mix_version
    from factory.tokenize import TokenizerConfig, train_tokenizer

    if profile is None and settings.deploy_json():
        profile = load_profile()
    lake = Lake.open(home=home) if profile is None else open_lake(profile, home)
    for table, packages in CODE.items():
        corpus.write(lake, table, corpus.code(table, packages))
    corpus.write(lake, DOCS, corpus.docstrings(DOCS, count=40))
    if tokenizer:
        train_tokenizer(lake, TokenizerConfig(name="default", vocab_size=512, sources=[*CODE, DOCS],
                                              sample_bytes_per_source=200_000, measure_bytes_per_source=50_000))
    if tokenizer and mix:
        spec = mix_spec("default")
        if heldout_fraction is not None:
            spec = type(spec).model_validate({**spec.model_dump(), "heldout_fraction": heldout_fraction})
        register_mix_version(lake, spec)
    return lake


@pytest.fixture(scope="session")
def build_training_lake(corpus):
    """`build_training_lake(home, tokenizer=True, mix=True, heldout_fraction=None, profile=None)` ->
    Lake (on the test's `catalog` when the module opted in)."""
    return lambda home, **kw: _build_training_lake(Path(home), corpus, **kw)


class TrainedRun:
    """A shortened smoke run (8 steps, a checkpoint and an eval every 4) on a lake whose mix holds
    out 25 % of the documents, so every source has held-out text to score."""

    run = "evalsmoke"
    steps, every = 8, 4

    def __init__(self, lake: Lake, profile):
        self.lake, self.profile = lake, profile
        self.checkpoint_ids = [f"ckpt/{self.run}@{s}" for s in range(self.every, self.steps + 1, self.every)]

    @staticmethod
    def experiment():
        from configs.experiments import smoke
        from factory.train.config import CheckpointConfig

        return smoke().derive(name=TrainedRun.run, steps=TrainedRun.steps, eval_every=TrainedRun.every,
                              eval_suite="quick", checkpoint=CheckpointConfig(every=TrainedRun.every, keep_last=5),
                              tracker={"backends": ["iceberg"]})


class RunRows:
    """`train.checkpoints` and `evals.results` rows of runs that were never trained, written with
    `record_checkpoint` and `write_results` (checkpoint files do not exist; nothing opens them)."""

    @staticmethod
    def checkpoint(lake: Lake, run: str, step: int, loss: float) -> str:
        import datetime as dt

        from factory.train.checkpoint import CheckpointRef, record_checkpoint

        ref = CheckpointRef(run=run, step=step, path=Path(f"/nonexistent/{run}/step-{step:08d}.pt"), sha256="0" * 64,
                            bytes=1, tokens=step * 4096, loss=loss, created_at=dt.datetime.now(dt.timezone.utc))
        record_checkpoint(lake, ref, experiment=run, mix_version="mix/default@v1", config_hash="test", eval_every=4,
                          upstream=[])
        return ref.checkpoint_id

    @staticmethod
    def evaluate(lake: Lake, run: str, step: int, scores: dict[str, float], suite: str = "heldout") -> str:
        """bpb scores (`metric -> value`) of `ckpt/<run>@<step>`; the eval id."""
        import datetime as dt

        from factory.evals.results import eval_id_of, write_results

        ckpt = f"ckpt/{run}@{step}"
        eval_id = eval_id_of(ckpt, suite)
        now = dt.datetime.now(dt.timezone.utc)
        rows = [{"eval_id": eval_id, "checkpoint_id": ckpt, "export_id": f"export/{run}@{step}", "run": run,
                 "step": step, "tokens": step * 4096, "suite": suite, "task": "bpb", "metric": metric, "value": value,
                 "n": 10, "stderr": None if metric == "all" else 0.01, "engine": "transformers", "config_hash": "test",
                 "created_at": now} for metric, value in scores.items()]
        write_results(lake, eval_id=eval_id, rows=rows, samples=[], upstream=[ckpt], config={}, config_hash="test")
        return eval_id


@pytest.fixture
def run_rows() -> type[RunRows]:
    return RunRows


def _train_session_run(home: Path, build_training_lake, profile) -> TrainedRun:
    import torch

    from factory.experiments import plan_experiment
    from factory.train.trainer import train

    lake = build_training_lake(home, heldout_fraction=0.25, profile=profile)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(plan_experiment(lake, TrainedRun.experiment()), lake, run=TrainedRun.run)
    finally:
        torch.set_num_threads(threads)
    return TrainedRun(lake, profile)


@pytest.fixture(scope="session")
def trained_checkpoints(tmp_path_factory, build_training_lake) -> TrainedRun:
    """Train `TrainedRun` once per session (~10 s on CPU, one thread) on the sqlite catalog,
    whichever test first asks (session-scoped: it never follows a `[rest]` test's catalog)."""
    from configs.deploy import embedded

    return _train_session_run(tmp_path_factory.mktemp("trained") / "home", build_training_lake, embedded())


@pytest.fixture(scope="session")
def rest_trained_checkpoints(tmp_path_factory, build_training_lake, rest_profile) -> TrainedRun:
    """The same run, trained once per session on its own warehouse bucket of the session's
    SeaweedFS (~10 s): every table on S3, checkpoint files under its home."""
    return _train_session_run(tmp_path_factory.mktemp("trained-rest") / "home", build_training_lake,
                              _fresh_warehouse(rest_profile))


@pytest.fixture(params=["sql", pytest.param("rest", marks=pytest.mark.rest)])
def trained_on_catalog(request, monkeypatch) -> TrainedRun:
    """`trained_checkpoints` (`[sql]`) or `rest_trained_checkpoints` (`[rest]`), its profile handed
    down in `FACTORY_DEPLOY_JSON` (so `factory ...` in process and child processes open that lake):
    for the tests that exercise the lake (export and eval lineage, `evals.results`, `find_export`)."""
    from factory.deploy import profile_env

    trained = request.getfixturevalue("trained_checkpoints" if request.param == "sql" else "rest_trained_checkpoints")
    for name, value in profile_env(trained.profile).items():
        monkeypatch.setenv(name, value)
    return trained


# -- long-running servers a test starts (factory serve, dagster dev, ...), stopped by PID ---------------
CHECKOUT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port() -> int:
    """A TCP port free on loopback right now."""
    return _free_port()


@pytest.fixture
def free_ports():
    """`free_ports()`: another TCP port free on loopback, for a test that needs several."""
    return _free_port


def _default_signals():
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture
def server(tmp_path):
    """`server(name, argv, env, whole_group=False) -> Popen`: a long-running process in its own
    session with default signal handlers, output in `tmp_path/<name>.log`; stopped at teardown with
    SIGTERM (to its process group when `whole_group`), then SIGKILL to the group after 30 s."""
    started: list[tuple[subprocess.Popen, bool, object]] = []

    def start(name: str, argv: list[str], env: dict, whole_group: bool = False) -> subprocess.Popen:
        log = open(tmp_path / f"{name}.log", "w")
        proc = subprocess.Popen(argv, cwd=CHECKOUT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_default_signals)
        started.append((proc, whole_group, log))
        return proc

    yield start
    for proc, whole_group, log in started:
        with contextlib.suppress(ProcessLookupError):  # a test may have stopped it already
            (os.killpg if whole_group else os.kill)(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def wait_until_up(probe, proc: subprocess.Popen, log: Path, timeout: float, what: str, errors=(Exception,)):
    """`probe()`'s value once it stops raising `errors` (the server answers); fails with the log's tail
    if `proc` exits first or `timeout` s pass."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return probe()
        except errors:
            tail = log.read_text()[-3000:]
            assert proc.poll() is None, f"{what} exited {proc.returncode}:\n{tail}"
            assert time.monotonic() < deadline, f"{what} did not answer in {timeout:.0f} s:\n{tail}"
            time.sleep(1)


@pytest.fixture
def wait_up():
    """`wait_up(probe, proc, log, timeout, what, errors=(Exception,))`: see `wait_until_up`."""
    return wait_until_up
