"""The replica hash: an order-aware int64 hash of a tensor's exact bits, computed on its device.

    hash(t) = sum_i bits(t)[i] * (2i + 1)   (mod 2**64, over t's values in logical order)

`bits` is the flat contiguous tensor viewed as the signed integer type of its element size
(int64 / int32 / int16; 1-byte dtypes as uint8), widened to int64, so the hash sees bits, not
values: +0.0 and -0.0 differ, so do two NaNs with different payloads. A change to any one element
always changes it (an odd weight is invertible mod 2**64), one ulp included. The weights make it
order-aware: swapping elements i and j changes the sum by 2(i - j)(b_i - b_j), which is not 0 mod
2**64 for distinct values of at most 4 bytes in a tensor of fewer than 2**31 elements (the product
has fewer than 63 factors of 2); 8-byte values collide on a swap only if their bits differ by a
multiple of 2**63 / 2**v, 2**v the power of 2 in i - j. `torch.hash_tensor` xors the elements,
which no permutation changes. The sum is commutative mod 2**64, so any blocking or reduction
order gives the same value, on any device.

Three implementations of the one formula, equal bit for bit (tests/kernels/test_tensor_hash.py):

- `reference(t)`: PyTorch. Chunks of 64 Ki elements on CPU (their int64 temporaries, 512 KiB,
  stay in L2), each times one cached row of weights 2j + 1 offset by 2 * start; the hash it
  replaces cached a weight tensor as long as the tensor, 8 bytes per element per distinct size.
- `triton_kernel(tensors)`: the Triton path (`kernels/_tensor_hash_triton.py`): one pass over a
  bucket of tensors of one element size per launch, BLOCK elements per program, weights computed
  from the index, int64 partials summed by a wrapping cumsum. Every dtype of 1, 2, 4 or 8 bytes
  goes through it (fp32, bf16, fp16, fp8, fp64, int64/int32/int16/int8, uint8, bool), read as
  integers: none falls back. A non-contiguous tensor is hashed from a contiguous copy, as in the
  reference.
- `launch(t)` / `launch_many(tensors)`: the Triton path on CUDA when triton imports, the
  reference elsewhere (CPU, or CUDA without triton). `launch_many` is what the replica checker
  calls: one launch per element size for all the parameters on CUDA, instead of ops per tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels import triton_available, triton_runs_on

_CHUNK = {"cpu": 1 << 16}  # reference chunk on CPU: int64 temporaries that stay in L2
_CHUNK_OTHER = 1 << 22  # elsewhere fewer, bigger chunks: each costs a few kernel launches
_BITS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
_ROWS: dict[tuple[torch.device, int], torch.Tensor] = {}  # (device, chunk) -> 2j + 1 for j < chunk


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The flat, contiguous integer view of `t`'s bits."""
    flat = t.detach().contiguous().view(-1)
    if flat.element_size() not in _BITS:
        raise ValueError(f"tensor_hash: dtype {flat.dtype} has {flat.element_size()}-byte elements; "
                         f"only 1, 2, 4 and 8 bytes are hashed")
    return flat.view(_BITS[flat.element_size()])


def reference(t: torch.Tensor) -> torch.Tensor:
    """sum_i bits[i] * (2i + 1) in wrapping int64, as a 0-dim int64 tensor on `t`'s device."""
    bits = _bits(t)
    n, chunk = bits.numel(), _CHUNK.get(bits.device.type, _CHUNK_OTHER)
    if (bits.device, chunk) not in _ROWS:
        _ROWS[bits.device, chunk] = torch.arange(chunk, device=bits.device, dtype=torch.int64) * 2 + 1
    row = _ROWS[bits.device, chunk]
    if n <= chunk:  # int64 times a narrower int promotes to int64: no widening copy of its own
        return (bits * row[:n]).sum()
    total = torch.zeros((), dtype=torch.int64, device=bits.device)
    weights, products = torch.empty_like(row), torch.empty_like(row)
    for start in range(0, n, chunk):
        part = bits[start:start + chunk]
        k = part.numel()
        w = torch.add(row[:k], 2 * start, out=weights[:k])  # 2(start + j) + 1
        total += torch.mul(part, w, out=products[:k]).sum()
    return total


def triton_kernel(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The hashes of `tensors` (int64 [n]) through the Triton kernel: on CUDA, or on CPU under
    Triton's interpreter (TRITON_INTERPRET=1 before triton is imported)."""
    if not tensors:
        return torch.zeros(0, dtype=torch.int64)
    _one_device(tensors)
    if not triton_runs_on(tensors[0]):
        raise RuntimeError(f"the Triton path needs CUDA (or TRITON_INTERPRET=1 on CPU); got a {tensors[0].device} tensor")
    from kernels import _tensor_hash_triton

    return _tensor_hash_triton.hashes([_bits(t) for t in tensors])


def launch(t: torch.Tensor) -> torch.Tensor:
    """The hash of `t` (0-dim int64 on its device): Triton on CUDA, the reference elsewhere."""
    if t.is_cuda and triton_available():
        return triton_kernel([t])[0]
    return reference(t)


def launch_many(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The hashes of `tensors` (int64 [n] on their device): one Triton launch per element size on
    CUDA, the reference tensor by tensor elsewhere."""
    if not tensors:
        return torch.zeros(0, dtype=torch.int64)
    _one_device(tensors)
    if tensors[0].is_cuda and triton_available():
        return triton_kernel(tensors)
    return torch.stack([reference(t) for t in tensors])


def _one_device(tensors: Sequence[torch.Tensor]) -> None:
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"tensor_hash: tensors on several devices ({sorted(map(str, devices))}); hash each device's apart")
