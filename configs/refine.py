"""Refinement pipelines per embedded source (configs as code).

Code and prose share the chain; code sources are deduplicated against each other, so a module
vendored into site-packages that is byte-identical to the standard library's copy is kept once
(in python_stdlib, the smaller `source` name). Change a step here and only that step's asset and
those after it need re-materializing.
"""

from __future__ import annotations

from factory.data.refine.config import (
    DecontamConfig,
    ExactDedupConfig,
    NearDedupConfig,
    NormalizeConfig,
    QualityConfig,
    RedactConfig,
    RefineConfig,
)

CODE_SOURCES = ["python_stdlib", "site_packages"]


def default_pipeline(source: str) -> RefineConfig:
    others = [s for s in CODE_SOURCES if s != source] if source in CODE_SOURCES else []
    return RefineConfig(
        source=source,
        steps=[
            NormalizeConfig(),
            ExactDedupConfig(across_sources=others),
            NearDedupConfig(),
            QualityConfig(),
            RedactConfig(),
            DecontamConfig(),
        ],
    )


def pipelines() -> dict[str, RefineConfig]:
    """The refinement pipeline of every embedded source."""
    from configs.sources import EMBEDDED

    return {name: default_pipeline(name) for name in EMBEDDED}
