"""Synthetic data: pipelines of seeds, generator stages and validators, written to Iceberg
`synthetic.<name>` with per-row provenance, ready to join a mix (configs in configs/synth/)."""

from factory.synth.config import (
    BudgetConfig,
    EndpointConfig,
    GeneratorConfig,
    PipelineConfig,
    SeedsConfig,
    StageConfig,
    ValidatorConfig,
)
from factory.synth.pipeline import SynthResult, load_seeds, run_pipeline

__all__ = [
    "BudgetConfig", "EndpointConfig", "GeneratorConfig", "PipelineConfig", "SeedsConfig", "StageConfig",
    "SynthResult", "ValidatorConfig", "load_seeds", "run_pipeline",
]
