"""`sweeps.results` (factory/experiments/results.py): collecting a sweep's cells with their final
eval scores, ranking them, replacing the sweep's rows, the lineage row, reading the ranking back
and the PNG plots (factory/experiments/sweep_plot.py; a grid over a whole `model` and a field of
it: labelled by the fields that differ, one panel per value of the last param, a star at each
line's best). Runs on CPU in a few seconds: no model is trained — checkpoint and eval rows are
written with the project's own writers (the `run_rows` fixture) into a real embedded
lake (`lake` fixture: sqlite catalog under tmp_path), since collecting only reads those tables.
"""

from __future__ import annotations

import pytest

from configs.experiments.smoke import smoke
from factory.evals.results import eval_id_of
from factory.experiments.results import RESULTS_TABLE, collect, display_rows, plot, ranked, write_sweep_results
from factory.experiments.sweep import Dirichlet, SweepConfig, expand
from factory.experiments.sweep_plot import _plot_params
from factory.train.config import CheckpointConfig, ModelConfig

PNG = b"\x89PNG\r\n\x1a\n"
TABLES = ("refined.python_stdlib", "refined.site_packages", "refined.package_docs")


def base():
    return smoke().derive(steps=4, checkpoint=CheckpointConfig(every=4, keep_last=1), eval_every=4,
                          eval_suite="heldout")


def lr_sweep(name: str = "lrtest", **params) -> SweepConfig:
    return SweepConfig(name=name, base=base(), params=params or {"optimizer.lr": [1e-3, 2e-3, 3e-3]})


def mix_sweep() -> SweepConfig:
    return SweepConfig(name="mixtest", base=base(), search="random", samples=4, seed=1,
                       params={"mix_weights": Dirichlet(tables=TABLES)})


@pytest.fixture
def grid(lake, run_rows):
    """Cell 0 evaluated twice (a better score at step 2 that its final step 4 supersedes), cell 1
    evaluated once and best, cell 2 only trained."""
    sweep = lr_sweep()
    c0, c1, c2 = (c.run for c in expand(sweep))
    run_rows.checkpoint(lake, c0, 2, 4.0)
    run_rows.checkpoint(lake, c0, 4, 3.0)
    run_rows.checkpoint(lake, c1, 4, 2.5)
    run_rows.checkpoint(lake, c2, 4, 2.9)
    run_rows.evaluate(lake, c0, 2, {"all": 1.0, "refined.python_stdlib": 1.1})
    ids = [run_rows.evaluate(lake, c0, 4, {"all": 2.5, "refined.python_stdlib": 2.6}),
           run_rows.evaluate(lake, c1, 4, {"all": 2.1, "refined.python_stdlib": 2.2})]
    return sweep, (c0, c1, c2), ids


def test_collect_rows_one_per_cell_and_metric_at_the_final_step(lake, grid):
    sweep, (c0, c1, c2), _ = grid
    rows = collect(lake, sweep)
    assert sorted((r["cell"], r["metric"]) for r in rows) == [
        (0, "all"), (0, "refined.python_stdlib"), (1, "all"), (1, "refined.python_stdlib"), (2, None)]
    by = {(r["run"], r["metric"]): r for r in rows}
    assert by[c0, "all"]["step"] == 4 and by[c0, "all"]["value"] == 2.5  # step 2's 1.0 is not final
    assert by[c0, "all"]["train_loss"] == 3.0 and by[c0, "all"]["checkpoint_id"] == f"ckpt/{c0}@4"
    assert by[c2, None]["status"] == "trained" and by[c2, None]["train_loss"] == 2.9 and by[c2, None]["step"] == 4
    assert {r["status"] for r in rows if r["run"] != c2} == {"evaluated"}
    assert by[c1, "all"]["params_json"] == '{"optimizer.lr":0.002}'
    assert {r["rank"] for r in rows if r["run"] == c1} == {1} and all(r["ranked_by"] == "bpb/all" for r in rows)


def test_write_ranks_replaces_rows_and_records_lineage(lake, grid, run_rows):
    sweep, (c0, c1, c2), eval_ids = grid
    report = write_sweep_results(lake, sweep, run_id="r1")
    assert [(e["run"], e["value"], e["status"]) for e in report.ranking] == [
        (c1, 2.1, "evaluated"), (c0, 2.5, "evaluated"), (c2, None, "trained")]
    assert [e["rank"] for e in report.ranking] == [1, 2, 3]
    assert report.counts == {"evaluated": 2, "trained": 1, "pending": 0}
    assert report.best["run"] == c1 and report.best["params"] == {"optimizer.lr": 0.002}
    assert report.rows == 5
    lines = report.table.splitlines()
    assert lines[0].startswith("| rank | run | params | bpb/all | train loss")
    assert lines[2].startswith(f"| 1 | {c1} | optimizer.lr=0.002 | 2.1000 | 2.5000")
    assert lines[4].startswith(f"| — | {c2} | optimizer.lr=0.003 | — | 2.9000 | trained")  # unscored: listed, not ranked

    record = lake.lineage.resolve(f"sweep/lrtest@{report.snapshot_id}")[0]
    assert record.kind == "sweep_results" and record.run_id == "r1"
    assert set(eval_ids) <= set(record.upstream)
    assert {f"ckpt/{c0}@4", f"ckpt/{c1}@4", f"ckpt/{c2}@4"} <= set(record.upstream)
    assert eval_id_of(f"ckpt/{c0}@2", "heldout") not in record.upstream  # superseded by step 4

    other = write_sweep_results(lake, mix_sweep())  # another sweep's rows must survive a rewrite
    run_rows.evaluate(lake, c2, 4, {"all": 1.9, "refined.python_stdlib": 2.0})
    again = write_sweep_results(lake, sweep)
    assert again.snapshot_id not in (report.snapshot_id, other.snapshot_id)
    rows = lake.table(RESULTS_TABLE).scan().to_arrow().to_pylist()
    assert sum(r["sweep"] == "lrtest" for r in rows) == 6 and sum(r["sweep"] == "mixtest" for r in rows) == 4
    assert [e["run"] for e in again.ranking] == [c2, c1, c0] and again.counts["evaluated"] == 3

    back = ranked(lake, "lrtest")
    assert [(e["rank"], e["run"], e["value"]) for e in back] == [
        (e["rank"], e["run"], e["value"]) for e in again.ranking]
    assert ranked(lake, "nosuch") == []
    assert [e["status"] for e in ranked(lake, "mixtest")] == ["pending"] * 4


