"""Thin Dagster assets, one module per stage; asset key prefixes match Iceberg namespaces."""

from assets.envs import env_builds
from assets.evals import checkpoint_export, eval_scores
from assets.mix import mix
from assets.podium import podium_leaderboard
from assets.posttrain import rl_run, sft_run
from assets.raw import raw_assets
from assets.refine import refine_assets, refine_checks
from assets.sweeps import automix, sweep_results
from assets.synth import synth_assets
from assets.tasks import task_assets
from assets.tokenizer import tokenizer
from assets.train import training_run


def all_assets() -> list:
    return [*raw_assets(), *refine_assets(), tokenizer, mix, training_run, checkpoint_export, eval_scores, *synth_assets(),
            sweep_results, automix, env_builds, *task_assets(), sft_run, rl_run, podium_leaderboard]


def all_checks() -> list:
    return [*refine_checks()]


__all__ = ["all_assets", "all_checks"]
