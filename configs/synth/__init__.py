"""Synthetic-data pipelines as code: each function returns a validated `PipelineConfig`."""

from configs.synth.porting import porting
from configs.synth.rephrase import rephrase
from factory.synth import PipelineConfig

PIPELINES = {"porting": porting, "rephrase": rephrase}


def pipeline(name: str) -> PipelineConfig:
    if name not in PIPELINES:
        raise ValueError(f"unknown synthetic pipeline {name!r}; defined in configs/synth: {sorted(PIPELINES)}")
    return PIPELINES[name]()
