"""Inference: checkpoint export, one engine interface (vLLM; transformers as the reference), and the
equivalence check that keeps training and inference implementations in agreement."""

from factory.infer.engine import Engine, EngineConfig, Sample, SamplingConfig, close_engines, open_engine
from factory.infer.export import ExportError, ExportRef, export_checkpoint, find_checkpoint, find_export

__all__ = [
    "Engine", "EngineConfig", "ExportError", "ExportRef", "Sample", "SamplingConfig", "close_engines",
    "export_checkpoint", "find_checkpoint", "find_export", "open_engine",
]
