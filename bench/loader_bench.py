"""Loader throughput against the trainer's consumption, side by side in one process.

Measures, on a registered mix (default: `default`, which `make demo` registers):

1. the streaming loader alone — Parquet reads, on-the-fly BPE, weighted sampling, packing — in
   tokens per second, one producer thread;
2. a pre-tokenized reader for comparison: the same tokens written once as an int32 Parquet
   column, read back and reshaped into batches (what reading pre-tokenized shards would cost);
3. the smoke model's consumption in tokens per second: a small decoder-only transformer
   (d=256, 4 layers, seq 256, AdamW) training on batches already in memory;
4. training with the loader in the loop: the share of step time spent waiting for a batch.

Goal (issue 4): loader >= 20x consumption, stall < 1% of step time. Not part of the tests.

    .venv/bin/python bench/loader_bench.py [--mix default] [--batches 150] [--train-steps 12]
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

from factory.lake import Lake
from factory.mix import LoaderConfig, MixLoader, get_version


class SmokeModel(nn.Module):
    """A pre-norm causal transformer the size of the smoke experiment (stand-in until the
    training issue's model lands: the consumption rate is what matters here)."""

    def __init__(self, vocab: int, d: int = 256, layers: int = 4, heads: int = 4, seq: int = 256):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.pos[: x.shape[1]]
        return self.head(self.blocks(h, mask=self.mask[: x.shape[1], : x.shape[1]], is_causal=True))


def train_step(model, opt, tokens: torch.Tensor) -> float:
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mix", default="default")
    parser.add_argument("--home", default=None, help="FACTORY_HOME (default: $FACTORY_HOME or ./.factory)")
    parser.add_argument("--batch", type=int, default=16, help="sequences per step")
    parser.add_argument("--batches", type=int, default=150, help="batches for the loader-alone timing")
    parser.add_argument("--train-steps", type=int, default=12)
    args = parser.parse_args()

    lake = Lake.open(home=args.home)
    version = get_version(lake, args.mix)
    seq = version.spec.seq_len
    config = LoaderConfig(global_batch=args.batch, num_shards=8, num_workers=1, prefetch=64)
    print(f"{version.version_id}: seq_len {seq}, batch {args.batch}, torch threads {torch.get_num_threads()}, "
          f"cores {os.cpu_count()}")

    # 1. the loader alone
    started = time.perf_counter()
    loader = MixLoader(lake, version, config)
    first = loader.next_batch()
    startup = time.perf_counter() - started
    started = time.perf_counter()
    batches = [loader.next_batch() for _ in range(args.batches)]
    loader_s = time.perf_counter() - started
    loader.close()
    tokens = sum(b.tokens.numel() for b in batches)
    loader_tps = tokens / loader_s

    # 2. pre-tokenized: the same tokens as an int32 Parquet column, read back into batches
    flat = np.concatenate([b.tokens.numpy().astype(np.int32).ravel() for b in batches])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tokens.parquet")
        pq.write_table(pa.table({"tokens": flat}), path, row_group_size=1 << 20)
        started = time.perf_counter()
        read = 0
        for rb in pq.ParquetFile(path).iter_batches(batch_size=args.batch * (seq + 1)):
            arr = rb.column(0).to_numpy().reshape(-1, seq + 1)
            read += torch.from_numpy(arr.astype(np.int64)).numel()
        pretok_tps = read / (time.perf_counter() - started)

    # 3. the smoke model's consumption on in-memory batches
    torch.manual_seed(0)
    vocab = int(max(int(flat.max()) + 1, 8192))
    model = SmokeModel(vocab, seq=seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    params = sum(p.numel() for p in model.parameters())
    for b in batches[:2]:
        train_step(model, opt, b.tokens)  # warm-up
    started = time.perf_counter()
    for b in batches[2: 2 + args.train_steps]:
        train_step(model, opt, b.tokens)
    step_s = (time.perf_counter() - started) / args.train_steps
    consume_tps = args.batch * (seq + 1) / step_s

    # 4. training with the loader in the loop: time spent waiting for batches
    loader = MixLoader(lake, version, LoaderConfig(global_batch=args.batch, num_shards=8, num_workers=1,
                                                   prefetch=64, seed=1))
    train_step(model, opt, loader.next_batch().tokens)  # start-up is reported above, not a stall
    wait = total = 0.0
    waits = []
    for _ in range(args.train_steps):
        t0 = time.perf_counter()
        b = loader.next_batch()
        t1 = time.perf_counter()
        loss = train_step(model, opt, b.tokens)
        wait, total = wait + (t1 - t0), total + (time.perf_counter() - t0)
        waits.append(t1 - t0)
    loader.close()
    assert math.isfinite(loss)

    print(f"loader start (pins, tokenizer, first batch): {startup:.2f} s; first batch {tuple(first.tokens.shape)}")
    print(f"loader alone (on-the-fly BPE):     {loader_tps:>12,.0f} tokens/s  ({tokens:,} tokens)")
    print(f"pre-tokenized Parquet reader:      {pretok_tps:>12,.0f} tokens/s")
    print(f"smoke model ({params / 1e6:.1f} M params) consumes: {consume_tps:>8,.0f} tokens/s  ({step_s * 1000:.0f} ms/step)")
    print(f"ratio loader / consumption:        {loader_tps / consume_tps:>12.1f}x   (goal >= 20x)")
    print(f"ratio pre-tokenized / on-the-fly:  {pretok_tps / loader_tps:>12.1f}x")
    print(f"stall with the loader in the loop: {100 * wait / total:>12.2f} % of step time (goal < 1%)")
    print("waits per step (ms): " + " ".join(f"{1000 * w:.0f}" for w in waits))


if __name__ == "__main__":
    main()
