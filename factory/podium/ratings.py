"""Bradley–Terry ratings of exports from battle votes, with bootstrap confidence intervals.

The model: P(i beats j) = 1 / (1 + 10^((r_j - r_i) / 400)). Fitting it is a logistic regression
without intercept on one row per vote, +1 in i's column and -1 in j's (the coefficients, in natural
log-odds, times 400 / ln 10 are Elo-like points), which is how Chatbot Arena fits it too:
scikit-learn's `LogisticRegression` (lbfgs) does the optimisation. A tie or a
both-bad vote is half a win for each side (two rows of weight 1/2). A weak L2 penalty on the
log-odds (`C`) keeps an export that has only won finite; with hundreds of votes its pull is far
below the intervals.

Scores are centred on 1000 (the mean rating). The intervals come from refitting on `bootstrap`
resamples of the votes (with replacement): the 2.5th and 97.5th percentiles of each export's
rating. Exports and resamples are deterministic given `seed`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

OUTCOMES = ("a", "b", "tie", "bothbad")
SCALE, BASE, CENTER = 400.0, 10.0, 1000.0


@dataclass(frozen=True)
class Rating:
    export_id: str
    score: float
    lower: float
    upper: float
    votes: int
    wins: int
    losses: int
    ties: int


@dataclass(frozen=True)
class Leaderboard:
    ratings: list[Rating]  # best first
    win_rate: dict[str, dict[str, float | None]]  # row beats column (ties count half); None = never met
    battles: dict[str, dict[str, int]]  # votes between row and column
    votes: int


def _design(votes: list[tuple[str, str, str]], index: dict[str, int]):
    rows, labels, weights = [], [], []
    for a, b, outcome in votes:
        x = np.zeros(len(index))
        x[index[a]], x[index[b]] = 1.0, -1.0
        if outcome == "a":
            rows.append(x), labels.append(1), weights.append(1.0)
        elif outcome == "b":
            rows.append(x), labels.append(0), weights.append(1.0)
        else:  # tie / both bad: half a win each
            rows += [x, x]
            labels += [1, 0]
            weights += [0.5, 0.5]
    return np.array(rows), np.array(labels), np.array(weights)


def fit_scores(votes: list[tuple[str, str, str]], exports: list[str], *, C: float = 10.0) -> np.ndarray:
    """Ratings of `exports` (in that order) from `(a, b, outcome)` votes, centred on 1000."""
    from sklearn.linear_model import LogisticRegression

    index = {e: i for i, e in enumerate(exports)}
    X, y, w = _design(votes, index)
    if len(set(y.tolist())) < 2:  # one class only (e.g. a single decisive vote): mirror it so lbfgs has both
        X, y, w = np.vstack([X, -X]), np.concatenate([y, 1 - y]), np.concatenate([w, w])
    model = LogisticRegression(fit_intercept=False, C=C, tol=1e-8, max_iter=1000)
    model.fit(X, y, sample_weight=w)
    scores = model.coef_[0] * SCALE / math.log(BASE)  # natural log-odds -> Elo-like points
    return scores - scores.mean() + CENTER


def leaderboard(votes: list[tuple[str, str, str]], *, bootstrap: int = 200, seed: int = 0,
                C: float = 10.0) -> Leaderboard:
    """The ratings, intervals, vote counts and win-rate matrix of `(export_a, export_b, outcome)` votes."""
    bad = [v for v in votes if v[2] not in OUTCOMES or v[0] == v[1]]
    if bad:
        raise ValueError(f"vote {bad[0]}: outcome must be one of {OUTCOMES} between two different exports")
    exports = sorted({e for a, b, _ in votes for e in (a, b)})
    if not votes:
        return Leaderboard([], {}, {}, 0)
    scores = fit_scores(votes, exports, C=C)
    rng = np.random.default_rng(seed)
    samples = np.array([fit_scores([votes[i] for i in rng.integers(0, len(votes), len(votes))], exports, C=C)
                        for _ in range(bootstrap)]) if bootstrap else scores[None, :]
    lower, upper = np.percentile(samples, 2.5, axis=0), np.percentile(samples, 97.5, axis=0)
    tally = {e: [0, 0, 0] for e in exports}  # wins, losses, ties
    points = {e: {f: 0.0 for f in exports} for e in exports}
    met = {e: {f: 0 for f in exports} for e in exports}
    for a, b, outcome in votes:
        met[a][b] += 1
        met[b][a] += 1
        if outcome == "a":
            tally[a][0] += 1
            tally[b][1] += 1
            points[a][b] += 1
        elif outcome == "b":
            tally[b][0] += 1
            tally[a][1] += 1
            points[b][a] += 1
        else:
            tally[a][2] += 1
            tally[b][2] += 1
            points[a][b] += 0.5
            points[b][a] += 0.5
    ratings = [Rating(e, float(scores[i]), float(lower[i]), float(upper[i]), sum(tally[e]), *tally[e])
               for i, e in enumerate(exports)]
    ratings.sort(key=lambda r: -r.score)
    win_rate = {e: {f: (points[e][f] / met[e][f] if met[e][f] else None) for f in exports if f != e} for e in exports}
    battles = {e: {f: met[e][f] for f in exports if f != e} for e in exports}
    return Leaderboard(ratings, win_rate, battles, len(votes))
