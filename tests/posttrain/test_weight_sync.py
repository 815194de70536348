"""The weight sync from trainer to vLLM is verified, and a corrupted one is caught: after a push the
engine's weights (read back through vLLM's CPU kernels) hash to the trainer's and the log-prob probe
agrees within 1e-4; a perturbed or skipped tensor raises SyncError naming it, and in a run it stops
the run with a `weight_sync_mismatch` incident. vLLM in-process (CPU wheel), fp32."""

import pytest
import torch

from factory.faults import Faults, SyncCorruption
from factory.infer.engine import EngineConfig
from factory.infer.export import export_checkpoint, find_checkpoint, training_model
from factory.posttrain.rl.config import SyncCheckConfig
from factory.posttrain.rl.rollout import VLLMActor
from factory.posttrain.rl.sync import SyncError, WeightSync, engine_layout
from factory.train.model import llama_state_dict

pytestmark = pytest.mark.slow

Q = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def setup(trained_checkpoints):
    lake = trained_checkpoints.lake
    start = find_checkpoint(lake, trained_checkpoints.checkpoint_ids[-1])
    actor = VLLMActor(export_checkpoint(lake, start), EngineConfig(kind="vllm", dtype="float32"))
    probe = [actor.engine.encode("def total(items):\n    return sum(items)\n"), actor.engine.encode("import os\n")]
    yield start, actor, probe
    actor.close()


def _nudged(model, seed):
    """The model after a small update (what a training step does to every tensor)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    return model


def test_a_push_is_verified_by_digests_and_log_probs(setup):
    start, actor, probe = setup
    model = _nudged(training_model(start), 1)
    sync = WeightSync(actor.engine, probe, SyncCheckConfig(), tied=True)
    report = sync.push(model, 1)
    assert report.max_logprob_diff < 1e-5 and report.tensors == len(llama_state_dict(model))
    assert engine_layout(llama_state_dict(model)).keys() >= {"model.layers.0.self_attn.qkv_proj.weight",
                                                             "model.layers.0.mlp.gate_up_proj.weight"}
    # the engine now samples from the nudged weights: its scores moved with them
    before = actor.engine.logprobs(probe)
    sync.push(_nudged(model, 2), 2)
    assert actor.engine.logprobs(probe) != before


@pytest.mark.parametrize("mode", ["perturb", "skip"])
def test_a_corrupted_push_is_caught_and_names_the_tensor(setup, mode):
    start, actor, probe = setup
    model = _nudged(training_model(start), 3)
    sync = WeightSync(actor.engine, probe, SyncCheckConfig(), tied=True,
                      corrupt=SyncCorruption(version=5, tensor=Q, mode=mode))
    sync.push(model, 4)  # not the sabotaged version: fine
    _nudged(model, 4)
    with pytest.raises(SyncError, match="1 tensors differ") as info:
        sync.push(model, 5)
    assert info.value.detail["wrong"] == ["model.layers.0.self_attn.qkv_proj.weight"]
    sync.push(model, 6)  # the next, honest push repairs the engine
    assert sync.verify(model, 6) < 1e-5
