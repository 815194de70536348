"""The auto-mixer: regress proxy runs' held-out loss on their mix weights, and propose a mix.

RegMix (Liu et al. 2024, "RegMix: Data Mixture as Regression for Language Model Pre-training",
arXiv:2407.01492) trains many small proxy models on random mixtures, fits a regression from
mixture weights to loss, and searches the simplex with it for the mixture predicted to be best.
Here the proxies are the cells of the `automix` sweep (`configs/sweeps/automix.py`: Dirichlet
weights over the default mix's tables, each scored on held-out bits per byte), and the answer is
an ordinary mix version, `mix/automix@vN`, whose lineage reaches every proxy's checkpoint and eval.

Design, and why:
- `fit` is ridge regression on one of three feature sets, chosen with its penalty by leave-one-out
  RMSE, since which shape the proxies support is an empirical question; the quadratic must beat
  the others' error by 20 % (`QUADRATIC_MARGIN`), because with 16 proxies of a few hundredths of
  noise its lower left-out error is often luck (simulated: 16 proxies over 3 sources + junk, noise
  sd 0.04, 20 draws: the plain choice's worst proposal gave junk 0.39, the margin's 0.07; at
  sd 0.02 one draw still chose a quadratic that gave it 0.20):
  - `linear`: the weights, the smallest model (a corner optimum; only the trust region below
    keeps the search off the corner);
  - `log`: log(w_i + 0.01), the diminishing returns of a source's share that data mixing laws
    find (Ye et al. 2024, arXiv:2403.16952): as many features as `linear`, but its optimum is
    interior, w_i + 0.01 proportional to -b_i, and a table whose coefficient is not negative (a
    table that only displaces the others) goes to its lowest weight;
  - `quadratic`: Scheffé's mixture features, w_i and w_i*w_j (i < j). On the simplex 1 = Σ w_i and
    w_i² = w_i − Σ_{j≠i} w_i w_j, so an intercept and the squares add collinearity, not shape: this
    is every quadratic, 10 features for 4 tables. It is a candidate only with more proxies than
    features. Measured on the designed case's 16 proxies over 4 tables, it fitted in sample
    (R² 0.92) but ranked left-out proxies poorly (Spearman 0.52), and its proposal lost to uniform.
  Features are standardized so one penalty treats them alike.
- Fit quality is measured out of sample: leave-one-out RMSE, and the Spearman correlation of
  left-out predictions with actual losses, since ranking mixes is all the search needs.
- `propose` searches as RegMix does: candidates come from the proxies' own Dirichlet (the fit is
  only trusted where proxies were), and the top_k best are averaged instead of taking the argmin,
  which would chase the fit's error into a corner of the simplex. Candidates are also kept inside
  the proxies' range of each table's weight (when at least top_k are): 16 proxies over 4 tables
  leave the Dirichlet's corners unsampled, and a quadratic's optimum there is extrapolation (seen
  on the designed case: 0.90 on one source where no proxy went past 0.6).
- `register_proposal` goes through `register_mix_version`, the one way a mix version comes to be.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from factory.experiments.sweep import Dirichlet, round_weights
from factory.lake import Lake
from factory.mix.spec import MixSource, MixSpec
from factory.mix.versions import MixVersion, register_mix_version

MIN_PROXIES = 4
FEATURES = ("linear", "log", "quadratic")
RIDGES = (1e-3, 1e-2, 1e-1, 1.0)  # the penalties the fit chooses among (standardized features)
QUADRATIC_MARGIN = 0.2
LOG_OFFSET = 0.01  # log(w + LOG_OFFSET): finite at w = 0, and about the smallest weight 16 Dirichlet proxies reach
WEIGHT_TOLERANCE = 1e-3  # proxy weights are rounded to 4 decimals by the sweep; they still sum to ~1


class AutomixError(ValueError):
    """The proxy results cannot support a fit or a proposal; the message names the problem."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ProxyResult(_Frozen):
    """One proxy run: the weights it trained on and its held-out loss (lower is better)."""

    run: str
    weights: dict[str, float]
    loss: float
    upstream: list[str] = Field(default_factory=list, description="Lineage ids behind the loss (checkpoint, eval).")


