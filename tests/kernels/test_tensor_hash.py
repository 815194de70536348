"""The replica hash (`kernels.tensor_hash`) in this process, on CPU (a few seconds):

- the chunked reference equals, bit for bit, the hash the replica checker used before (a cached
  int64 weight tensor as long as the tensor), on tensors below, at and above its 65536-element
  chunk, in every hashed dtype, views included;
- `launch` / `launch_many` on CPU are the reference; `launch_many([])` is empty; tensors on two
  devices and 16-byte dtypes are refused by name;
- the module imports and hashes with triton unimportable, and the Triton path then says it needs
  CUDA (or the interpreter);
- the Triton kernel compiles for sm_90 (an H200) on this machine, no GPU needed, and its full
  blocks load 16-byte vectors exactly when the addresses are known to be aligned.

The kernel's values against the reference, and the ulp / swap / ±0 / NaN-payload cases for both,
run in Triton's interpreter: tests/kernels/interpreted/test_tensor_hash_triton.py.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

import kernels
from kernels import tensor_hash

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn]


def former_hash(t: torch.Tensor) -> torch.Tensor:
    """The replica checker's hash before `kernels.tensor_hash` (factory/train/replicas.py), verbatim
    but for its weight cache."""
    flat = t.detach().contiguous().view(-1)
    bits = flat.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[flat.element_size()])
    return (bits.to(torch.int64) * (torch.arange(flat.numel(), dtype=torch.int64) * 2 + 1)).sum()


def random_bits(n: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """n elements of `dtype` with random bits (NaNs, infinities and extremes included)."""
    raw = torch.randint(-2**63, 2**63 - 1, (n,), generator=g, dtype=torch.int64)
    return raw > 0 if dtype == torch.bool else raw.view(torch.uint8)[: n * dtype.itemsize].view(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_reference_is_the_former_hash_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(1)
    for n in [0, 1, 1000, 65_536, 65_537, 131_075]:
        t = random_bits(n, dtype, g)
        assert tensor_hash.reference(t) == former_hash(t), n
    view = random_bits(300 * 230, dtype, g).view(300, 230).T[:, 1::3]
    assert tensor_hash.reference(view) == former_hash(view) == tensor_hash.reference(view.contiguous())
    assert tensor_hash.reference(torch.tensor(7, dtype=torch.int64)) == 7  # 0-dim: one element, weight 1


def test_launchers_on_cpu_are_the_reference():
    g = torch.Generator().manual_seed(2)
    tensors = [random_bits(n, dtype, g) for n, dtype in [(10, torch.float32), (70_000, torch.bfloat16), (0, torch.float16),
                                                         (5, torch.int64), (3, torch.bool)]]
    many = tensor_hash.launch_many(tensors)
    assert many.dtype == torch.int64 and many.shape == (5,)
    assert many.tolist() == [tensor_hash.reference(t).item() for t in tensors] == [tensor_hash.launch(t).item() for t in tensors]
    assert tensor_hash.launch(tensors[0]).shape == () and tensor_hash.launch_many([]).shape == (0,)
    with pytest.raises(ValueError, match=r"several devices \(\['cpu', 'meta'\]\)"):
        tensor_hash.launch_many([torch.ones(2), torch.ones(2, device="meta")])
    with pytest.raises(ValueError, match="complex128 has 16-byte elements; only 1, 2, 4 and 8 bytes"):
        tensor_hash.reference(torch.ones(2, dtype=torch.complex128))


def test_works_without_triton(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    spec = importlib.util.spec_from_file_location("tensor_hash_without_triton", tensor_hash.__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    t = torch.randn(4, 3).to(torch.bfloat16)
    want = tensor_hash.reference(t).item()
    assert fresh.launch(t).item() == want and fresh.launch_many([t, t]).tolist() == [want, want]
    kernels.triton_available.cache_clear()
    try:
        with pytest.raises(RuntimeError, match=r"the Triton path needs CUDA \(or TRITON_INTERPRET=1 on CPU\)"):
            fresh.triton_kernel([t])
    finally:
        kernels.triton_available.cache_clear()


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_kernel_compiles_for_sm90_with_vector_loads():
    import triton
    from triton.backends.compiler import GPUTarget

    from kernels import _tensor_hash_triton as kt

    if not isinstance(kt.hash_blocks, triton.runtime.JITFunction):
        pytest.skip("triton was imported under TRITON_INTERPRET=1 in this process")
    signature = {"ptrs": "*i64", "block_tensor": "*i32", "block_start": "*i64", "numels": "*i64", "partials": "*i64",
                 "ELEM": "constexpr", "BLOCK": "constexpr", "ALIGNED": "constexpr"}
    for elem, aligned in [(2, True), (4, True), (4, False)]:
        source = triton.compiler.ASTSource(kt.hash_blocks, signature, {"ELEM": elem, "BLOCK": kt.BLOCK, "ALIGNED": aligned})
        ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
        vectors = [line for line in ptx.splitlines() if "ld.global.v" in line]
        assert bool(vectors) == aligned, (elem, aligned, vectors)
