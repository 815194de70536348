"""Sweep configs and their cells, and the discovery of experiment and sweep files. Pure CPU, no
lake: grid order and run names, seeded random and Dirichlet draws (rounded weights summing to
1), budget and field-path errors, fresh discovery (edits seen at once, errors per file), and a
whole sub-config as a value (the muP sweep's widths, with a deeper path set on each)."""

import pytest

from configs.experiments.smoke import smoke
from configs.sweeps.mup_lr import mup_lr
from factory.experiments import ExperimentError
from factory.experiments.registry import discover_experiments, discover_sweeps, get_experiment
from factory.experiments.sweep import (
    Dirichlet,
    LogUniform,
    SweepBudget,
    SweepConfig,
    check_token_budget,
    expand,
    round_weights,
    run_name,
)

TABLES = ("refined.python_stdlib", "refined.site_packages", "refined.package_docs")


def grid(**kw) -> SweepConfig:
    return SweepConfig(name="g", base=smoke().derive(steps=4),
                       params={"optimizer.lr": [1e-3, 3e-3], "global_batch": [8, 16]}, **kw)


def test_grid_cells_are_the_product_in_order_with_hash_run_names():
    cells = expand(grid())
    assert [c.params for c in cells] == [{"optimizer.lr": 1e-3, "global_batch": 8}, {"optimizer.lr": 1e-3, "global_batch": 16},
                                         {"optimizer.lr": 3e-3, "global_batch": 8}, {"optimizer.lr": 3e-3, "global_batch": 16}]
    assert [c.experiment.optimizer.lr for c in cells] == [1e-3, 1e-3, 3e-3, 3e-3]
    assert all(c.experiment.name == "g" and c.run == run_name(c.experiment) for c in cells)
    assert len({c.run for c in cells}) == 4 and [c.run for c in expand(grid())] == [c.run for c in cells]


def test_random_and_dirichlet_draws_are_seeded_and_weights_sum_to_one():
    sweep = SweepConfig(name="r", base=smoke().derive(steps=4), search="random", samples=6, seed=3,
                        params={"optimizer.lr": LogUniform(low=1e-4, high=1e-2),
                                "mix_weights": Dirichlet(tables=TABLES, alpha=1.0)})
    a, b = expand(sweep), expand(sweep)
    assert [c.params for c in a] == [c.params for c in b]
    assert [c.params for c in a] != [c.params for c in expand(sweep.model_copy(update={"seed": 4}))]
    for c in a:
        w = c.experiment.mix_weights
        assert set(w) == set(TABLES) and sum(w.values()) == pytest.approx(1, abs=1e-12) and min(w.values()) > 0
        assert 1e-4 <= c.experiment.optimizer.lr <= 1e-2
    assert round_weights({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}) == {"a": 0.3334, "b": 0.3333, "c": 0.3333}


def test_budget_and_bad_params_are_named():
    with pytest.raises(ExperimentError, match="4 cells exceed budget.max_runs=3"):
        expand(grid(budget=SweepBudget(max_runs=3)))
    with pytest.raises(ExperimentError, match="over budget.max_tokens=100"):
        check_token_budget(grid(budget=SweepBudget(max_tokens=100)), [60, 60])
    with pytest.raises(ValueError, match="'optimizer.lrr' is not a field"):
        SweepConfig(name="x", base=smoke(), params={"optimizer.lrr": [1]})
    with pytest.raises(ValueError, match="grid search needs a list"):
        SweepConfig(name="x", base=smoke(), params={"optimizer.lr": LogUniform(low=1e-3, high=1e-2)})
    with pytest.raises(ValueError, match="random search needs samples"):
        SweepConfig(name="x", base=smoke(), search="random", params={"optimizer.lr": [1e-3]})
    with pytest.raises(ExperimentError, match=r"cell 0 .*global_batch=10 must be a multiple"):
        expand(SweepConfig(name="x", base=smoke(), params={"global_batch": [10]}))
    with pytest.raises(ExperimentError, match="cells 0 and 1 are the same experiment"):
        expand(SweepConfig(name="x", base=smoke(), params={"optimizer.lr": [1e-3, 1e-3]}))


def test_discovery_reads_files_as_they_are_now(tmp_path):
    source = ("from factory.experiments import ExperimentConfig\nfrom configs.experiments.smoke import smoke\n\n"
              "def a() -> ExperimentConfig:\n    return smoke().derive(name='a', seed=SEED)\n")
    (tmp_path / "a.py").write_text(source.replace("SEED", "1"))
    assert get_experiment("a", tmp_path).seed == 1
    (tmp_path / "a.py").write_text(source.replace("SEED", "2"))  # same size, same second
    assert get_experiment("a", tmp_path).seed == 2
    (tmp_path / "b.py").write_text(source.replace("SEED", "3").replace("def a", "def b"))  # name 'a' again
    (tmp_path / "c.py").write_text("raise RuntimeError('boom')\n")
    found = discover_experiments(tmp_path)
    assert list(found.found) == ["a"]
    assert any("b.py:b: experiment name 'a' is already defined by a.py:a" in e for e in found.errors)
    assert any("c.py: cannot import: RuntimeError: boom" in e for e in found.errors)
    with pytest.raises(ExperimentError, match="no experiment 'zz'.*have: a"):
        get_experiment("zz", tmp_path)


def test_the_shipped_configs_load():
    experiments, sweeps = discover_experiments(), discover_sweeps()
    assert not experiments.errors and not sweeps.errors
    assert {"smoke", "smoke_ddp"} <= set(experiments.found) and {"smoke_lr", "automix"} <= set(sweeps.found)
    assert len(expand(sweeps.found["automix"].config)) >= 16


def test_mup_sweep_cells_are_widths_by_parametrization_by_lr():
    sweep = mup_lr()
    cells = expand(sweep)
    lrs = sweep.params["optimizer.lr"]
    assert len(lrs) >= 5 and all(b == pytest.approx(2 * a) for a, b in zip(lrs, lrs[1:]))  # log-spaced, factor 2
    got = [(c.experiment.optimizer.lr, c.experiment.model.d_model, c.experiment.model.n_heads,
            c.experiment.model.mup_base_width) for c in cells]
    assert got == [(lr, d, d // 32, base) for lr in lrs for d in (64, 128, 256) for base in (None, 64)]
    assert all(c.experiment.model.head_dim == 32 and c.experiment.model.n_layers == 2 for c in cells)
    assert {c.experiment.model.width_multiplier for c in cells} == {1.0, 2.0, 4.0}
    assert all(c.experiment.eval_suite == "heldout" and c.experiment.eval_every == c.experiment.steps for c in cells)
    assert len({c.run for c in cells}) == len(cells)  # muP at width 64 is its own run, though the same model
    last = cells[-1]  # a whole ModelConfig value is carried as its JSON fields; the deeper path set on it
    assert last.params["model"] == {**last.experiment.model.model_dump(mode="json"), "mup_base_width": None}
    assert sweep.budget.max_runs >= len(cells)
    tokens = sum(c.experiment.steps * c.experiment.global_batch * 256 for c in cells)  # the default mix's seq_len
    check_token_budget(sweep, [tokens])
