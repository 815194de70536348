"""The fused linear + cross-entropy's Triton kernels (`kernels._lce_triton`: forward, grad_h,
grad_W) against `kernels.linear_cross_entropy.reference`, in Triton's interpreter on CPU.

Only collected with TRITON_INTERPRET=1 (tests/kernels/test_triton_interpreted.py runs this
directory so). Shapes are chosen to leave partial tiles on every axis (tokens, vocabulary and
d_model are not multiples of the blocks) and more than one tile on each.
"""

from __future__ import annotations

import pytest
import torch

from kernels import _lce_triton, interpreting, triton_runs_on
from kernels import linear_cross_entropy as lce


def test_the_interpreter_is_on():
    assert interpreting() and triton_runs_on(torch.zeros(1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_triton_forward_and_backward_equal_the_reference(dtype, scale):
    b = _lce_triton
    n, d, v = 2 * b.BLOCK_N + 7, b.BLOCK_D + 9, 2 * b.BLOCK_V + 13
    g = torch.Generator().manual_seed(3)
    h = torch.randn(n, d, generator=g).to(dtype).requires_grad_()
    w = (0.3 * torch.randn(v, d, generator=g)).to(dtype).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g)
    t[0], t[1], t[2] = -100, v - 1, 0
    weights = torch.linspace(0.5, 1.5, n)
    results = []
    for fn in (lce.reference, lce.triton_kernel):
        loss = fn(h, w, t, scale=scale)
        (loss * weights).sum().backward()
        results.append((loss.detach(), h.grad.clone(), w.grad.clone()))
        h.grad = w.grad = None
    (l_ref, gh_ref, gw_ref), (l_tri, gh_tri, gw_tri) = results
    assert l_tri[0] == 0 and (gh_tri[0] == 0).all(), "an ignored target counts 0 and gets no gradient"
    assert torch.allclose(l_tri, l_ref, rtol=1e-5, atol=1e-5), (l_tri - l_ref).abs().max()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert gh_tri.dtype == dtype and gw_tri.dtype == dtype
    assert torch.allclose(gh_tri.float(), gh_ref.float(), rtol=tol, atol=tol), (gh_tri - gh_ref).abs().max()
    assert torch.allclose(gw_tri.float(), gw_ref.float(), rtol=tol, atol=tol), (gw_tri - gw_ref).abs().max()


def test_the_triton_path_is_deterministic():
    g = torch.Generator().manual_seed(4)
    h = torch.randn(40, 24, generator=g).requires_grad_()
    w = torch.randn(100, 24, generator=g).requires_grad_()
    t = torch.randint(0, 100, (40,), generator=g)
    grads = []
    for _ in range(2):
        lce.triton_kernel(h, w, t).sum().backward()
        grads.append((h.grad.clone(), w.grad.clone()))
        h.grad = w.grad = None
    assert all(torch.equal(a, b) for a, b in zip(*grads))
