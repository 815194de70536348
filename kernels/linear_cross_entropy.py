"""The LM head and its cross-entropy in one pass over vocabulary chunks, accumulating in fp32.

`loss[i] = logsumexp(scale * h[i] @ W.T) - scale * h[i] @ W[t[i]]` (0 where `t[i] == ignore_index`),
per token, for hidden states `h` [N, D], the head `W` [V, D] and targets `t` [N]. The unfused way
materializes the logits [N, V] in fp32 (at N = 16k tokens and V = 128k, 8 GiB, plus as much
again for their gradient); here no more than [N, chunk] exists at a time.

Why fp32: a run in the seeds stopped converging until its LM head moved from bf16 to fp32
accumulation. A logit is a reduction over d_model; as the activations before the head grow, a
bf16 accumulator (8 bits of mantissa) loses the low bits of every partial sum, the logits go
coarse, and the loss and its gradient with them. `emulate_bf16_accumulation` reproduces that
failure for the numerics test; every path here multiplies in the inputs' precision and sums in
fp32 (products of bf16 values are exact in fp32).

Three implementations of one contract (per-token fp32 losses; gradients for `h` and `W` in their
own dtypes):
- `reference`: `F.linear` + `F.cross_entropy` in fp32, the ground truth (it holds the full logits).
- `chunked`: a `torch.autograd.Function` over vocabulary chunks with an online logsumexp; backward
  recomputes each chunk's logits from `h`, `W` and the saved logsumexp. Plain tensor ops, so
  `torch.compile` traces it into the model's graph (PyTorch's own `F.linear_cross_entropy` with
  `LinearCrossEntropyOptions` chunks over tokens, accumulates in fp32 when told to, but falls back
  to eager under `torch.compile`: a graph break in the middle of the step, which is what this
  project compiles away; see `bench/train_bench.py` for the two side by side).
- `triton_kernel`: three Triton kernels, forward (logsumexp and loss per token block) and backward
  (grad_h per token block, grad_W per vocabulary block), each recomputing logits tile by tile with
  `tl.dot` accumulating in fp32 (`input_precision="ieee"`: no TF32). Each program owns its output
  rows, so its atomic adds to them come from one program in program order: deterministic.

`launch` takes the Triton path on CUDA and `chunked` elsewhere.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kernels import triton_available, triton_runs_on

IGNORE_INDEX = -100
CHUNK = 1024  # vocabulary rows per chunk on the PyTorch path: [N, 1024] fp32 at a time (measured: 512-1024 fastest on CPU)


def reference(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, scale: float = 1.0,
              ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Per-token losses [N] (fp32) through the full fp32 logits."""
    logits = F.linear(h.float(), weight.float())
    if scale != 1.0:
        logits = logits * scale
    return F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction="none")


def emulate_bf16_accumulation(h: torch.Tensor, weight: torch.Tensor, *, block: int = 16) -> torch.Tensor:
    """Logits as a kernel with a bf16 accumulator computes them: exact partial dot products over
    `block` features at a time (a tensor-core MMA's depth), each added into a bf16 running sum.
    The failure mode of the seeds' run, for the numerics test and benchmark only."""
    h32, w32 = h.float(), weight.float()
    acc = torch.zeros(h.shape[0], weight.shape[0], dtype=torch.bfloat16, device=h.device)
    for k in range(0, h.shape[1], block):
        acc = (acc.float() + h32[:, k:k + block] @ w32[:, k:k + block].T).to(torch.bfloat16)
    return acc.float()


