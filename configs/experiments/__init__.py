"""Experiments as code: every module here holds functions annotated `-> ExperimentConfig`; a
variant calls its base and changes a few fields (`base().derive(...)`, validated again).

Each experiment file opens with its goal and launch command. The experiment sensor reads this
directory every tick (`factory.experiments.registry`): a new or edited experiment is queued as
run `<name>-<hash8>` (`run_key` = its identity hash), an unchanged one never again. By hand:
`factory experiment list | show NAME | submit NAME`, or without Dagster
`python -m factory.train --experiment NAME`.
"""

from configs.experiments.smoke import smoke, smoke_ddp
from factory.experiments import ExperimentConfig
from factory.experiments.registry import get_experiment


def experiment(name: str) -> ExperimentConfig:
    """The experiment `name` as the files say now (errors list the ones that exist)."""
    return get_experiment(name)


__all__ = ["experiment", "smoke", "smoke_ddp"]
