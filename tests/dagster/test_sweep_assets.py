"""The `sweeps/results` and `automix` assets through Dagster (`assets/sweeps.py`).

Each test writes its sweep as a file in a tmp sweeps directory, handed to the assets with
`ExperimentsResource(sweeps_dir=...)`, and materializes in process with `materialize([...])` and
the real `LakeResource(home=tmp_path)`. No model is trained: the cells' checkpoint and eval rows are
written with the project's own writers (the `run_rows` fixture of tests/conftest.py), since both
assets only read those tables.

- `sweeps/results` partition `smoke_lr` (a 3-cell learning-rate grid, two cells evaluated): the
  ranking (a table) names the best run first, the plot is an inline PNG, the counts and the best run are
  right, and `sweeps.results` holds one row per (cell, metric);
- `automix` on 8 Dirichlet proxies whose loss is a known quadratic of the weights: it registers
  `mix/<name>@v1` with weights summing to 1, whose lineage row reaches every proxy's checkpoint and
  eval; a sweep that does not sample mix_weights fails the step naming why, and registers nothing.

Runs on CPU, no servers, no network; about 25 seconds, most of it the automix test's lake
(`build_training_lake`, ~3 s) and its 8 proxies' checkpoint and eval commits.
"""

from __future__ import annotations

import base64
import math
import textwrap
from pathlib import Path

import pytest
import numpy as np
from dagster import AssetKey, DagsterInstance, materialize
from pyiceberg.expressions import EqualTo

from assets.sweeps import automix, sweep_results
from factory.experiments.registry import get_sweep
from factory.experiments.results import RESULTS_TABLE
from factory.experiments.sweep import expand
from factory.home import artifacts_dir
from factory.mix import mix_versions
from resources import ExperimentsResource, LakeResource

PNG = b"\x89PNG\r\n\x1a\n"
SMOKE_LR = '''
from configs.experiments.smoke import smoke
from factory.experiments.sweep import SweepConfig


def smoke_lr() -> SweepConfig:
    return SweepConfig(name="smoke_lr", base=smoke().derive(steps=4, eval_suite="heldout"),
                       params={"optimizer.lr": [1e-3, 2e-3, 3e-3]})
'''
AUTOMIX = '''
from configs.experiments.smoke import smoke
from configs.mixes import mix_spec
from factory.experiments.sweep import Dirichlet, SweepConfig


def automix() -> SweepConfig:
    return SweepConfig(name="automix", base=smoke().derive(steps=4, mix="default", eval_suite="heldout"),
                       search="random", samples=8, seed=0,
                       params={"mix_weights": Dirichlet(tables=tuple(mix_spec("default").weights), alpha=1.0)})
'''
OPTIMUM = np.array([0.5, 0.3, 0.2])  # the proxies' true loss is lowest here, inside the simplex
CURVATURE = np.array([[0.4, 0.1, 0.0], [0.1, 0.3, 0.0], [0.0, 0.0, 0.6]])  # positive definite


def true_loss(w: np.ndarray) -> float:
    d = w - OPTIMUM
    return float(1.5 + d @ CURVATURE @ d)


# -- fixtures written with the project's own writers ----------------------------------------------
def sweeps_dir(root: Path, **files: str) -> Path:
    """A sweeps directory holding `<name>.py` for each keyword."""
    root.mkdir(parents=True)
    for name, source in files.items():
        (root / f"{name}.py").write_text(textwrap.dedent(source))
    return root


# -- running the assets ---------------------------------------------------------------------------
def resources(home: Path, sweeps: Path) -> dict:
    return {"lake": LakeResource(home=str(home)), "experiments": ExperimentsResource(sweeps_dir=str(sweeps))}


def run_automix(home: Path, sweeps: Path, sweep: str, name: str, raise_on_error: bool = True):
    return materialize([automix], resources=resources(home, sweeps), instance=DagsterInstance.ephemeral(),
                       run_config={"ops": {"automix": {"config": {"sweep": sweep, "name": name}}}},
                       raise_on_error=raise_on_error)


def metadata(result, key: list[str]) -> dict:
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == AssetKey(key)]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def failure(result) -> str:
    """The error of the failed step, with its causes."""
    [event] = result.get_step_failure_events()
    return event.step_failure_data.error.to_string()


