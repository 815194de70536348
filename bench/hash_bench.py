"""The replica hash's cost per step, against one smoke training step measured in the same process.

With `hash_every=1` the replica checker hashes every parameter after every step
(`replicas.hashes` -> `kernels.tensor_hash.launch_many`). This prints, for the smoke model
(`Transformer` at d=128, 4 layers, vocab 8192: 1.84 M parameters in 38 tensors, fp32):

- the per-step hash time of the hash the checker used before (an int64 weight tensor as long as
  each parameter, cached per size: +8 bytes per element of memory) and of the current one
  (`launch_many`: on CPU the chunked reference, no per-size cache), alternating in rounds, and
  their ratio (current / former; below 1 is faster);
- the median time of one smoke training step (forward + backward + AdamW, global batch 16 x 256
  tokens in two micro-batches of 8) on random tokens;
- each hash's share of a step. Goal (issue 21): under 1 % of the step, at every step.

A dry-run check (`redundant_dry_run`) hashes the gradients as well: twice the hash time on the
steps it runs. `hash_cost(model, step_seconds)` is the measurement for another benchmark to call.
Not part of the tests. About 20 s on an idle 2-core machine.

`--device cuda` (for bench/gpu_check.sh, about a minute on one GPU) first checks the Triton kernel
against the reference, exactly, on random tensors of every hashed dtype and of sizes around BLOCK
and up to 50 M elements, one tensor at a time and as one bucket, and exits 1 on any difference;
then times the same comparison for the smoke model and a 1.0 B-parameter model of the same
architecture (d=2048, 16 layers, vocab 131072, bf16), with `torch.cuda.synchronize`. With
`--device cpu` under TRITON_INTERPRET=1 it runs the same check, smaller, in the interpreter.

    .venv/bin/python bench/hash_bench.py [--steps 6] [--rounds 7] [--threads 1] [--dtype float32]
    .venv/bin/python bench/hash_bench.py --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from factory.train.config import ModelConfig, OptimizerConfig
from factory.train.model import Transformer, param_groups
from kernels.tensor_hash import launch_many, reference, triton_kernel

SMOKE = ModelConfig(d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=256, vocab_size=8192)
LARGE = ModelConfig(d_model=2048, n_layers=16, n_heads=16, n_kv_heads=8, max_seq_len=2048, vocab_size=131072)
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool, torch.float8_e4m3fn]
_FORMER_WEIGHTS: dict[tuple[int, str], torch.Tensor] = {}


def former_hash(t: torch.Tensor) -> torch.Tensor:
    """The replica checker's hash before kernels/tensor_hash.py, as it was (with its cache)."""
    flat = t.detach().contiguous().view(-1)
    bits = flat.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[flat.element_size()])
    key = (flat.numel(), str(flat.device))
    if key not in _FORMER_WEIGHTS:
        _FORMER_WEIGHTS[key] = torch.arange(flat.numel(), device=flat.device, dtype=torch.int64) * 2 + 1
    return (bits.to(torch.int64) * _FORMER_WEIGHTS[key]).sum()


def _timed(fn, device: str, reps: int = 20) -> float:
    """Seconds per call of `fn` after one warm-up call, the device's queue drained at both ends."""
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps


def hash_cost(model: torch.nn.Module, step_seconds: float, *, rounds: int = 7, reps: int = 10) -> dict:
    """Seconds per check (all of `model`'s parameters) of the former and the current hash, the
    median over `rounds` alternating rounds of `reps` checks each, and their shares of a step."""
    params = [p.detach() for p in model.parameters()]
    former = lambda: torch.stack([former_hash(p) for p in params])  # noqa: E731
    current = lambda: launch_many(params)  # noqa: E731
    assert torch.equal(former(), current()), "the current hash must equal the former one bit for bit"
    times: dict[str, list[float]] = {"former": [], "current": []}
    for r in range(rounds):  # alternate the order: a neighbour's burst on the shared cores hits both
        order = [("former", former), ("current", current)][:: 1 if r % 2 == 0 else -1]
        for name, fn in order:
            times[name].append(_timed(fn, params[0].device.type, reps))
    former_s, current_s = statistics.median(times["former"]), statistics.median(times["current"])
    return {"former_s": former_s, "current_s": current_s, "ratio": current_s / former_s, "step_s": step_seconds,
            "former_share": former_s / step_seconds, "current_share": current_s / step_seconds,
            "former_cache_bytes": sum(w.numel() * w.element_size() for w in _FORMER_WEIGHTS.values()),
            "parameters": sum(p.numel() for p in params), "tensors": len(params)}


