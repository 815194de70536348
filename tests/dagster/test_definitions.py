"""The Dagster layer loads cleanly and the core stays framework-free. CPU, no servers."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_definitions_load_with_an_empty_environment():
    code = (
        "import definitions\n"
        "r = definitions.defs.get_repository_def()\n"
        "print(sorted(j.name for j in r.get_all_jobs() if not j.name.startswith('__')))\n"
        "print(sorted('/'.join(k.path) for k in r.asset_graph.get_all_asset_keys()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    jobs, assets = out.stdout.strip().splitlines()[-2:]
    assert "ingest_job" in jobs and "demo_job" in jobs and "eval_job" in jobs
    assert "checkpoint_export" in assets and "eval_scores" in assets
    for source in ("python_stdlib", "site_packages", "package_docs"):
        assert f"raw/{source}" in assets


def test_factory_never_imports_dagster_statically():
    offenders = []
    for path in (ROOT / "factory").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0].startswith("dagster")]
    assert offenders == []


def test_factory_never_imports_dagster_at_runtime():
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in (ROOT / "factory").rglob("*.py")
        if p.name != "__main__.py"
    )
    modules = [m.removesuffix(".__init__") for m in modules]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m.startswith('dagster')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