class _Chunked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, scale: float, ignore_index: int, chunk: int):
        with torch.autocast(h.device.type, enabled=False):
            h32 = h.float()
            valid = targets != ignore_index
            tgt = torch.where(valid, targets, 0)
            n = h.shape[0]
            m = torch.full((n,), -math.inf, device=h.device)
            s = torch.zeros(n, device=h.device)
            picked = torch.zeros(n, device=h.device)
            for start in range(0, weight.shape[0], chunk):  # in-place on the chunk: one [N, chunk] buffer
                z = h32 @ weight[start:start + chunk].float().T
                if scale != 1.0:
                    z.mul_(scale)
                width = z.shape[1]
                inside = (tgt >= start) & (tgt < start + width)
                at = (tgt - start).clamp(0, width - 1)[:, None]
                picked = picked + torch.where(inside, z.gather(1, at)[:, 0], 0.0)
                m_new = torch.maximum(m, z.amax(dim=1))
                s = s * torch.exp(m - m_new) + z.sub_(m_new[:, None]).exp_().sum(dim=1)
                m = m_new
            lse = m + torch.log(s)
            loss = torch.where(valid, lse - picked, 0.0)
        ctx.save_for_backward(h, weight, tgt, valid, lse)
        ctx.scale, ctx.chunk = scale, chunk
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        h, weight, tgt, valid, lse = ctx.saved_tensors
        scale, chunk = ctx.scale, ctx.chunk
        with torch.autocast(h.device.type, enabled=False):
            h32 = h.float()
            g = torch.where(valid, grad_loss.float(), 0.0) * scale  # d loss / d (unscaled logit) factor
            grad_h = torch.zeros_like(h32)
            grad_w = torch.empty(weight.shape, dtype=torch.float32, device=weight.device)
            rows = torch.arange(h.shape[0], device=h.device)
            for start in range(0, weight.shape[0], chunk):
                w32 = weight[start:start + chunk].float()
                z = h32 @ w32.T
                if scale != 1.0:
                    z.mul_(scale)
                p = z.sub_(lse[:, None]).exp_()  # softmax over the whole vocabulary, in place
                width = p.shape[1]
                inside = (tgt >= start) & (tgt < start + width)
                p.index_put_((rows, (tgt - start).clamp(0, width - 1)), -inside.float(), accumulate=True)
                p.mul_(g[:, None])
                grad_h.addmm_(p, w32)
                grad_w[start:start + width] = p.T @ h32
        return grad_h.to(h.dtype), grad_w.to(weight.dtype), None, None, None, None


def chunked(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, scale: float = 1.0,
            ignore_index: int = IGNORE_INDEX, chunk: int = CHUNK) -> torch.Tensor:
    """Per-token losses [N] (fp32), `chunk` vocabulary rows at a time (the PyTorch path)."""
    _check(h, weight, targets)
    return _Chunked.apply(h, weight, targets, float(scale), int(ignore_index), int(chunk))


def triton_kernel(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, scale: float = 1.0,
                  ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Per-token losses [N] (fp32) through the Triton kernels (CUDA, or CPU under the interpreter)."""
    _check(h, weight, targets)
    if not triton_runs_on(h):
        raise RuntimeError(f"the Triton path needs CUDA (or TRITON_INTERPRET=1 on CPU); got a {h.device} tensor")
    from kernels import _lce_triton

    return _lce_triton.LinearCrossEntropy.apply(h, weight, targets, float(scale), int(ignore_index))


def launch(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, scale: float = 1.0,
           ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """The fused LM head + cross-entropy the trainer calls: Triton on CUDA, `chunked` elsewhere."""
    if h.is_cuda and triton_available():
        return triton_kernel(h, weight, targets, scale=scale, ignore_index=ignore_index)
    return chunked(h, weight, targets, scale=scale, ignore_index=ignore_index)


def _check(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> None:
    if h.ndim != 2 or weight.ndim != 2 or targets.ndim != 1:
        raise ValueError(f"linear_cross_entropy: want h [N, D], weight [V, D], targets [N]; got "
                         f"{tuple(h.shape)}, {tuple(weight.shape)}, {tuple(targets.shape)}")
    if h.shape[1] != weight.shape[1] or h.shape[0] != targets.shape[0]:
        raise ValueError(f"linear_cross_entropy: shapes disagree: h {tuple(h.shape)}, weight {tuple(weight.shape)}, "
                         f"targets {tuple(targets.shape)}")
    if targets.dtype != torch.int64:
        raise ValueError(f"linear_cross_entropy: targets must be int64 class indices, got {targets.dtype}")
