"""Goal: does the auto-mixer's proposed mix beat a uniform mix for the smoke model?

Both are the smoke experiment (120 steps, 1.84 M parameters), scored on the same held-out
documents (`heldout` suite: held-out bits per byte of every source; both mixes pin the same
snapshots and held-out split). `smoke_automix` trains on `mix/automix`, which exists once
`factory automix automix` has registered the proposal: until then the experiment sensor reports
"mix 'automix' has no registered version" and queues it at the first tick after.

    factory sweep run automix && factory automix automix
    factory experiment submit smoke_uniform smoke_automix     # or let the sensor queue them
    factory evals --suite heldout
"""

from __future__ import annotations

from configs.experiments.smoke import smoke
from configs.mixes import mix_spec
from factory.experiments import ExperimentConfig


def smoke_uniform() -> ExperimentConfig:
    """The smoke model on equal weights of the default mix's sources (the baseline)."""
    tables = list(mix_spec("default").weights)
    weights = {t: round(1 / len(tables), 4) for t in tables}
    weights[tables[0]] = round(1 - sum(weights[t] for t in tables[1:]), 4)
    return smoke().derive(name="smoke_uniform", description="The smoke model on a uniform mix of the default sources.",
                          mix_weights=weights, follow_mix=False, eval_every=120, eval_suite="heldout")


def smoke_automix() -> ExperimentConfig:
    """The smoke model on the auto-mixer's proposal (the newest mix/automix version)."""
    return smoke().derive(name="smoke_automix", description="The smoke model on the auto-mixer's proposed mix.",
                          mix="automix", follow_mix=False, eval_every=120, eval_suite="heldout")