def step_seconds(model: Transformer, steps: int, *, warmup: int = 2) -> float:
    """The median time of one smoke-shaped step of `model` (which it trains): 16 sequences of
    max_seq_len tokens in micro-batches of 8, forward, backward, AdamW."""
    optimizer = OptimizerConfig(lr=3e-3, weight_decay=0.1)
    opt = torch.optim.AdamW(param_groups(model, optimizer), lr=optimizer.lr)
    device = next(model.parameters()).device
    config = model.config
    tokens = torch.randint(0, config.vocab_size, (16, config.max_seq_len + 1), generator=torch.Generator().manual_seed(0))
    tokens, times = tokens.to(device), []
    for step in range(warmup + steps):
        start = time.perf_counter()
        for chunk in tokens.split(8):
            (model(chunk[:, :-1], targets=chunk[:, 1:]).mean() / 2).backward()  # the trainer's loss path
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _random(n: int, dtype: torch.dtype, device: str, g: torch.Generator) -> torch.Tensor:
    """n random elements of `dtype`, every bit pattern possible (NaNs and infinities included)."""
    raw = torch.randint(-2**63, 2**63 - 1, (n,), generator=g, dtype=torch.int64, device=device)
    return raw.view(torch.uint8)[: n * dtype.itemsize].view(dtype) if dtype != torch.bool else raw[:n] > 0


def device_check(device: str) -> bool:
    """Triton == reference on random tensors on `device` (exactly), then the per-check times."""
    g = torch.Generator(device=device).manual_seed(0)
    big = device == "cuda"
    sizes = [1, 1023, 1024, 1025, 70_001] + ([(1 << 20) + 3, 50_000_000] if big else [])
    tensors = [_random(n, dtype, device, g) for dtype in DTYPES for n in sizes]
    tensors += [_random(4096, torch.float32, device, g).view(64, 64).T, _random(4097, torch.bfloat16, device, g)[1:]]
    want = torch.stack([reference(t) for t in tensors])
    single = torch.stack([triton_kernel([t])[0] for t in tensors])
    bucket = triton_kernel(tensors)
    bad = [(str(t.dtype), t.numel()) for t, w, s, b in zip(tensors, want, single, bucket) if not (w == s == b)]
    print(f"triton == reference on {len(tensors)} tensors ({len(DTYPES)} dtypes, sizes {sizes}), "
          f"one by one and as one bucket: {'yes' if not bad else f'NO, differs on {bad}'}")
    if not big:  # the interpreter's speed says nothing about the kernel's
        return not bad
    for name, config, dtype in [("smoke", SMOKE, torch.float32), ("1.0B", LARGE, torch.bfloat16)]:
        with torch.device(device):
            params = [p.detach().to(dtype) for p in Transformer(config).parameters()]
        assert torch.equal(launch_many(params), torch.stack([former_hash(p) for p in params]))
        n = sum(p.numel() for p in params)
        t_kernel = _timed(lambda: triton_kernel(params), device)
        t_reference = _timed(lambda: torch.stack([reference(p) for p in params]), device)
        t_former = _timed(lambda: torch.stack([former_hash(p) for p in params]), device)
        gbps = n * params[0].element_size() / t_kernel / 1e9
        if name == "smoke":
            with torch.device(device):
                model = Transformer(config)
            step_s = step_seconds(model, 5)  # outside the device context: its tokens come from a CPU generator
            print(f"smoke fp32 training step on {device}: {step_s * 1e3:.2f} ms; the Triton hash is "
                  f"{t_kernel / step_s:.2%} of it (goal < 1%), the former {t_former / step_s:.2%}")
        print(f"{name}: {n / 1e6:.1f} M {str(dtype).removeprefix('torch.')} parameters in {len(params)} tensors; per check: "
              f"triton {t_kernel * 1e3:.3f} ms ({gbps:.0f} GB/s), reference {t_reference * 1e3:.3f} ms, "
              f"former {t_former * 1e3:.3f} ms (cache {sum(w.numel() for w in _FORMER_WEIGHTS.values()) * 8 / 2**30:.2f} GiB); "
              f"triton / former {t_kernel / t_former:.2f}x")
        _FORMER_WEIGHTS.clear()
    return not bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="timed training steps (after 2 warm-up steps)")
    parser.add_argument("--rounds", type=int, default=7, help="alternating hash rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the cores are shared)")
    parser.add_argument("--dtype", default="float32", help="parameter dtype hashed (training stays fp32)")
    parser.add_argument("--device", help="check Triton against the reference on this device (cuda; cpu interprets)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.device:
        raise SystemExit(0 if device_check(args.device) else 1)
    torch.manual_seed(0)
    model = Transformer(SMOKE)
    step_s = step_seconds(model, args.steps)
    hashed = model.to(getattr(torch, args.dtype))
    c = hash_cost(hashed, step_s, rounds=args.rounds)
    print(f"smoke model: {c['parameters'] / 1e6:.2f} M parameters in {c['tensors']} tensors ({args.dtype}), "
          f"{args.threads} thread(s)")
    print(f"training step (median of {args.steps}):  {step_s * 1e3:8.1f} ms")
    print(f"hash per check, former (cached weights): {c['former_s'] * 1e3:8.3f} ms  "
          f"= {c['former_share']:.3%} of a step; weight cache {c['former_cache_bytes'] / 2**20:.1f} MiB")
    print(f"hash per check, current (launch_many):   {c['current_s'] * 1e3:8.3f} ms  "
          f"= {c['current_share']:.3%} of a step; no per-size cache")
    print(f"current / former: {c['ratio']:.2f}x time    goal: < 1% of a step at hash_every=1 -> "
          f"{'met' if c['current_share'] < 0.01 else 'NOT met'}")


if __name__ == "__main__":
    main()
