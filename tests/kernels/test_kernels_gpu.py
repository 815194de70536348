"""The kernels compiled for a GPU: marked `gpu`, skipped cleanly without CUDA (their CPU paths and
the Triton kernels in the interpreter are tested in the other files of tests/kernels).
bench/gpu_check.sh runs this file on a GPU machine.

- the fused linear + cross-entropy's Triton kernels (fp32 and bf16 inputs, the muP scale) against
  the fp32 reference, and less peak memory than the unfused head at vocabulary 32k;
- the replica hash's Triton kernel equal to the reference bit for bit, one tensor and a bucket;
- a bf16 run of the smoke model through `train()` with the fused loss and torch.compile on: the
  loss falls, no step is skipped, MFU is measured.
"""

from __future__ import annotations

import pytest
import torch

from kernels import linear_cross_entropy as lce

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (CPU paths: the other tests/kernels files)")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_loss_kernels_on_cuda_equal_the_reference(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    n, d, v = 4099, 256, 32_003
    h = torch.randn(n, d, device="cuda", generator=g).to(dtype).requires_grad_()
    w = (0.05 * torch.randn(v, d, device="cuda", generator=g)).to(dtype).requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda", generator=g)
    t[:7] = -100
    out = {}
    for name, fn in (("reference", lce.reference), ("triton", lce.launch)):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss = fn(h, w, t, scale=0.5)
        loss.sum().backward()
        out[name] = (loss.detach(), h.grad.float(), w.grad.float(), torch.cuda.max_memory_allocated() - base)
        h.grad = w.grad = None
    (l0, gh0, gw0, m0), (l1, gh1, gw1, m1) = out["reference"], out["triton"]
    assert torch.allclose(l1, l0, rtol=1e-5, atol=1e-4), (l1 - l0).abs().max()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert torch.allclose(gh1, gh0, rtol=tol, atol=tol), (gh1 - gh0).abs().max()
    assert torch.allclose(gw1, gw0, rtol=tol, atol=tol), (gw1 - gw0).abs().max()
    assert m1 < m0 / 2, f"fused peak {m1 / 2**20:.0f} MiB is not under half the unfused {m0 / 2**20:.0f} MiB"


def test_hash_kernel_on_cuda_equals_the_reference():
    from kernels import tensor_hash

    g = torch.Generator(device="cuda").manual_seed(1)
    tensors = [torch.randn(n, device="cuda", generator=g).to(dt) for n, dt in
               ((1, torch.float32), (1000, torch.float32), (1 << 20, torch.bfloat16), (12345, torch.float16))]
    tensors.append(torch.randint(-2**62, 2**62, (777,), device="cuda", generator=g))
    expected = torch.stack([tensor_hash.reference(t) for t in tensors])
    assert torch.equal(tensor_hash.launch_many(tensors), expected)
    assert all(torch.equal(tensor_hash.launch(t), e) for t, e in zip(tensors, expected))


def test_bf16_smoke_run_with_the_kernels(build_training_lake, tmp_path):
    from configs.experiments import smoke
    from factory.experiments import plan_experiment
    from factory.train.config import CheckpointConfig, TrackerConfig
    from factory.train.trainer import train

    lake = build_training_lake(tmp_path / "home")
    exp = smoke().derive(name="gpu-smoke", steps=40, precision="bf16", fused_loss=True, compile=True,
                         checkpoint=CheckpointConfig(every=40, keep_last=1), tracker=TrackerConfig(backends=["iceberg"]))
    result = train(plan_experiment(lake, exp), lake)
    rows = lake.table("train.metrics").to_arrow().to_pylist()
    loss = {r["step"]: r["value"] for r in rows if r["name"] == "loss"}
    mfu = [r["value"] for r in rows if r["name"] == "mfu"]
    assert result.steps == 40 and result.skipped_steps == 0
    assert loss[40] < loss[1] - 1.0, loss
    assert max(mfu) > 0, "MFU was not measured"
    print(f"bf16 smoke on CUDA: loss {loss[1]:.3f} -> {loss[40]:.3f}, median MFU {sorted(mfu)[len(mfu) // 2]:.4f}")