# -- sweeps/results -------------------------------------------------------------------------------
def test_sweep_results_ranks_plots_and_writes_the_partitions_sweep(lake, tmp_path, run_rows):
    sweeps = sweeps_dir(tmp_path / "sweeps", smoke_lr=SMOKE_LR)
    c0, c1, c2 = (c.run for c in expand(get_sweep("smoke_lr", sweeps)))
    run_rows.checkpoint(lake, c0, 4, 3.0)
    run_rows.checkpoint(lake, c1, 4, 2.5)
    run_rows.evaluate(lake, c0, 4, {"all": 2.5, "refined.python_stdlib": 2.6})
    best_eval = run_rows.evaluate(lake, c1, 4, {"all": 2.1, "refined.python_stdlib": 2.2})  # c2: pending

    result = materialize([sweep_results], partition_key="smoke_lr", resources=resources(tmp_path, sweeps),
                         instance=DagsterInstance.ephemeral())
    assert result.success
    meta = metadata(result, ["sweeps", "results"])
    ranking = meta["ranking"]  # a table: the UI shows it inline whatever the number of cells
    assert [c.name for c in ranking.schema.columns] == ["rank", "run", "params", "bpb/all", "train loss", "status"]
    assert [list(r.data.values()) for r in ranking.records] == [
        ["1", c1, "optimizer.lr=0.002", "2.1000", "2.5000", "evaluated"],
        ["2", c0, "optimizer.lr=0.001", "2.5000", "3.0000", "evaluated"],
        ["—", c2, "optimizer.lr=0.003", "—", "—", "pending"]]  # unscored: unranked
    assert (meta["best_run"], meta["best_value"], meta["metric"]) == (c1, 2.1, "bpb/all")
    assert (meta["cells"], meta["cells_evaluated"], meta["cells_trained"], meta["cells_pending"]) == (3, 2, 0, 1)

    prefix = "![smoke_lr](data:image/png;base64,"
    assert meta["plot"].startswith(prefix) and meta["plot"].endswith(")")
    png = base64.b64decode(meta["plot"][len(prefix):-1])
    assert png.startswith(PNG)
    assert Path(meta["plot_path"]) == artifacts_dir(tmp_path) / "sweeps" / "smoke_lr" / "summary.png"
    assert Path(meta["plot_path"]).read_bytes() == png

    rows = lake.table(RESULTS_TABLE).scan(row_filter=EqualTo("sweep", "smoke_lr")).to_arrow().to_pylist()
    assert sorted((r["run"], r["metric"], r["value"], r["rank"]) for r in rows) == sorted([
        (c0, "all", 2.5, 2), (c0, "refined.python_stdlib", 2.6, 2),
        (c1, "all", 2.1, 1), (c1, "refined.python_stdlib", 2.2, 1), (c2, None, None, 3)])
    assert meta["snapshot_id"] == str(lake.table(RESULTS_TABLE).current_snapshot().snapshot_id)
    record = lake.lineage.resolve(f"sweep/smoke_lr@{meta['snapshot_id']}")[0]
    assert record.partition == "smoke_lr" and record.run_id == result.run_id
    assert best_eval in record.upstream and f"ckpt/{c1}@4" in record.upstream


# -- automix --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_automix_registers_a_mix_version_whose_lineage_reaches_every_proxy(build_training_lake, tmp_path, run_rows):
    home = tmp_path / "home"
    lake = build_training_lake(home)
    sweeps = sweeps_dir(tmp_path / "sweeps", automix=AUTOMIX)
    sweep = get_sweep("automix", sweeps)
    tables = sweep.params["mix_weights"].tables
    proxy_ids = set()
    for cell in expand(sweep):
        w = np.array([cell.params["mix_weights"][t] for t in tables])
        proxy_ids |= {run_rows.checkpoint(lake, cell.run, 4, 3.0),
                      run_rows.evaluate(lake, cell.run, 4, {"all": true_loss(w), tables[0]: true_loss(w) + 0.1})}
    assert len(proxy_ids) == 16

    result = run_automix(home, sweeps, "automix", "automix_test")
    assert result.success
    meta = metadata(result, ["automix"])
    assert meta["mix_version"] == "mix/automix_test@v1"
    assert meta["proxies"] == 8
    assert list(meta["weights"]) == list(tables)
    assert math.isclose(sum(meta["weights"].values()), 1.0, abs_tol=1e-9)  # 4 decimals: shown unrounded
    assert all(w > 0 for w in meta["weights"].values())
    assert "8 proxies" in meta["proposal"]
    assert meta["fit_features"] in ("linear", "log", "quadratic") and meta["fit_ridge"] > 0
    assert "predicted_loss" in meta["raw_values"]  # a regression's prediction has more than 4 digits
    for key in ("predicted_loss", "uniform_predicted_loss", "loo_rmse"):  # shown rounded, kept exact
        assert meta[key] == float(f"{meta['raw_values'].get(key, meta[key]):.4g}")
    proposed = np.array([meta["weights"][t] for t in tables])
    assert true_loss(proposed) < true_loss(np.full(len(tables), 1 / len(tables))), meta["weights"]

    [row] = [r for r in lake.lineage.records() if r.version_id == "mix/automix_test@v1"]
    assert row.asset_key == "automix" and row.run_id == result.run_id
    assert proxy_ids <= set(row.upstream)
    assert [v.version_id for v in mix_versions(lake, "automix_test")] == ["mix/automix_test@v1"]


def test_automix_on_a_sweep_without_mix_weights_fails_naming_why(lake, tmp_path):
    sweeps = sweeps_dir(tmp_path / "sweeps", smoke_lr=SMOKE_LR)
    result = run_automix(tmp_path, sweeps, "smoke_lr", "automix_test", raise_on_error=False)
    assert not result.success
    error = failure(result)
    assert "sweep smoke_lr does not sample mix_weights" in error, error
    assert mix_versions(lake, "automix_test") == []
    assert not lake.has_table(RESULTS_TABLE)  # refused before writing anything
