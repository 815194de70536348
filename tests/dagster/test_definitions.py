"""The Dagster layer loads cleanly, its asset graph is one chain, and the core stays framework-free.

The graph test reads `definitions.defs` as the webserver and the daemon get it (the asset node
snapshots, with their partition mappings): raw -> ... -> mix -> training_run -> checkpoint_export
-> eval_scores -> sweeps/results and automix, every edge across different partition sets mapped
by `AllPartitionMapping` (the inferred Identity mapping would pair unrelated keys). CPU, no servers.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import AllPartitionMapping, AssetKey
from dagster._core.remote_representation.external_data import asset_node_snaps_from_repo

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
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


@pytest.mark.slow
def test_factory_never_imports_dagster_at_runtime():
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in (ROOT / "factory").rglob("*.py")
        if p.name != "__main__.py" and "inside" not in p.parts  # factory/envs/inside: programs the sandbox runs
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


def test_the_asset_graph_chains_training_exports_scores_and_sweeps():
    import definitions

    graph = definitions.defs.resolve_asset_graph()

    def parents(key: str) -> set[str]:
        return {k.to_user_string() for k in graph.get(AssetKey.from_user_string(key)).parent_keys}

    def children(key: str) -> set[str]:
        return {k.to_user_string() for k in graph.get(AssetKey.from_user_string(key)).child_keys}

    assert parents("training_run") == {"mix"}
    assert parents("checkpoint_export") == {"training_run"}
    assert children("training_run") == {"checkpoint_export"}
    assert parents("eval_scores") == {"checkpoint_export"}
    assert children("eval_scores") == {"sweeps/results", "automix"}
    assert parents("automix") == {"sweeps/results", "eval_scores"}
    # one connected chain: every asset from raw to automix is upstream of automix
    upstream = {k.to_user_string() for k in graph.upstream_key_iterator(AssetKey("automix"))}
    assert {"raw/python_stdlib", "tokenizer", "mix", "training_run", "checkpoint_export", "eval_scores"} <= upstream

    # what the webserver and the daemon receive: the mapping is sent (a custom one would not be)
    edges = {(snap.asset_key.to_user_string(), e.parent_asset_key.to_user_string()): e.partition_mapping
             for snap in asset_node_snaps_from_repo(definitions.defs.get_repository_def()) for e in snap.parent_edges}
    for child, parent in [("training_run", "mix"), ("checkpoint_export", "training_run"),
                          ("sweeps/results", "eval_scores"), ("automix", "eval_scores")]:
        assert isinstance(edges[(child, parent)], AllPartitionMapping), (child, parent, edges[(child, parent)])