class FitQuality(_Frozen):
    """How well the regression ranks mixes it has not seen (the numbers the UI shows)."""

    features: Literal["linear", "log", "quadratic"]
    ridge: float
    n: int
    r2: float
    loo_rmse: float
    loo_spearman: float


@dataclass(frozen=True, eq=False)
class Regression:
    """Ridge regression from weights (columns in `tables` order) to loss, on standardized features."""

    tables: tuple[str, ...]
    features: Literal["linear", "log", "quadratic"]
    coef: np.ndarray
    intercept: float
    mean: np.ndarray
    scale: np.ndarray
    quality: FitQuality

    def predict(self, W: np.ndarray) -> np.ndarray:
        return _predict(_features(np.atleast_2d(W), self.features), self.coef, self.intercept, self.mean, self.scale)


class Proposal(_Frozen):
    """The proposed weights, what the fit predicts for them, and what they are compared against."""

    weights: dict[str, float]
    predicted_loss: float
    best: ProxyResult = Field(description="The proxy with the lowest observed loss.")
    uniform_loss: float = Field(description="Predicted loss of equal weights.")
    fit: FitQuality

    @property
    def n_proxies(self) -> int:
        return self.fit.n

    def summary(self) -> str:
        """A Markdown table: proposed vs best proxy vs uniform, then the fit's quality."""
        uniform = 1 / len(self.weights)
        lines = [f"| table | proposed | best proxy `{self.best.run}` | uniform |", "|---|---:|---:|---:|"]
        lines += [f"| {t} | {w:.4f} | {self.best.weights.get(t, 0.0):.4f} | {uniform:.4f} |"
                  for t, w in self.weights.items()]
        lines.append(f"| **loss** | {self.predicted_loss:.4f} (predicted) | {self.best.loss:.4f} (observed) "
                     f"| {self.uniform_loss:.4f} (predicted) |")
        f = self.fit
        return "\n".join(lines) + (f"\n\n{f.features} ridge fit (penalty {f.ridge:g}, both chosen by leave-one-out "
                                   f"RMSE) on {f.n} proxies: in-sample R² {f.r2:.3f}, leave-one-out RMSE {f.loo_rmse:.4f}, "
                                   f"leave-one-out Spearman {f.loo_spearman:.3f}.")


def fit(results: Sequence[ProxyResult], tables: Sequence[str], *, features: str | None = None,
        ridge: float | None = None) -> Regression:
    """Ridge regression of loss on weights, with its in-sample R² and leave-one-out RMSE and
    Spearman (each point predicted by a refit without it). `features` and `ridge` left out are
    chosen by leave-one-out RMSE among `FEATURES` (quadratic only with more proxies than its
    features) and `RIDGES`."""
    tables = tuple(tables)
    W, y = _data(results, tables)
    if features is not None and features not in FEATURES:
        raise AutomixError(f"automix: features must be one of {list(FEATURES)}, got {features!r}")
    if ridge is not None and not ridge > 0:
        raise AutomixError(f"automix: ridge must be > 0 (standardized simplex features are collinear), got {ridge}")
    n_quadratic = len(tables) + len(tables) * (len(tables) - 1) // 2
    kinds = [features] if features else [k for k in FEATURES if k != "quadratic" or len(y) > n_quadratic]
    best = None
    for kind in kinds:
        X = _features(W, kind)
        for penalty in [ridge] if ridge else RIDGES:
            loo = np.array([_predict(X[i:i + 1], *_ridge(np.delete(X, i, 0), np.delete(y, i), penalty))[0]
                            for i in range(len(y))])
            rmse = float(np.sqrt(((loo - y) ** 2).mean()))
            # the quadratic's extra features must earn their keep: QUADRATIC_MARGIN lower error
            score = rmse * (1 + QUADRATIC_MARGIN) if kind == "quadratic" and not features else rmse
            if best is None or score < best[0] - 1e-12:
                best = (score, rmse, kind, penalty, X, loo)
    _, rmse, kind, penalty, X, loo = best
    params = _ridge(X, y, penalty)
    fitted = _predict(X, *params)
    total = float(((y - y.mean()) ** 2).sum())
    quality = FitQuality(features=kind, ridge=penalty, n=len(y),
                         r2=1 - float(((y - fitted) ** 2).sum()) / total if total > 0 else math.nan,
                         loo_rmse=rmse, loo_spearman=_spearman(loo, y))
    return Regression(tables, kind, *params, quality=quality)


