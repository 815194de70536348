"""The equivalence check on a GPU: vLLM's CUDA build in fp32 must agree with our model and
transformers exactly as the CPU build does. Marked `gpu`; skipped cleanly without CUDA (the CPU
path is tests/infer/test_export.py)."""

import pytest
import torch

from factory.infer import EngineConfig, export_checkpoint
from factory.infer.equivalence import verify_export

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the CPU path is tested elsewhere)")]


def test_vllm_on_gpu_agrees_with_ours_in_fp32(trained_checkpoints):
    lake = trained_checkpoints.lake
    export = export_checkpoint(lake, trained_checkpoints.checkpoint_ids[-1])
    report = verify_export(lake, export, EngineConfig(kind="vllm", dtype="float32", gpu_memory_utilization=0.3))
    assert report.passed, report.problems
