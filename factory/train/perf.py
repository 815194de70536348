"""Throughput arithmetic: the matmul peak this process can reach, and model FLOPs utilization.

MFU divides the FLOPs a model's step needs by the FLOPs the hardware could have done. Datasheet
peaks are wrong for a CPU run (measured on a 2-core machine: about one core of matmul throughput is usable,
~80 GFLOP/s fp32, whatever the core count) and optimistic on a GPU, so the denominator is
*measured*: a square matmul on this process's device and thread count, warmed up, then timed over
a few trials, keeping the best. The figure is cached per (dtype, device, size, threads) for the
life of the process, so a trainer can ask every step.
"""

from __future__ import annotations

import time

import torch

_PEAKS: dict[tuple, float] = {}


def default_device() -> torch.device:
    """The device this process trains on: its current CUDA device when there is one, else CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_matmul_peak(dtype: torch.dtype = torch.float32, size: int = 1024, repeats: int = 8,
                        *, trials: int = 3, device: torch.device | str | None = None) -> float:
    """FLOP/s of `size`x`size` @ `size`x`size` matmuls in `dtype` (2*size^3 FLOPs each).

    Each trial times `repeats` back-to-back matmuls between device synchronizations (so launch
    latency is amortized on a GPU); the best trial wins. Cached in-process.
    """
    device = torch.device(device) if device is not None else default_device()
    key = (dtype, str(device), size, torch.get_num_threads())
    if key in _PEAKS:
        return _PEAKS[key]
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    with torch.no_grad():
        for _ in range(2):  # warm-up: allocator, kernel selection, caches
            a @ b
        best = float("inf")
        for _ in range(trials):
            _sync(device)
            start = time.perf_counter()
            for _ in range(repeats):
                a @ b
            _sync(device)
            best = min(best, time.perf_counter() - start)
    peak = 2 * size**3 * repeats / best
    _PEAKS[key] = peak
    return peak


def mfu(tokens_per_s: float, flops_per_token: float, peak: float) -> float:
    """Model FLOPs utilization: achieved FLOP/s (tokens/s x FLOPs per token) over `peak` FLOP/s."""
    if peak <= 0:
        raise ValueError(f"peak FLOP/s must be positive, got {peak}")
    return tokens_per_s * flops_per_token / peak
