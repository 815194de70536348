"""Every bench side that runs in an environment of its own works from its documented install.

For each `bench/requirements-*.txt` (found by glob, so a new bench's file is covered without editing
this test) a scratch venv is made under the test's tmp directory — `python -m venv`, then
`pip install -r` the file, exactly what the bench's docstring tells a new user — once per file and
shared by the tests here; pip's own cache makes a rerun download nothing. The bench that uses the
file declares, in its top-level `OWN_ENVIRONMENTS`, the functions that run there; every import
statement they hold, and the bench module's own top-level ones (the module is the script there),
is executed in that venv, and a failure names the requirements file, the statement and the error
(`No module named 'regex'`). Imports alone miss what a library loads only when it runs (datatrove
loads spaCy, xxhash and orjson inside its stages), so refine_bench's datatrove side also runs, both
settings, on a tiny corpus with a planted exact and near copy.

Slow tier: runs on CPU and needs the package index pip is configured with (PyPI); about 2 minutes
on 2 busy cores with a warm pip cache, ~70 s of it the install."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench"
REQUIREMENTS = sorted(BENCH.glob("requirements-*.txt"))
DECLARATION = "OWN_ENVIRONMENTS"

# Runs in the scratch venv: each statement on its own, so one report names every missing module.
PROBE = """
import json, sys
failed = {}
for statement in json.loads(sys.argv[1]):
    try:
        exec(statement, {})
    except Exception as error:
        failed[statement] = f"{type(error).__name__}: {error}"
print(json.dumps({"prefix": sys.prefix, "failed": failed}))
"""


def declared_sides() -> dict[str, tuple[Path, tuple[str, ...]]]:
    """Requirements file name -> (the bench declaring it, the functions it runs there), read with
    `ast` from each bench's top-level `OWN_ENVIRONMENTS = {...}` (importing a bench is not free)."""
    sides = {}
    for bench in sorted(BENCH.glob("*.py")):
        for node in ast.parse(bench.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == DECLARATION for t in node.targets):
                for name, functions in ast.literal_eval(node.value).items():
                    sides[name] = (bench, tuple(functions))
    return sides


def side_imports(bench: Path, functions: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The import statements that run in the environment: the module's top-level ones and those
    anywhere inside `functions`, as source text."""
    tree = ast.parse(bench.read_text())
    defs = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    undefined = sorted(set(functions) - defs.keys())
    assert not undefined, f"bench/{bench.name}: {DECLARATION} names {undefined}, which it does not define"
    is_import = lambda node: (isinstance(node, ast.Import)  # noqa: E731
                              or isinstance(node, ast.ImportFrom) and node.module != "__future__")
    top = [ast.unparse(node) for node in tree.body if is_import(node)]
    inner = [ast.unparse(node) for name in functions for node in ast.walk(defs[name]) if is_import(node)]
    return top, inner


@pytest.fixture(scope="module")
def venvs(tmp_path_factory):
    """`venv(requirements)`: the python of a fresh venv with that file installed, made once."""
    made: dict[Path, Path | str] = {}

    def venv(requirements: Path) -> Path:
        if requirements not in made:
            root = tmp_path_factory.mktemp(requirements.stem)
            subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
            python = root / "bin" / "python"
            done = subprocess.run([str(python), "-m", "pip", "install", "-r", str(requirements)],
                                  capture_output=True, text=True, timeout=600)
            made[requirements] = python if done.returncode == 0 else done.stdout[-1500:] + done.stderr[-1500:]
        python = made[requirements]
        assert isinstance(python, Path), f"pip install -r bench/{requirements.name} failed:\n{python}"
        return python

    return venv


def test_every_declared_environment_has_its_requirements_file():
    names = {path.name for path in REQUIREMENTS}
    assert {name: bench.name for name, (bench, _) in declared_sides().items() if name not in names} == {}


@pytest.mark.parametrize("requirements", REQUIREMENTS, ids=lambda path: path.name)
def test_requirements_install_every_import_of_their_bench_side(requirements, venvs):
    sides = declared_sides()
    assert requirements.name in sides, (
        f"bench/{requirements.name}: no bench declares the code it runs in this environment "
        f"(a top-level {DECLARATION} = {{{requirements.name!r}: (function, ...)}} in bench/<name>.py)")
    bench, functions = sides[requirements.name]
    top, inner = side_imports(bench, functions)
    assert inner, f"bench/{bench.name}: {functions} import nothing, so this test would prove nothing"
    python = venvs(requirements)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(python), "-I", "-c", PROBE, json.dumps(top + inner)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert Path(report["prefix"]) == python.parent.parent  # the scratch venv, not the project's
    failed = "\n".join(f"  {statement}\n    -> {error}" for statement, error in report["failed"].items())
    assert not failed, f"bench/{requirements.name} does not install what bench/{bench.name} imports there:\n{failed}"


def load_refine_bench():
    spec = importlib.util.spec_from_file_location("refine_bench", BENCH / "refine_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_corpus(out: Path) -> None:
    """12 documents of 300 seeded random words, an exact copy of `base` and a one-word-changed one,
    as two Parquet files (one per datatrove task), shaped like the bench's corpus."""
    rng = random.Random(0)
    vocabulary = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9))) for _ in range(400)]
    texts = {f"doc{i:02d}": " ".join(rng.choices(vocabulary, k=300)) for i in range(12)}
    texts["base"] = " ".join(rng.choices(vocabulary, k=300))
    texts["exact"] = texts["base"]
    texts["near"] = texts["base"].replace(texts["base"].split()[150], "changed", 1)
    rows = [{"doc_id": doc_id, "text": text} for doc_id, text in sorted(texts.items())]
    out.mkdir()
    for shard in range(2):
        pq.write_table(pa.Table.from_pylist(rows[shard::2]), out / f"{shard:05d}.parquet")


@pytest.mark.timeout(600)  # a hung pool (tests/signal_guard.py says how it happened once) fails here, not at 1,800 s
@pytest.mark.parametrize("setting", ["default", "matched"])
def test_refine_bench_datatrove_side_runs_from_its_requirements(setting, venvs, tmp_path, monkeypatch):
    """The bench's own `run_datatrove` (its worker in the scratch venv, then the read-back)."""
    bench = load_refine_bench()
    monkeypatch.setattr(bench, "BENCH_PYTHON", venvs(BENCH / "requirements-datatrove.txt"))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    tiny_corpus(tmp_path / "corpus")
    result = bench.run_datatrove(tmp_path / "corpus", tmp_path / setting, setting)
    assert list(result["stages"]) == ["signatures", "buckets", "cluster", "filter"]
    assert result["dropped"] == 2  # of base, exact and near, one cluster: two dropped
    assert result["linked"]("base", "exact") and result["linked"]("base", "near")
    assert not result["linked"]("doc00", "doc01")
