"""Triton kernels of `kernels.linear_cross_entropy` (imported only when Triton runs).

Tiles: a program's logits tile is [BLOCK_N tokens, BLOCK_V vocabulary rows], summed over d_model
BLOCK_D at a time with `tl.dot` into an fp32 accumulator (`input_precision="ieee"`, so fp32 inputs
are not rounded to TF32). Three kernels, each recomputing the logits it needs instead of storing
[N, V]:

- `_forward`: one program per token block walks the vocabulary with an online logsumexp (running
  max and rescaled sum) and picks the target's logit; it writes lse [N] and loss [N].
- `_grad_h`: one program per token block walks the vocabulary again; the logit gradient
  `(softmax - onehot(target)) * grad * scale` of each tile times W's tile is added into its rows of
  grad_h (fp32).
- `_grad_w`: one program per vocabulary block walks the tokens; the transposed tile gradient
  times h's tile is added into its rows of grad_W (fp32).

Each output row belongs to one program, so its adds (atomic, for memory ordering between the
loop's iterations) arrive in program order: the result does not depend on scheduling. The three
share `_logits` (a tile), `_logit_grad` and `_token_block`.

`UPCAST` casts tiles to fp32 before `tl.dot`: always in the interpreter (its bf16 dot is wrong)
and for fp32 inputs; bf16/fp16 on CUDA go to the tensor cores as they are (exact products, fp32
sums either way).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import interpreting

BLOCK_N, BLOCK_V, BLOCK_D = 32, 64, 32


@triton.jit
def _logits(H, W, rows, row_ok, cols, col_ok, D, stride_h, stride_w, scale,
            BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    """The [BLOCK_N, BLOCK_V] tile of scale * h @ W.T, summed over d_model in fp32; -inf outside V."""
    z = tl.zeros([BLOCK_N, BLOCK_V], tl.float32)
    for d0 in range(0, D, BLOCK_D):
        ks = d0 + tl.arange(0, BLOCK_D)
        k_ok = ks < D
        h = tl.load(H + rows[:, None] * stride_h + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(W + cols[:, None] * stride_w + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if UPCAST:
            h, w = h.to(tl.float32), w.to(tl.float32)
        z = tl.dot(h, tl.trans(w), z, input_precision="ieee")
    return tl.where(col_ok[None, :], z * scale, float("-inf"))


@triton.jit
def _logit_grad(z, lse, g, t, cols):
    """d loss / d (unscaled logits) of a tile: (softmax - onehot(target)) * grad * scale (in `g`)."""
    p = tl.exp(z - lse[:, None])  # 0 outside V, where z is -inf
    return (p - tl.where(cols[None, :] == t[:, None], 1.0, 0.0)) * g[:, None]


@triton.jit
def _token_block(T, LSE, G, rows, row_ok, scale, ignore_index):
    """A token block's targets, logsumexps and upstream gradients (0 where ignored or past N, times scale)."""
    t = tl.load(T + rows, mask=row_ok, other=ignore_index)
    lse = tl.load(LSE + rows, mask=row_ok, other=0.0)
    g = tl.load(G + rows, mask=row_ok, other=0.0)
    return t, lse, tl.where(row_ok & (t != ignore_index), g, 0.0) * scale


@triton.jit
def _forward(H, W, T, LSE, LOSS, N, V, D, stride_h, stride_w, scale, ignore_index,
             BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    t = tl.load(T + rows, mask=row_ok, other=ignore_index)
    m = tl.full([BLOCK_N], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_N], tl.float32)
    picked = tl.zeros([BLOCK_N], tl.float32)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        z = _logits(H, W, rows, row_ok, cols, cols < V, D, stride_h, stride_w, scale,
                    BLOCK_N, BLOCK_V, BLOCK_D, UPCAST)
        m_new = tl.maximum(m, tl.max(z, axis=1))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new[:, None]), axis=1)
        m = m_new
        picked += tl.sum(tl.where(cols[None, :] == t[:, None], z, 0.0), axis=1)
    lse = m + tl.log(s)
    valid = row_ok & (t != ignore_index)
    tl.store(LSE + rows, lse, mask=row_ok)
    tl.store(LOSS + rows, tl.where(valid, lse - picked, 0.0), mask=row_ok)