def propose(results: Sequence[ProxyResult], tables: Sequence[str], *, prior: Sequence[float] | None = None,
            alpha: float = 1.0, candidates: int = 100_000, top_k: int = 100, seed: int = 0) -> Proposal:
    """RegMix's search: `candidates` draws from the proxies' Dirichlet, the mean of the `top_k`
    lowest predicted losses, rounded so the weights sum to exactly 1."""
    tables = tuple(tables)
    if not 1 <= top_k <= candidates:
        raise AutomixError(f"automix: need 1 <= top_k <= candidates, got top_k={top_k}, candidates={candidates}")
    regression = fit(results, tables)
    try:
        dist = Dirichlet(tables=tables, alpha=alpha, prior=tuple(prior) if prior is not None else None)
    except ValueError as e:
        raise AutomixError(f"automix: bad search distribution: {e}") from None
    centre = np.array(dist.prior or [1.0] * len(tables))
    W = np.random.default_rng(seed).dirichlet(dist.alpha * len(tables) * centre / centre.sum(), size=candidates)
    seen, _ = _data(results, tables)  # the trust region: each table's weight within the proxies' range
    inside = ((W >= seen.min(axis=0)) & (W <= seen.max(axis=0))).all(axis=1)
    if inside.sum() >= top_k:
        W = W[inside]
    top = np.argsort(regression.predict(W), kind="stable")[:top_k]
    weights = round_weights(dict(zip(tables, W[top].mean(axis=0).tolist())))
    predicted, uniform = regression.predict(np.array([list(weights.values()), [1 / len(tables)] * len(tables)]))
    return Proposal(weights=weights, predicted_loss=float(predicted), best=min(results, key=lambda r: r.loss),
                    uniform_loss=float(uniform), fit=regression.quality)


def register_proposal(lake: Lake, proposal: Proposal, base: MixSpec, *, name: str = "automix",
                      results: Sequence[ProxyResult], run_id: str = "",
                      log: Callable[[str], None] = print) -> MixVersion:
    """Register `proposal` as the next version of mix `name`: `base`'s tables, caps, sequence length,
    tokenizer and held-out split with the proposed weights (no stages); its lineage row lists every
    proxy's upstream ids. An unchanged proposal returns the existing version."""
    _data(results, tuple(base.weights))
    if len(results) != proposal.n_proxies:
        raise AutomixError(f"automix: the proposal was fitted on {proposal.n_proxies} proxies, "
                           f"but {len(results)} results were given")
    unknown = sorted(set(proposal.weights) - set(base.weights))
    if unknown:
        raise AutomixError(f"automix: proposed tables {unknown} are not in base mix {base.name}")
    f = proposal.fit
    spec = MixSpec(
        name=name, seq_len=base.seq_len, tokenizer=base.tokenizer, on_cap=base.on_cap,
        heldout_fraction=base.heldout_fraction,
        description=f"Proposed by the auto-mixer (RegMix) from {f.n} proxies over mix {base.name}: {f.features} "
                    f"ridge fit, leave-one-out Spearman {f.loo_spearman:.2f}; predicted loss "
                    f"{proposal.predicted_loss:.4f} (best proxy {proposal.best.run}: {proposal.best.loss:.4f}).",
        sources=[MixSource(table=s.table, weight=proposal.weights.get(s.table, 0.0), max_epochs=s.max_epochs)
                 for s in base.sources],
    )
    upstream = sorted({u for r in results for u in r.upstream})
    version, created = register_mix_version(lake, spec, run_id=run_id, asset_key="automix",
                                            extra_upstream=upstream, log=log)
    log(f"{version.version_id}: {'registered' if created else 'unchanged, already registered'} "
        f"from {f.n} proxies ({len(upstream)} upstream ids)")
    return version


