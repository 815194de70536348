"""Triton kernels, each beside a plain-PyTorch reference and a launcher that falls back to it.

Every kernel module exposes `reference(...)` (PyTorch, the ground truth), `triton_kernel(...)`
(the Triton path: `@triton.jit` kernels and the code that launches them) and `launch(...)`, which
takes the Triton path on CUDA and a PyTorch path elsewhere. The Triton path also runs on CPU
tensors under Triton's interpreter (`TRITON_INTERPRET=1`, which must be set before `triton` is
imported), which is how the tests check it against the reference on machines without a GPU.

Triton is optional: these modules import without it, and `launch` never needs it off CUDA.

- `linear_cross_entropy`: the LM head and its cross-entropy in one pass over vocabulary chunks,
  accumulating in fp32, never holding the full logits.
- `tensor_hash`: the order-aware replica hash; on CUDA one Triton launch per element size hashes
  every parameter, the PyTorch reference elsewhere.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    """True when Triton runs kernels in its interpreter (TRITON_INTERPRET=1 at import)."""
    if not triton_available():
        return False
    import triton

    return bool(triton.knobs.runtime.interpret)


def triton_runs_on(t: torch.Tensor) -> bool:
    """Can the Triton path run on `t`'s device: compiled on CUDA, interpreted on CPU."""
    if not triton_available():
        return False
    return t.is_cuda or (t.device.type == "cpu" and interpreting())
