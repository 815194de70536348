"""The auto-mixer (`factory.experiments.automix`): on 16 Dirichlet proxies whose loss is a known
quadratic of the weights plus noise, the fit ranks held-out proxies well (leave-one-out Spearman)
and the proposal lands near the true optimum on the simplex; the same seed gives the same proposal;
too few proxies, unknown tables and NaN losses fail with `AutomixError`s naming the problem; and
`register_proposal` on a real lake registers `mix/automix@v1` whose lineage reaches every proxy,
and returns that same version when registered again. Runs on CPU: numpy for the fit, a sqlite
`SqlCatalog` lake (`build_training_lake`, ~3 s) for registration, no network.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from configs.mixes import mix_spec
from factory.experiments.automix import AutomixError, ProxyResult, fit, propose, register_proposal
from factory.experiments.sweep import Dirichlet
from factory.mix import get_version, mix_versions

TABLES = ("refined.python_stdlib", "refined.site_packages", "refined.package_docs")  # the default mix's
OPTIMUM = np.array([0.5, 0.3, 0.2])
CURVATURE = np.array([[0.4, 0.1, 0.0], [0.1, 0.3, 0.0], [0.0, 0.0, 0.6]])  # positive definite


def true_loss(W: np.ndarray) -> np.ndarray:
    d = np.atleast_2d(W) - OPTIMUM
    return 1.5 + np.einsum("ni,ij,nj->n", d, CURVATURE, d)


def proxies(n: int = 16, noise: float = 0.002, seed: int = 0) -> list[ProxyResult]:
    """`n` proxies drawn like the automix sweep's (uniform Dirichlet, weights rounded), loss = truth + noise."""
    rng, sampler = np.random.default_rng(seed), Dirichlet(tables=TABLES)
    results = []
    for i in range(n):
        weights = sampler.sample(rng)
        loss = float(true_loss(np.array([weights[t] for t in TABLES]))[0] + rng.normal(0, noise))
        run = f"automix-{i:08x}"
        results.append(ProxyResult(run=run, weights=weights, loss=loss,
                                   upstream=[f"ckpt/{run}@60", f"eval/{run}@60/heldout"]))
    return results


def test_fit_ranks_unseen_proxies_and_the_proposal_finds_the_optimum():
    results = proxies()
    regression = fit(results, TABLES)
    q = regression.quality
    assert (q.features, q.n) == ("quadratic", 16)
    assert q.loo_spearman > 0.8 and q.r2 > 0.9 and q.loo_rmse < 0.01, q

    proposal = propose(results, TABLES)
    w = np.array([proposal.weights[t] for t in TABLES])
    assert list(proposal.weights) == list(TABLES)
    assert math.isclose(sum(proposal.weights.values()), 1.0, abs_tol=1e-12) and (w >= 0).all()
    assert np.abs(w - OPTIMUM).sum() < 0.1, proposal.weights
    # the proposal beats every proxy and the uniform mix, in truth and as predicted
    assert true_loss(w)[0] < min(true_loss(np.array([r.weights[t] for t in TABLES]))[0] for r in results)
    assert proposal.predicted_loss < proposal.uniform_loss
    assert proposal.best.loss == min(r.loss for r in results) and proposal.n_proxies == 16
    summary = proposal.summary()
    assert summary.count("\n| refined.") == len(TABLES) and proposal.best.run in summary and "Spearman" in summary


def test_prediction_matches_the_truth_between_proxies():
    regression = fit(proxies(), TABLES)
    W = np.random.default_rng(1).dirichlet([2.0] * 3, size=200)
    assert np.abs(regression.predict(W) - true_loss(W)).max() < 0.02


def test_few_proxies_leave_the_quadratic_out():
    assert fit(proxies(n=5), TABLES).quality.features in ("linear", "log")
    assert fit(proxies(n=5), TABLES, features="linear").quality.features == "linear"


def test_the_fit_chooses_the_shape_the_proxies_support():
    """Truth with diminishing returns (a data-mixing-law shape: each share's log, one table worth
    nothing): leave-one-out picks the log features over the quadratic, and the proposal lands near
    the truth's interior optimum, w_i + 0.01 proportional to -b_i."""
    b = np.array([-0.06, -0.03, 0.0])
    rng, sampler = np.random.default_rng(0), Dirichlet(tables=TABLES)
    results = []
    for i in range(16):
        w = sampler.sample(rng)
        loss = 2.0 + float(b @ np.log(np.array([w[t] for t in TABLES]) + 0.01)) + rng.normal(0, 0.002)
        results.append(ProxyResult(run=f"automix-{i:08x}", weights=w, loss=loss))
    regression = fit(results, TABLES)
    assert (regression.quality.features, regression.quality.ridge) == ("log", 1e-3), regression.quality
    assert fit(results, TABLES, features="quadratic", ridge=1e-3).quality.loo_rmse > regression.quality.loo_rmse
    proposal = propose(results, TABLES)
    w = np.array([proposal.weights[t] for t in TABLES])
    assert w[2] < 0.05 and abs(w[0] / w[1] - 2) < 0.5, proposal.weights
    assert "log ridge fit (penalty 0.001" in proposal.summary()


