"""Core code does not import the `configs` package: entry points (the CLI, `*/commands.py`,
`python -m` mains, the `make demo` runner in factory/demo/) resolve names to configs and hand them in. Checked statically (every import,
also inside functions, and `import_module("configs...")`), so a lazy import cannot hide; and
`factory sweep run`'s core (`factory.experiments.local.run_sweep`) takes its eval suites from
the caller and says so before training anything when they are missing. Unit tier, no lake."""

import ast
from pathlib import Path

import pytest

from factory.experiments.local import run_sweep
from factory.experiments.spec import ExperimentError
from factory.experiments.sweep import SweepConfig

ROOT = Path(__file__).resolve().parents[2]
# Modules that still read `configs` themselves, and why; shrink this list, never grow it.
STILL_IMPORTING = {
    "factory/experiments/spec.py": "eval_suites() validates an experiment's suite name against configs/evals.py",
    "factory/deploy/profiles.py": "deployment profiles are looked up by name in configs/deploy.py",
    "factory/deploy/seaweed.py": "the loopback profile's defaults",
}


def _imports_configs(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "configs" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "configs":
            return True
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
                and node.args and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).split(".")[0] == "configs"):
            return True
    return False


def _entry_point(rel: str) -> bool:
    """The CLI, each area's commands, `python -m` mains and the `make demo` runner: applications
    over the core, which pick configs by name for the user."""
    name = rel.rsplit("/", 1)[-1]
    return rel == "factory/cli.py" or name in ("commands.py", "__main__.py") or rel.startswith("factory/demo/")


def test_core_modules_do_not_import_configs():
    offenders = sorted(rel for path in (ROOT / "factory").rglob("*.py")
                       if not _entry_point(rel := str(path.relative_to(ROOT))) and _imports_configs(path))
    assert "factory/experiments/local.py" not in offenders
    assert set(offenders) <= set(STILL_IMPORTING), f"core modules importing configs: {offenders}"


def test_the_import_check_sees_a_lazy_import(tmp_path):
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def f():\n    from configs.evals import suite\n    return suite\n")
    dynamic = tmp_path / "dynamic.py"
    dynamic.write_text("import importlib\nm = importlib.import_module('configs.deploy')\n")
    clean = tmp_path / "clean.py"
    clean.write_text("from factory.evals import SuiteConfig\nfrom .configs import x\n")
    assert [_imports_configs(p) for p in (lazy, dynamic, clean)] == [True, True, False]


def test_a_sweep_that_evaluates_needs_its_suites_before_any_cell_trains():
    from configs.experiments import smoke

    sweep = SweepConfig(name="grid", base=smoke(), params={"optimizer.lr": [1e-3, 3e-3]})
    # lake=None: the check comes before the lake (or a trainer) is touched
    with pytest.raises(ExperimentError, match=r"sweep grid: evaluating the cells needs `suites`"):
        run_sweep(None, sweep, log=lambda m: None)
