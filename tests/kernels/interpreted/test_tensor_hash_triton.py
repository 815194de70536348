"""The replica hash's Triton kernel (`kernels._tensor_hash_triton`, through
`kernels.tensor_hash.triton_kernel`) and its PyTorch reference on the same cases, in Triton's
interpreter on CPU (about 3 s).

Only collected with TRITON_INTERPRET=1 (tests/kernels/test_triton_interpreted.py runs this
directory so). Three implementations hash every tensor of `cases()`: the reference, the kernel
over all of them as one bucket (several element sizes and empty tensors in one call) and the
kernel tensor by tensor. Each property is asserted for each of them:

- one ulp (`torch.nextafter`) in one element changes the hash, and so does a swap of two
  elements (which `torch.hash_tensor`, an xor reduction, does not see), in fp32, bf16 and fp16;
- +0.0 and -0.0 differ; two NaNs with different payloads (made through an int32 view) differ;
- an empty tensor hashes to 0; a transposed or a strided view hashes like its contiguous copy;
- and the kernel equals the reference exactly on every case, random tensors included: sizes that
  are and are not multiples of BLOCK (1024) and one above the reference's CPU chunk (65536), in
  fp32, bf16, fp16, fp64, int64 (full range, so the products wrap), int32, int8, uint8 and bool.
"""

from __future__ import annotations

import functools

import pytest
import torch

from kernels import interpreting, tensor_hash

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
SIZES = [1, 7, 1023, 1024, 1025, 4097]


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@functools.cache
def cases() -> dict[str, torch.Tensor]:
    """Every tensor the implementations hash, by name (shared between tests, which only read them)."""
    g = torch.Generator().manual_seed(0)
    out: dict[str, torch.Tensor] = {}
    for dtype in FLOATS:
        d = _name(dtype)
        base = torch.randn(6, 5, generator=g).to(dtype)
        ulp, swapped = base.clone(), base.clone()
        ulp[2, 3] = torch.nextafter(ulp[2, 3], torch.tensor(float("inf"), dtype=dtype))
        swapped[0, 0], swapped[4, 2] = base[4, 2], base[0, 0]
        out |= {f"{d}/base": base, f"{d}/ulp": ulp, f"{d}/swapped": swapped,
                f"{d}/+0": torch.zeros(3, dtype=dtype), f"{d}/-0": -torch.zeros(3, dtype=dtype),
                f"{d}/empty": torch.empty(0, dtype=dtype),
                f"{d}/transposed": base.T, f"{d}/transposed_copy": base.T.contiguous(),
                f"{d}/strided": base[:, ::2], f"{d}/strided_copy": base[:, ::2].contiguous()}
    quiet, payload = (torch.tensor([0x3F800000, p], dtype=torch.int32).view(torch.float32) for p in (0x7FC00000, 0x7FC00001))
    out |= {"nan/quiet": quiet, "nan/payload": payload}
    for n in SIZES:
        for dtype in FLOATS + [torch.float64]:
            out[f"random/{_name(dtype)}/{n}"] = torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
        out[f"random/int64/{n}"] = torch.randint(-2**63, 2**63 - 1, (n,), generator=g, dtype=torch.int64)
        out[f"random/int32/{n}"] = torch.randint(-2**31, 2**31 - 1, (n,), generator=g, dtype=torch.int32)
        out[f"random/int8/{n}"] = torch.randint(-128, 128, (n,), generator=g, dtype=torch.int8)
        out[f"random/uint8/{n}"] = torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8)
        out[f"random/bool/{n}"] = torch.rand(n, generator=g) < 0.5
    out["random/float32/70000"] = torch.randn(70_000, generator=g)  # past the reference's CPU chunk
    return out


@functools.cache
def hashes(implementation: str) -> dict[str, int]:
    names, tensors = zip(*cases().items())
    if implementation == "reference":
        return {n: tensor_hash.reference(t).item() for n, t in zip(names, tensors)}
    if implementation == "triton bucket":
        return dict(zip(names, tensor_hash.triton_kernel(list(tensors)).tolist()))
    return {n: tensor_hash.triton_kernel([t])[0].item() for n, t in zip(names, tensors)}


@pytest.fixture(params=["reference", "triton bucket", "triton single"])
def hashed(request) -> dict[str, int]:
    """name -> hash of every case, by one implementation."""
    assert interpreting(), "these tests run under TRITON_INTERPRET=1 (tests/kernels/test_triton_interpreted.py)"
    return hashes(request.param)


@pytest.mark.parametrize("dtype", FLOATS, ids=_name)
def test_one_ulp_and_a_swap_change_the_hash(hashed, dtype):
    d, c = _name(dtype), cases()
    bits = {2: torch.int16, 4: torch.int32}[dtype.itemsize]
    assert (c[f"{d}/ulp"].view(bits).long() - c[f"{d}/base"].view(bits).long()).abs().sum() == 1  # one element, one ulp
    assert hashed[f"{d}/ulp"] != hashed[f"{d}/base"]
    assert not torch.equal(c[f"{d}/swapped"], c[f"{d}/base"])
    assert hashed[f"{d}/swapped"] != hashed[f"{d}/base"]
    assert torch.hash_tensor(c[f"{d}/swapped"]) == torch.hash_tensor(c[f"{d}/base"])  # xor is blind to order


@pytest.mark.parametrize("dtype", FLOATS, ids=_name)
def test_bits_not_values_zeros_empties_and_views(hashed, dtype):
    d = _name(dtype)
    assert hashed[f"{d}/+0"] != hashed[f"{d}/-0"]  # equal values, different sign bits
    assert hashed[f"{d}/empty"] == 0
    assert hashed[f"{d}/transposed"] == hashed[f"{d}/transposed_copy"] != hashed[f"{d}/base"]
    assert hashed[f"{d}/strided"] == hashed[f"{d}/strided_copy"]


def test_nan_payloads_differ(hashed):
    quiet, payload = cases()["nan/quiet"], cases()["nan/payload"]
    assert quiet[1].isnan() and payload[1].isnan() and not torch.equal(quiet.view(torch.int32), payload.view(torch.int32))
    assert hashed["nan/quiet"] != hashed["nan/payload"]


def test_triton_equals_the_reference_exactly():
    reference = hashes("reference")
    assert hashes("triton bucket") == reference
    assert hashes("triton single") == reference
    assert len({reference[f"random/float32/{n}"] for n in SIZES}) == len(SIZES)  # not a constant
