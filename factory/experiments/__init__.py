"""Experiments as code: validated experiment specs, their derived plan and Markdown cards."""

from factory.experiments.spec import ExperimentConfig, ExperimentError, Plan, plan_experiment

__all__ = ["ExperimentConfig", "ExperimentError", "Plan", "plan_experiment"]
