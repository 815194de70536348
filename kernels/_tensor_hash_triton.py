"""The Triton kernel of `kernels.tensor_hash` (imported only when Triton runs).

One launch hashes a bucket of tensors of one element size, without copying them together: the
launcher passes their addresses in a table, and program p hashes BLOCK elements of one tensor,
named with its start by two more tables (`block_tensor`, `block_start`), so blocks never straddle
two tensors. The program reads the bits through an integer pointer of the element size (int16 for
bf16/fp16, int32 for fp32, uint8 for 1-byte dtypes: the reference's views, sign extension
included), computes the weights 2i + 1 from the element index, and stores one int64 partial sum
(the products wrap, as the reference's do). A wrapping cumsum over the partials, differenced at
the tensors' block boundaries, gives one hash per tensor: integer sums, so the result does not
depend on the order the programs ran in.

Full blocks load without a mask, and when every address of the bucket is a multiple of 16 bytes
(fresh PyTorch allocations are; the launcher checks) the kernel says so, so their loads compile
to 16-byte vector loads (seen in the PTX for sm_90); the tail block of each tensor is masked.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import triton
import triton.language as tl

BLOCK = 1024  # elements per program
_PLANS: OrderedDict[tuple, list[tuple]] = OrderedDict()  # bucket layout -> launch tables on its device
_PLANS_KEPT = 8  # parameters, and gradients in dry runs: a few layouts recur


@triton.jit
def hash_blocks(ptrs, block_tensor, block_start, numels, partials,
                ELEM: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    """partials[p] = sum over elements i in [block_start[p], +BLOCK) of tensor t = block_tensor[p]
    (at address ptrs[t], numels[t] long) of bits[i] * (2i + 1), in wrapping int64."""
    pid = tl.program_id(0)
    t = tl.load(block_tensor + pid)
    start = tl.load(block_start + pid)
    n = tl.load(numels + t)
    address = tl.load(ptrs + t)
    if ELEM == 1:  # uint8: 1-byte values widen without sign extension, as the reference views them
        base = address.to(tl.pointer_type(tl.uint8))
    elif ELEM == 2:
        base = address.to(tl.pointer_type(tl.int16))
    elif ELEM == 4:
        base = address.to(tl.pointer_type(tl.int32))
    else:
        base = address.to(tl.pointer_type(tl.int64))
    if ALIGNED:
        base = tl.multiple_of(base, 16)
    start = tl.multiple_of(start, BLOCK)
    index = start + tl.arange(0, BLOCK).to(tl.int64)
    if start + BLOCK <= n:  # a full block: unmasked, so the loads can be vectors
        bits = tl.load(base + index).to(tl.int64)
    else:
        bits = tl.load(base + index, mask=index < n, other=0).to(tl.int64)
    tl.store(partials + pid, tl.sum(bits * (2 * index + 1), axis=0))


def _plan(flats: list[torch.Tensor]) -> list[tuple]:
    """Per element size: (ELEM, ALIGNED, ptrs, block_tensor, block_start, numels, block bounds per
    tensor, positions in `flats`), the tables on the tensors' device. Cached by layout: parameters
    keep their addresses between steps, so after the first check a launch copies nothing to the
    device. Empty tensors are left out (their hash is 0)."""
    key = (flats[0].device, tuple((f.data_ptr(), f.numel(), f.element_size()) for f in flats))
    if key in _PLANS:
        _PLANS.move_to_end(key)
        return _PLANS[key]
    by_size: dict[int, list[int]] = {}
    for i, f in enumerate(flats):
        if f.numel():
            by_size.setdefault(f.element_size(), []).append(i)
    plan = []
    for elem, members in by_size.items():
        numels = torch.tensor([flats[i].numel() for i in members], dtype=torch.int64)
        blocks = (numels + BLOCK - 1) // BLOCK
        bounds = torch.cat([torch.zeros(1, dtype=torch.int64), blocks.cumsum(0)])
        block_tensor = torch.repeat_interleave(torch.arange(len(members), dtype=torch.int32), blocks)
        block_start = (torch.arange(int(bounds[-1])) - bounds[:-1].repeat_interleave(blocks)) * BLOCK
        addresses = [flats[i].data_ptr() for i in members]
        tables = (torch.tensor(addresses, dtype=torch.int64), block_tensor, block_start, numels, bounds,
                  torch.tensor(members))
        plan.append((elem, all(a % 16 == 0 for a in addresses), *(x.to(flats[0].device) for x in tables)))
    _PLANS[key] = plan
    if len(_PLANS) > _PLANS_KEPT:
        _PLANS.popitem(last=False)
    return plan


def hashes(flats: list[torch.Tensor]) -> torch.Tensor:
    """The hashes (int64 [n]) of flat contiguous integer views on one device, one launch per
    element size. The caller holds `flats` until the result is used: the kernel reads them by address."""
    out = torch.zeros(len(flats), dtype=torch.int64, device=flats[0].device)
    for elem, aligned, ptrs, block_tensor, block_start, numels, bounds, positions in _plan(flats):
        partials = torch.empty(block_tensor.numel(), dtype=torch.int64, device=out.device)
        hash_blocks[(block_tensor.numel(),)](ptrs, block_tensor, block_start, numels, partials,
                                             ELEM=elem, BLOCK=BLOCK, ALIGNED=aligned)
        running = torch.cat([partials.new_zeros(1), partials.cumsum(0)])  # wraps; differences stay exact mod 2**64
        out[positions] = running[bounds[1:]] - running[bounds[:-1]]
    return out