@pytest.mark.parametrize("kwargs, message", [({"features": "cubic"}, "features must be one of"),
                                              ({"ridge": 0.0}, "ridge must be > 0")])
def test_bad_fit_options_fail_naming_them(kwargs, message):
    with pytest.raises(AutomixError, match=message):
        fit(proxies(), TABLES, **kwargs)


def test_same_seed_same_proposal_and_another_seed_draws_other_candidates():
    results = proxies()
    a, b = propose(results, TABLES, seed=3), propose(results, TABLES, seed=3)
    assert a == b
    assert propose(results, TABLES, seed=4).weights != a.weights


@pytest.mark.parametrize("change, message", [
    (lambda rs: rs[:3], "at least 4 proxy results"),
    (lambda rs: [*rs[:-1], rs[-1].model_copy(update={"weights": {"refined.nope": 1.0}})],
     "unknown tables ['refined.nope']"),
    (lambda rs: [*rs[:-1], rs[-1].model_copy(update={"loss": math.nan})], "non-finite loss nan"),
    (lambda rs: [*rs[:-1], rs[-1].model_copy(update={"weights": {TABLES[0]: 0.5}})], "sum to 1"),
])
def test_bad_results_fail_naming_the_problem(change, message):
    results = change(proxies())
    for call in (lambda: fit(results, TABLES), lambda: propose(results, TABLES, candidates=1_000)):
        with pytest.raises(AutomixError) as e:
            call()
        assert message in str(e.value)
        assert results[-1].run in str(e.value) or "at least" in message


def test_register_proposal_refuses_results_that_do_not_fit_the_base_mix(lake):
    results = proxies()
    proposal = propose(results, TABLES, candidates=1_000)
    base = mix_spec("default")
    strange = [*results[:-1], results[-1].model_copy(update={"weights": {"refined.elsewhere": 1.0}})]
    with pytest.raises(AutomixError, match=r"unknown tables \['refined.elsewhere'\]"):
        register_proposal(lake, proposal, base, results=strange, log=lambda _: None)
    with pytest.raises(AutomixError, match="fitted on 16 proxies, but 15"):
        register_proposal(lake, proposal, base, results=results[:15], log=lambda _: None)
    assert mix_versions(lake, "automix") == []


def test_register_proposal_makes_a_mix_version_whose_lineage_reaches_the_proxies(build_training_lake, tmp_path):
    lake = build_training_lake(tmp_path / "home")
    base = get_version(lake, "default").spec
    assert tuple(base.weights) == TABLES
    results = proxies()
    proposal = propose(results, TABLES, candidates=10_000)
    lines: list[str] = []

    version = register_proposal(lake, proposal, base, results=results, run_id="r1", log=lines.append)
    assert version.version_id == "mix/automix@v1"
    assert version.spec.weights == proposal.weights
    assert (version.spec.seq_len, version.spec.tokenizer, version.spec.heldout_fraction, version.spec.on_cap) == \
        (base.seq_len, base.tokenizer, base.heldout_fraction, base.on_cap)
    assert [s.max_epochs for s in version.spec.sources] == [s.max_epochs for s in base.sources]
    assert version.spec.stages == [] and "from 16 proxies" in version.spec.description
    assert "registered from 16 proxies (32 upstream ids)" in lines[-1]

    rows = [r for r in lake.lineage.records() if r.version_id == "mix/automix@v1"]
    assert len(rows) == 1 and rows[0].asset_key == "automix" and rows[0].run_id == "r1"
    proxy_ids = {u for r in results for u in r.upstream}
    assert proxy_ids <= set(rows[0].upstream) and len(proxy_ids) == 32
    assert any(u.startswith("tokenizer/default@") for u in rows[0].upstream)
    assert set(TABLES) == {u.rsplit("@", 1)[0] for u in rows[0].upstream if u.startswith("refined.")}
    assert lake.lineage.upstream_of("mix/automix@v1")["upstream"][-1]["version_id"] in proxy_ids

    again = register_proposal(lake, proposal, base, results=results, log=lines.append)
    assert again == version and "unchanged" in lines[-1]
    assert len(mix_versions(lake, "automix")) == 1
    assert len([r for r in lake.lineage.records() if r.version_id == "mix/automix@v1"]) == 1
