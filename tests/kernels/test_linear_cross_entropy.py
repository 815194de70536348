"""The fused LM head + cross-entropy (`kernels.linear_cross_entropy`) against its fp32 reference,
the numerics lesson it exists for, and the model with it. Runs on CPU in about 30 s (the sm_90 compiles take most of it).

- `chunked` (the PyTorch path `launch` takes off CUDA) equals `reference` in losses and in both
  gradients: fp32 and bf16 inputs, the muP logit scale, ignored targets, a chunk that does not
  divide the vocabulary, and a target in the last chunk;
- the seeds' failure mode: as the activations before the head grow, logits accumulated in bf16
  drift from an fp64 reference (their loss error grows with the scale) while the fp32 path's
  error stays at float rounding, at every scale;
- `Transformer(fused_loss=True)` gives the unfused model's loss and gradients, and under
  `torch.compile` both are one graph, loss included (no graph break);
- bad shapes and dtypes are refused with a message naming them;
- the Triton kernels compile for sm_90 (an H200) with no GPU, the bf16 path on tensor cores.

The Triton kernels are checked against the same reference in Triton's interpreter
(tests/kernels/interpreted, run by test_triton_interpreted.py); the trainer's loss curve with
the fused loss is in tests/train/test_trainer.py.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from factory.train.config import ModelConfig
from factory.train.model import Transformer
from kernels import linear_cross_entropy as lce


def case(dtype: torch.dtype, n: int = 96, d: int = 40, v: int = 300, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g).to(dtype).requires_grad_()
    w = (0.2 * torch.randn(v, d, generator=g)).to(dtype).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g)
    t[5], t[7], t[9] = -100, v - 1, 0  # an ignored target, one in the last (short) chunk, one in the first
    return h, w, t


def run(fn, h, w, t, **kw):
    """Losses and both gradients of a weighted sum of the per-token losses (weights != 1 check
    that each token's gradient is scaled by its own upstream gradient)."""
    loss = fn(h, w, t, **kw)
    (loss * torch.linspace(0.5, 1.5, len(t))).sum().backward()
    out = (loss.detach(), h.grad.clone(), w.grad.clone())
    h.grad = w.grad = None
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_chunked_equals_the_reference(dtype, scale):
    h, w, t = case(dtype)
    expected = run(lce.reference, h, w, t, scale=scale)
    got = run(lce.chunked, h, w, t, scale=scale, chunk=64)  # 300 = 4 x 64 + 44
    assert got[0].dtype == torch.float32 and got[1].dtype == dtype and got[2].dtype == dtype
    assert got[0][5] == 0 and expected[0][5] == 0, "an ignored target must count 0"
    assert torch.allclose(got[0], expected[0], rtol=1e-5, atol=1e-5)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16 gradients are rounded to bf16 at the end
    for name, a, b in (("grad_h", got[1], expected[1]), ("grad_W", got[2], expected[2])):
        assert torch.allclose(a.float(), b.float(), rtol=tol, atol=tol), f"{name}: max error {(a - b).abs().max()}"
    assert (got[1][5] == 0).all(), "an ignored token gets no gradient"


def loss_errors(scale: float) -> tuple[float, float, float]:
    """Mean absolute loss error against fp64, at activation `scale`: (bf16 accumulation, bf16
    logits from an fp32 accumulator, the fp32 fused path). Inputs are bf16 values (what a bf16
    model hands the head), so only the head's arithmetic differs."""
    g = torch.Generator().manual_seed(1)
    n, d, v = 128, 512, 1024
    h = (scale * torch.randn(n, d, generator=g)).bfloat16()
    w = (0.02 * torch.randn(v, d, generator=g)).bfloat16()
    t = torch.randint(0, v, (n,), generator=g)
    exact = torch.nn.functional.cross_entropy(h.double() @ w.double().T, t, reduction="none")

    def err(logits: torch.Tensor) -> float:
        return (torch.nn.functional.cross_entropy(logits.double(), t, reduction="none") - exact).abs().mean().item()

    with torch.no_grad():
        fused = lce.chunked(h, w, t).double()
        return (err(lce.emulate_bf16_accumulation(h, w)), err((h @ w.T).float()),
                (fused - exact).abs().mean().item())


def test_bf16_accumulation_loses_the_loss_as_activations_grow_and_fp32_does_not():
    scales = [1, 4, 16, 64]
    table = {s: loss_errors(s) for s in scales}
    bf16_acc = [table[s][0] for s in scales]
    fp32 = [table[s][2] for s in scales]
    shown = "; ".join(f"scale {s}: bf16 acc {a:.2e}, bf16 logits {b:.2e}, fp32 {c:.2e}" for s, (a, b, c) in table.items())
    # the bf16 accumulator's error grows with the activations (each logit is coarser in absolute terms)
    assert all(b > a for a, b in zip(bf16_acc, bf16_acc[1:])), shown
    assert bf16_acc[-1] > 30 * bf16_acc[0] and bf16_acc[-1] > 0.05, shown
    # fp32 accumulation stays at float rounding relative to the loss at every scale
    losses_scale = [max(1.0, s * 0.02 * 512 ** 0.5) for s in scales]  # ~ the logits' magnitude
    assert all(e < 1e-5 * m for e, m in zip(fp32, losses_scale)), shown
    assert all(e < a / 100 for e, a in zip(fp32, bf16_acc)), shown


def tiny(width_base: int | None = None) -> ModelConfig:
    return ModelConfig(d_model=64, n_layers=2, n_heads=2, max_seq_len=32, vocab_size=700, mup_base_width=width_base)


@pytest.mark.parametrize("mup", [None, 32])
def test_the_fused_model_gives_the_unfused_loss_and_gradients(mup):
    idx = torch.randint(0, 700, (3, 25), generator=torch.Generator().manual_seed(2))
    runs = []
    for fused in (False, True):
        torch.manual_seed(0)
        model = Transformer(tiny(mup), fused_loss=fused)
        loss = model.loss(idx[:, :-1], idx[:, 1:])
        loss.backward()
        runs.append((loss.item(), {n: p.grad for n, p in model.named_parameters()}))
    (a, ga), (b, gb) = runs
    assert a == pytest.approx(b, rel=1e-6)
    for name in ga:
        assert torch.allclose(ga[name], gb[name], rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("fused", [False, True])
def test_compiled_model_and_loss_are_one_graph(fused):
    torch._dynamo.reset()
    model = Transformer(tiny(), fused_loss=fused)
    idx = torch.randint(0, 700, (2, 17))
    explained = torch._dynamo.explain(model)(idx[:, :-1], targets=idx[:, 1:])
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_bad_inputs_are_named():
    h, w, t = case(torch.float32)
    with pytest.raises(ValueError, match=r"shapes disagree: h \(96, 40\), weight \(300, 39\)"):
        lce.chunked(h, w[:, :39], t)
    with pytest.raises(ValueError, match="targets must be int64 class indices, got torch.int32"):
        lce.chunked(h, w, t.int())
    with pytest.raises(ValueError, match=r"want h \[N, D\]"):
        lce.launch(h[None], w, t)
    with pytest.raises(RuntimeError, match="the Triton path needs CUDA"):
        lce.triton_kernel(h, w, t)


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_triton_kernels_compile_for_sm90(dtype):
    """The CUDA build of the three kernels, for an H200 (sm_90), with no GPU: bf16 takes the
    tensor-core path (no fp32 cast before `tl.dot`), which the interpreter never runs."""
    import triton
    from triton.backends.compiler import GPUTarget

    from kernels import _lce_triton as kt

    assert isinstance(kt._forward, triton.runtime.JITFunction), "triton was imported under TRITON_INTERPRET=1"
    tensors = {"H": f"*{dtype}", "W": f"*{dtype}", "T": "*i64", "LSE": "*fp32", "LOSS": "*fp32", "G": "*fp32",
               "GH": "*fp32", "GW": "*fp32"}
    scalars = {"N": "i32", "V": "i32", "D": "i32", "stride_h": "i32", "stride_w": "i32", "scale": "fp32",
               "ignore_index": "i32"}
    constants = {"BLOCK_N": 64, "BLOCK_V": 64, "BLOCK_D": 32, "UPCAST": dtype == "fp32"}
    for kernel in (kt._forward, kt._grad_h, kt._grad_w):
        signature = {name: tensors.get(name) or scalars.get(name) or "constexpr" for name in kernel.arg_names}
        compiled = triton.compile(triton.compiler.ASTSource(kernel, signature, constants),
                                  target=GPUTarget("cuda", 90, 32))
        ptx = compiled.asm["ptx"]
        assert ".target sm_90" in ptx
        if dtype == "bf16" and kernel is kt._forward:
            assert "mma" in ptx or "wgmma" in ptx, "the bf16 logits tile should use the tensor cores"