@triton.jit
def _grad_h(H, W, T, LSE, G, GH, N, V, D, stride_h, stride_w, scale, ignore_index,
            BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    t, lse, g = _token_block(T, LSE, G, rows, row_ok, scale, ignore_index)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        z = _logits(H, W, rows, row_ok, cols, col_ok, D, stride_h, stride_w, scale, BLOCK_N, BLOCK_V, BLOCK_D, UPCAST)
        dz = _logit_grad(z, lse, g, t, cols)
        for d0 in range(0, D, BLOCK_D):
            ks = d0 + tl.arange(0, BLOCK_D)
            k_ok = ks < D
            w = tl.load(W + cols[:, None] * stride_w + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            part = tl.dot(dz, w.to(tl.float32), input_precision="ieee")
            tl.atomic_add(GH + rows[:, None] * D + ks[None, :], part, mask=row_ok[:, None] & k_ok[None, :],
                          sem="relaxed")


@triton.jit
def _grad_w(H, W, T, LSE, G, GW, N, V, D, stride_h, stride_w, scale, ignore_index,
            BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    col_ok = cols < V
    for n0 in range(0, N, BLOCK_N):
        rows = n0 + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        t, lse, g = _token_block(T, LSE, G, rows, row_ok, scale, ignore_index)
        z = _logits(H, W, rows, row_ok, cols, col_ok, D, stride_h, stride_w, scale, BLOCK_N, BLOCK_V, BLOCK_D, UPCAST)
        dz = _logit_grad(z, lse, g, t, cols)
        for d0 in range(0, D, BLOCK_D):
            ks = d0 + tl.arange(0, BLOCK_D)
            k_ok = ks < D
            h = tl.load(H + rows[:, None] * stride_h + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            part = tl.dot(tl.trans(dz), h.to(tl.float32), input_precision="ieee")
            tl.atomic_add(GW + cols[:, None] * D + ks[None, :], part, mask=col_ok[:, None] & k_ok[None, :],
                          sem="relaxed")


def _blocks(h: torch.Tensor) -> dict:
    """Tile sizes, and whether tiles are cast to fp32 before `tl.dot`: always in the interpreter
    (its bf16 dot is wrong), never for bf16/fp16 on CUDA (the MMA multiplies exactly and sums in
    fp32 either way, at tensor-core speed)."""
    return {"BLOCK_N": BLOCK_N, "BLOCK_V": BLOCK_V, "BLOCK_D": BLOCK_D,
            "UPCAST": interpreting() or h.dtype == torch.float32}


class LinearCrossEntropy(torch.autograd.Function):
    """Per-token losses through `_forward`; gradients through `_grad_h` and `_grad_w`."""

    @staticmethod
    def forward(ctx, h, weight, targets, scale: float, ignore_index: int):
        ctx.dtypes = (h.dtype, weight.dtype)
        dtype = torch.promote_types(h.dtype, weight.dtype)  # tl.dot wants one input dtype
        h, weight = h.to(dtype).contiguous(), weight.to(dtype).contiguous()
        targets = targets.contiguous()
        n, d = h.shape
        v = weight.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=h.device)
        loss = torch.empty(n, dtype=torch.float32, device=h.device)
        _forward[(triton.cdiv(n, BLOCK_N),)](h, weight, targets, lse, loss, n, v, d, h.stride(0), weight.stride(0),
                                             scale, ignore_index, **_blocks(h))
        ctx.save_for_backward(h, weight, targets, lse)
        ctx.scale, ctx.ignore_index = scale, ignore_index
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        h, weight, targets, lse = ctx.saved_tensors
        n, d = h.shape
        v = weight.shape[0]
        g = grad_loss.float().contiguous()
        grad_h = torch.zeros(n, d, dtype=torch.float32, device=h.device)
        grad_w = torch.zeros(v, d, dtype=torch.float32, device=h.device)
        args = (n, v, d, h.stride(0), weight.stride(0), ctx.scale, ctx.ignore_index)
        blocks = _blocks(h)
        _grad_h[(triton.cdiv(n, BLOCK_N),)](h, weight, targets, lse, g, grad_h, *args, **blocks)
        _grad_w[(triton.cdiv(v, BLOCK_V),)](h, weight, targets, lse, g, grad_w, *args, **blocks)
        return grad_h.to(ctx.dtypes[0]), grad_w.to(ctx.dtypes[1]), None, None, None