def _data(results: Sequence[ProxyResult], tables: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Weights (rows in result order, columns in `tables` order) and losses, after checking them."""
    if len(tables) < 2 or len(set(tables)) != len(tables):
        raise AutomixError(f"automix: needs at least 2 distinct tables to mix, got {list(tables)}")
    if len(results) < MIN_PROXIES:
        raise AutomixError(f"automix: needs at least {MIN_PROXIES} proxy results to fit, got {len(results)}")
    for r in results:
        unknown = sorted(set(r.weights) - set(tables))
        if unknown:
            raise AutomixError(f"automix: proxy {r.run} has weights for unknown tables {unknown} (mix: {list(tables)})")
        if not math.isfinite(r.loss):
            raise AutomixError(f"automix: proxy {r.run} has a non-finite loss {r.loss}")
        if not all(math.isfinite(w) and w >= 0 for w in r.weights.values()) \
                or abs(sum(r.weights.values()) - 1) > WEIGHT_TOLERANCE:
            raise AutomixError(f"automix: proxy {r.run} weights must be >= 0 and sum to 1: {r.weights}")
    W = np.array([[r.weights.get(t, 0.0) for t in tables] for r in results], dtype=np.float64)
    return W, np.array([r.loss for r in results], dtype=np.float64)


def _features(W: np.ndarray, kind: str) -> np.ndarray:
    if kind == "linear":
        return W
    if kind == "log":
        return np.log(W + LOG_OFFSET)
    return np.column_stack([W] + [W[:, i] * W[:, j] for i, j in combinations(range(W.shape[1]), 2)])


def _ridge(X: np.ndarray, y: np.ndarray, ridge: float) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """Minimize mean squared error + ridge * |coef|² on standardized X; the intercept is not penalized."""
    mean, scale = X.mean(axis=0), X.std(axis=0)
    scale = np.where(scale > 1e-12, scale, 1.0)
    Z = (X - mean) / scale
    coef = np.linalg.solve(Z.T @ Z + len(y) * ridge * np.eye(Z.shape[1]), Z.T @ (y - y.mean()))
    return coef, float(y.mean()), mean, scale


def _predict(X: np.ndarray, coef: np.ndarray, intercept: float, mean: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return ((X - mean) / scale) @ coef + intercept


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of ranks (ties share their mean rank); NaN when either side is constant."""
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    ranks = np.empty(len(x))
    ranks[np.argsort(x, kind="stable")] = np.arange(len(x))
    _, group = np.unique(x, return_inverse=True)
    return (np.bincount(group, ranks) / np.bincount(group))[group]


def propose_from_sweep(lake: Lake, sweep, *, name: str = "automix", run_id: str = "",
                       log: Callable[[str], None] = print) -> tuple[Proposal, MixVersion]:
    """The whole auto-mixer step after the proxies ran: refresh `sweeps.results` for `sweep` (a
    sweep over `mix_weights` with a Dirichlet), fit its evaluated cells' metric on their weights,
    and register the proposal as `mix/<name>@vN` over the proxies' base mix."""
    from factory.experiments.results import write_sweep_results
    from factory.mix import get_version

    dirichlet = sweep.params.get("mix_weights")
    if not isinstance(dirichlet, Dirichlet):
        raise AutomixError(f"sweep {sweep.name} does not sample mix_weights from a Dirichlet: nothing to regress")
    report = write_sweep_results(lake, sweep, run_id=run_id, asset_key="automix", partition=sweep.name)
    results = [ProxyResult(run=e["run"], weights=e["params"]["mix_weights"], loss=e["value"],
                           upstream=[e["checkpoint_id"], e["eval_id"]])
               for e in report.ranking if e["status"] == "evaluated" and e["value"] is not None]
    log(f"{sweep.name}: {len(results)} evaluated proxies of {len(report.ranking)} ({report.counts})")
    proposal = propose(results, dirichlet.tables, prior=dirichlet.prior, alpha=dirichlet.alpha, seed=sweep.seed)
    version = register_proposal(lake, proposal, get_version(lake, sweep.base.mix).spec, name=name, results=results,
                                run_id=run_id, log=log)
    return proposal, version
