"""The cost of the factory-health metrics on a training step: the same step with and without them.

Both variants run the smoke experiment's step in this process — its model (`smoke().model`,
vocab 512 as the tests' tokenizer gives it), global batch 16 in two micro-batches of 8 at
sequence length 256, forward, backward, `clip_grad_norm_`, AdamW — on fixed random tokens (the
data path is not what is measured). The instrumented variant adds exactly what `train()` adds per
step: `TrainMetrics.step(step, metrics, seconds)` with metrics on (FACTORY_METRICS=1, a
multiprocess directory in a temp dir: memory-mapped writes, as under torchrun).

Steps alternate off/on (ABAB...), so drift in the machine's load hits both alike; the ratio is of
the medians. Because a 1 % difference is below the noise of a shared CPU, the hook is also timed
on its own over many calls, and its cost is reported as a share of the median step: that is the
number the goal (< 1 %) is judged on. The replica-hash check costs nothing here (one process; its
cost on a real DDP run is the `factory_train_replica_check_seconds` series itself).

    .venv/bin/python bench/metrics_bench.py [--steps 40] [--warmup 5] [--threads 1] [--calls 20000] [--device cpu]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F


def build(device: str, seed: int = 0):
    from configs.experiments.smoke import smoke
    from factory.train.model import Transformer, param_groups

    exp = smoke()
    torch.manual_seed(seed)
    model = Transformer(exp.model.model_copy(update={"vocab_size": 512})).to(device)
    optimizer = torch.optim.AdamW(param_groups(model, exp.optimizer), lr=exp.optimizer.lr)
    tokens = torch.randint(0, 512, (exp.global_batch, exp.model.max_seq_len + 1), device=device)
    return exp, model, optimizer, tokens


def one_step(exp, model, optimizer, tokens) -> tuple[float, float]:
    total = 0.0
    chunks = tokens.split(exp.micro_batch)
    for chunk in chunks:
        logits = model(chunk[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1)) / len(chunks)
        loss.backward()
        total += loss.item()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total, grad_norm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="steps per variant (after warm-up)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where the step runs (default: cuda when present; a GPU step is shorter, the hook is not)")
    parser.add_argument("--calls", type=int, default=20000, help="hook calls timed on their own")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    os.environ["FACTORY_METRICS"] = "1"
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="metrics-bench-")
    from factory.health import metrics
    from factory.health.train import TrainMetrics

    metrics.reset()
    health = TrainMetrics.open("bench", SimpleNamespace(rank=0))
    exp, model, optimizer, tokens = build(args.device)
    tokens_per_step = exp.global_batch * exp.model.max_seq_len

    def step(n: int, instrumented: bool) -> float:
        t0 = time.perf_counter()
        loss, grad_norm = one_step(exp, model, optimizer, tokens)
        if instrumented:
            elapsed = time.perf_counter() - t0
            m = {"loss": loss, "grad_norm": grad_norm, "lr": 1e-3, "tokens_per_s": tokens_per_step / elapsed,
                 "mfu": 0.0, "loader_stall": 0.0, "skipped": 0.0}
            health.step(n, m, elapsed)
        return time.perf_counter() - t0

    for n in range(args.warmup):
        step(n, n % 2 == 1)
    off, on = [], []
    for n in range(2 * args.steps):
        (on if n % 2 else off).append(step(n, n % 2 == 1))
    m_off, m_on = statistics.median(off), statistics.median(on)

    m = {"loss": 2.0, "grad_norm": 1.0, "lr": 1e-3, "tokens_per_s": 1e4, "mfu": 0.1, "loader_stall": 0.0, "skipped": 0.0}
    t0 = time.perf_counter()
    for n in range(args.calls):
        health.step(n, m, 0.1)
    hook = (time.perf_counter() - t0) / args.calls
    health.close()

    print(f"smoke training step ({exp.model.d_model}d x {exp.model.n_layers} layers, {tokens_per_step:,} tokens, "
          f"{args.device}, {args.threads} thread(s)), median of {args.steps} alternating steps each:")
    print(f"  without metrics  {m_off * 1e3:8.2f} ms")
    print(f"  with metrics     {m_on * 1e3:8.2f} ms   ratio {m_on / m_off:.4f} (noise of a shared CPU included)")
    print(f"  the hook alone   {hook * 1e6:8.2f} us per step (mean of {args.calls:,} calls, multiprocess files)")
    share = hook / m_off
    print(f"  hook / step      {100 * share:8.4f} %   goal < 1 %: {'met' if share < 0.01 else 'NOT met'}")
    assert math.isfinite(share)


if __name__ == "__main__":
    main()