@pytest.mark.slow
def test_plot_one_param_two_params_and_mix_weights(lake, grid, tmp_path, run_rows):
    sweep, runs, _ = grid
    report = write_sweep_results(lake, sweep)
    one = plot(report, sweep, tmp_path / "plots" / "lr.png")
    assert one.read_bytes().startswith(PNG)

    two = lr_sweep("lrbatch", **{"optimizer.lr": [1e-3, 3e-3], "global_batch": [8, 16]})
    for i, cell in enumerate(expand(two)):  # evals without checkpoint rows: train_loss stays null
        run_rows.evaluate(lake, cell.run, 4, {"all": 2.0 + i / 10})
    rows = collect(lake, two)
    assert [r["status"] for r in rows] == ["evaluated"] * 4 and all(r["train_loss"] is None for r in rows)
    path = plot(rows, two, tmp_path / "grid.png")  # rows work as well as a report
    assert path.read_bytes().startswith(PNG)

    mix = mix_sweep()
    cells = expand(mix)
    assert all(set(c.params["mix_weights"]) == set(TABLES) for c in cells)
    for i, cell in enumerate(cells[:3]):  # the fourth stays pending
        run_rows.checkpoint(lake, cell.run, 4, 3.0)
        run_rows.evaluate(lake, cell.run, 4, {"all": 2.0 + i / 10})
    mixed = write_sweep_results(lake, mix)
    assert mixed.counts == {"evaluated": 3, "trained": 0, "pending": 1}
    assert "mix_weights={package_docs: " in mixed.table  # params_json sorts keys
    png = plot(mixed, mix, tmp_path / "mix.png")
    assert png.read_bytes().startswith(PNG) and png.stat().st_size < 200_000


def test_plot_with_nothing_evaluated(lake, tmp_path):
    sweep = lr_sweep()
    report = write_sweep_results(lake, sweep)
    assert report.best is None and report.counts["pending"] == 3
    assert plot(report, sweep, tmp_path / "empty.png").read_bytes().startswith(PNG)


def test_a_model_grid_reads_by_the_fields_that_differ_and_plots_a_panel_per_last_value(lake, run_rows, tmp_path):
    from matplotlib.figure import Figure

    widths = [ModelConfig(d_model=d, n_layers=1, n_heads=d // 32, max_seq_len=256) for d in (64, 128)]
    sweep = lr_sweep("widths", **{"optimizer.lr": [1e-3, 2e-3], "model": widths, "model.mup_base_width": [None, 64]})
    for i, cell in enumerate(expand(sweep)):
        run_rows.evaluate(lake, cell.run, 4, {"all": 3.0 - i / 10})
    report = write_sweep_results(lake, sweep)
    by_run = {row[1]: row[2] for row in display_rows(report.ranking)}
    cell = expand(sweep)[3]  # lr 1e-3, width 128, muP
    assert by_run[cell.run] == "model.d_model=128, model.n_heads=4, model.mup_base_width=64, optimizer.lr=0.001"
    fig = Figure()
    _plot_params(fig, sweep, [e for e in report.ranking])
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes] == ["model.mup_base_width=None", "model.mup_base_width=64"]
    assert [t.get_text() for t in axes[0].get_legend().get_texts()] == [
        "model.d_model=64, model.n_heads=2", "model.d_model=128, model.n_heads=4"]
    curves = [[line for line in ax.get_lines() if line.get_marker() == "o"] for ax in axes]  # "*": each optimum
    assert axes[0].get_xscale() == "log" and [len(c) for c in curves] == [2, 2]
    assert list(curves[1][1].get_ydata()) == pytest.approx([2.7, 2.3])  # width 128 muP: cells 3 and 7
    stars = [line for line in axes[1].get_lines() if line.get_marker() == "*"]
    assert [list(line.get_ydata()) for line in stars] == [pytest.approx([2.5]), pytest.approx([2.3])]
    assert plot(report, sweep, tmp_path / "widths.png").read_bytes().startswith(PNG)
