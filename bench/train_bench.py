"""Training throughput: our `train()` against a minimal hand-written PyTorch loop, side by side.

Both train the smoke experiment (derived to `--steps` steps) on a registered mix (default:
`default`, which `make demo` registers), eager and under `torch.compile`:

- ours: `train(plan, lake, run=train-bench-<time>-<mode>-<round>)` with the Iceberg tracker only and one
  checkpoint, at the end. Its step time is the wall-clock cadence of its `train.metrics` rows
  (`created_at` of step s minus step s-1: the whole loop iteration, tracker and reporter
  included); the trainer's own `tokens_per_s` (which stops its clock before the tracker) is
  printed beside it, and the difference is the per-step bookkeeping.
- baseline: the same model (`Transformer(plan.model)`, same seed), the same batches (pre-read from
  `MixLoader` with the trainer's loader settings and held in memory, so it pays nothing for data),
  AdamW on the same `param_groups`, the same micro-batches and accumulation, `clip_grad_norm_`,
  the scheduled lr set per step; each step timed with `perf_counter`, no `.item()` inside.
- baseline + loader (for attribution): the baseline pulling each batch from a live
  `MixLoader` configured as the trainer's, so the loader thread's CPU and any stall show up.

Each variant runs in a fresh spawned process with Inductor's caches disabled, so every compile is
cold and comparable (in one process the second compile reuses the first's kernels). Steady state
skips `--warmup` steps and takes the median step time: other processes may share the 2 cores, and
the median ignores their spikes; `--repeat` runs more rounds in alternating order and keeps each
variant's best round. Warm-up overhead (compilation included) is the warm-up steps' time beyond as
many steady steps, reported apart. MFU is against `measure_matmul_peak()` (fp32, the figure the
trainer logs). The losses at the last step must agree: same init, same data, same arithmetic.

Both compute the loss inside the model (`Transformer(idx, targets=...)`), so under `torch.compile`
forward and loss are one graph; "compiled baseline, loss outside" is the baseline with the loss
taken after the model, outside the graph, as the trainer did before. Goals: ours / baseline >= 0.95
in tokens/s; compiled / eager >= 1.3 for ours.

Two more parts follow the table (or run alone with `--only head` / `--only hash`):
- the LM head + loss at vocabularies 8k, 32k and 128k (`--vocabs`), forward + backward of one
  smoke micro-batch of hidden states: unfused (full fp32 logits), fused
  (`kernels.linear_cross_entropy`) and PyTorch's chunked `F.linear_cross_entropy`, each in a fresh
  process: time and peak memory, as ratios to unfused;
- the replica hash of every parameter (`kernels.tensor_hash.launch_many`, `hash_every=1`) as a
  share of ours' steady step, eager and compiled (goal: under 1 %).
`--fused-loss` trains every variant of the table with the fused loss. Writes its runs (`train-bench-*`: metrics rows, one
checkpoint each) into the lake; `FACTORY_TRACKER_BACKENDS` would override the Iceberg-only tracker.
Not part of the tests. A default run takes about 5 minutes on an idle 2-core machine; on a busy
one, `--threads 1` keeps torch from oversubscribing the cores.

    .venv/bin/python bench/train_bench.py [--home DIR] [--steps 30] [--warmup 5] [--repeat 1]
                                          [--threads N] [--no-compile] [--fused-loss]
                                          [--only train|head|hash] [--vocabs 8192,32768,131072]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor

import torch
import torch._inductor.config as inductor_config
import torch.nn.functional as F
from pyiceberg.expressions import EqualTo

from configs.experiments import experiment
from factory.experiments import plan_experiment
from factory.experiments.spec import Plan
from factory.lake import Lake
from factory.mix import LoaderConfig, MixLoader
from factory.train.config import CheckpointConfig, TrackerConfig
from factory.train.guards import Guards
from factory.train.model import Transformer, flops_per_token, param_groups
from factory.train.perf import measure_matmul_peak, mfu
from factory.train.report import Silent
from factory.train.schedule import lr_at
from factory.train.trackers import METRICS_TABLE, IcebergMetrics
from factory.train.trainer import train


def loader_config(plan: Plan) -> LoaderConfig:
    """The loader settings `train()` uses for this plan (kept in step with trainer.py by hand)."""
    exp = plan.experiment
    return LoaderConfig(global_batch=exp.global_batch, num_shards=exp.loader_shards, seed=exp.seed,
                        num_workers=exp.loader_workers, follow=exp.follow_mix, poll_every=exp.checkpoint.every)


def baseline(plan: Plan, batches: Callable[[], Iterator[torch.Tensor]], loss_outside: bool = False) -> dict:
    """The least a training loop does for the same step; per-step seconds and the last loss.
    `loss_outside`: the model returns logits and the loss is taken after it, outside a compiled
    graph (how the trainer did it before the loss moved into the model)."""
    exp = plan.experiment
    torch.manual_seed(exp.seed)
    model = Transformer(plan.model, fused_loss=exp.fused_loss)
    opt = torch.optim.AdamW(param_groups(model, exp.optimizer), lr=exp.optimizer.lr,
                            betas=exp.optimizer.betas, eps=exp.optimizer.eps)
    net = torch.compile(model) if exp.compile else model
    clip = exp.optimizer.grad_clip or math.inf
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=exp.precision == "bf16")
    times, losses = [], []
    source = batches()
    for step in range(plan.steps):
        t0 = time.perf_counter()
        chunks = next(source).split(exp.micro_batch)
        total = torch.zeros(())
        for chunk in chunks:
            with autocast:
                if loss_outside:
                    logits = net(chunk[:, :-1])
                    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1))
                else:
                    loss = net(chunk[:, :-1], targets=chunk[:, 1:]).mean()
            loss = loss / len(chunks)
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        lr = lr_at(step, plan.steps, exp.optimizer.lr, exp.schedule)
        for group in opt.param_groups:
            group["lr"] = lr * group["lr_scale"]
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        losses.append(total)
    return {"times": times, "loss": losses[-1].item()}


def ours(plan: Plan, lake: Lake, run: str) -> dict:
    """`train()` as the factory runs it; step times from its `train.metrics` rows."""
    started = time.perf_counter()
    result = train(plan, lake, run=run, reporter=Silent())
    wall = time.perf_counter() - started
    rows = lake.table(METRICS_TABLE).scan(row_filter=EqualTo("run", run)).to_arrow().to_pylist()
    by_step: dict[int, dict] = {}
    for r in rows:
        by_step.setdefault(r["step"], {"at": r["created_at"]})[r["name"]] = r["value"]
    steps = [by_step[s] for s in sorted(by_step)]
    assert len(steps) == plan.steps == result.steps, (len(steps), plan.steps, result.steps)
    own = [plan.tokens_per_step / s["tokens_per_s"] for s in steps]  # the trainer's own step clock
    cadence = [own[0]] + [(b["at"] - a["at"]).total_seconds() for a, b in zip(steps, steps[1:])]
    return {"times": cadence, "own": own, "stall": [s["loader_stall"] for s in steps],
            "loss": result.final_loss, "wall": wall}


def steady(times: list[float], warmup: int) -> tuple[float, float, float]:
    """(median steady step seconds, warm-up seconds beyond as many steady steps, interquartile
    range / median of the steady steps: a quiet machine stays near 0.1, a shared one goes past 0.3)."""
    median = statistics.median(times[warmup:])
    q1, _, q3 = statistics.quantiles(times[warmup:], n=4)
    return median, sum(times[:warmup]) - warmup * median, (q3 - q1) / median


def bookkeeping_us(plan: Plan, lake: Lake) -> float:
    """Per-step cost of the trainer's Python bookkeeping alone: guards, metrics dict, tracker row."""
    guards, tracker, n = Guards(plan.experiment.guards), IcebergMetrics(lake, "train-bench-unflushed"), 2000
    started = time.perf_counter()
    for step in range(n):
        loss, grad_norm = torch.tensor(3.0 + 1e-3 * (step % 7)).item(), torch.tensor(1.0).item()
        verdict = guards.judge(loss, grad_norm)
        tracker.log_metrics(step, {"loss": loss, "grad_norm": grad_norm, "lr": 1e-3, "tokens_per_s": 1e4,
                                   "mfu": mfu(1e4, 1e7, 1e11), "loader_stall": 0.0,
                                   "skipped": float(not verdict.apply_update)})
    return 1e6 * (time.perf_counter() - started) / n  # never flushed: nothing reaches the lake


def make_plan(lake: Lake, opts: dict, compile: bool) -> Plan:
    """The experiment derived to `steps` steps, one checkpoint (at the end), the Iceberg tracker only."""
    steps = opts["steps"]
    exp = experiment(opts["experiment"]).derive(
        steps=steps, checkpoint=CheckpointConfig(every=steps, keep_last=1), tracker=TrackerConfig(backends=["iceberg"]),
        compile=compile, fused_loss=opts["fused_loss"], **({"mix": opts["mix"]} if opts["mix"] else {}))
    return plan_experiment(lake, exp)


def variant(kind: str, compile: bool, opts: dict, batches: list[torch.Tensor], run: str) -> dict:
    """One measurement, in a fresh process (see `main`)."""
    warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
    if opts["threads"]:
        torch.set_num_threads(opts["threads"])
    inductor_config.force_disable_caches = True  # every compile cold, so compile times compare
    lake = Lake.open(home=opts["home"])
    plan = make_plan(lake, opts, compile)
    if kind == "ours":
        return ours(plan, lake, run)
    if kind in ("baseline", "baseline, loss outside"):
        return baseline(plan, lambda: iter(batches), loss_outside=kind != "baseline")

    def live() -> Iterator[torch.Tensor]:
        with MixLoader(lake, plan.mix_version, loader_config(plan)) as loader:
            for _ in range(plan.steps):
                yield loader.next_batch().tokens

    return baseline(plan, live)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", default=None, help="FACTORY_HOME (default: $FACTORY_HOME or ./.factory)")
    parser.add_argument("--experiment", default="smoke", help="a single-process experiment in configs/experiments")
    parser.add_argument("--mix", default=None, help="override the experiment's mix (default: its own, `default`)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the steady state")
    parser.add_argument("--repeat", type=int, default=1, help="rounds, alternating order; best round wins")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile pair")
    parser.add_argument("--fused-loss", action="store_true", help="train every variant with the fused head + loss")
    parser.add_argument("--only", choices=("train", "head", "hash"), default=None,
                        help="one part: the training loops, the LM head + loss at three vocabularies, the hash cost")
    parser.add_argument("--vocabs", default="8192,32768,131072", help="vocabulary sizes of the head benchmark")
    args = parser.parse_args()
    if args.steps <= args.warmup + 2:
        parser.error("--steps must exceed --warmup by at least 3")
    if args.threads:
        torch.set_num_threads(args.threads)
    opts = {"home": args.home, "experiment": args.experiment, "mix": args.mix, "steps": args.steps,
            "threads": args.threads, "fused_loss": args.fused_loss}
    if args.only == "head":
        return head_report(opts, [int(v) for v in args.vocabs.split(",")])

    lake = Lake.open(home=args.home)
    plan = make_plan(lake, opts, compile=False)
    exp = plan.experiment
    flops, peak = flops_per_token(plan.model, plan.seq_len), measure_matmul_peak()
    print(f"{exp.name} on {plan.mix_version}: {plan.steps} steps x {plan.tokens_per_step:,} tokens "
          f"({exp.global_batch} x {plan.seq_len}, micro-batch {exp.micro_batch}, accum {plan.grad_accum}), "
          f"{plan.parameters / 1e6:.2f} M params, {flops / 1e6:.1f} MFLOP/token")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores; "
          f"fp32 matmul peak {peak / 1e9:.1f} GFLOP/s; steady = median of steps {args.warmup + 1}-{plan.steps}")
    if args.only == "hash":
        return hash_report(plan, opts)
    with MixLoader(lake, plan.mix_version, loader_config(plan)) as loader:  # the trainer's exact batches
        batches = [loader.next_batch().tokens for _ in range(plan.steps)]

    # Each variant runs in a fresh spawned process: compile caches, allocator and thread pools
    # start equal (in one process the second compile reuses the first's kernels: ~10x faster).
    modes = ["eager"] + ([] if args.no_compile else ["compiled"])
    variants = [(mode, kind) for mode in modes for kind in ("baseline", "ours", "baseline+loader")]
    variants += [("compiled", "baseline, loss outside")] if "compiled" in modes else []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: dict[str, list[dict]] = {}
    for r in range(args.repeat):
        for mode, kind in (variants if r % 2 == 0 else variants[::-1]):
            name = f"{mode} {kind}"
            print(f"  round {r + 1}: {name} ...", flush=True)
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                out = pool.submit(variant, kind, mode == "compiled", opts, batches,
                                  f"train-bench-{stamp}-{mode}-{r}").result()
            out["median"], out["overhead"], out["spread"] = steady(out["times"], args.warmup)
            results.setdefault(name, []).append(out)
    best = {name: min(runs, key=lambda o: o["median"]) for name, runs in results.items()}
    report(best, results, plan, args.warmup, flops, peak, bookkeeping_us(plan, lake))
    if args.only != "train":
        hash_report(plan, opts, {mode: best[f"{mode} ours"]["median"] for mode in modes})
        head_report(opts, [int(v) for v in args.vocabs.split(",")])


def report(best: dict, results: dict, plan: Plan, warmup: int, flops: float, peak: float, bookkeeping: float) -> None:
    tps = {name: plan.tokens_per_step / o["median"] for name, o in best.items()}
    print(f"\n{'':24s} {'tokens/s':>9s} {'ms/step':>8s} {'IQR/med':>7s} {'MFU':>6s} {'warm-up+compile s':>18s} "
          f"{'loss@' + str(plan.steps):>9s}  rounds (tokens/s)")
    for name, o in best.items():
        rounds = " ".join(f"{plan.tokens_per_step / x['median']:,.0f}" for x in results[name])
        print(f"{name:24s} {tps[name]:>9,.0f} {1000 * o['median']:>8.0f} {o['spread']:>7.2f} "
              f"{100 * mfu(tps[name], flops, peak):>5.1f}% {o['overhead']:>18.1f} {o['loss']:>9.4f}  {rounds}")
    noisy = [name for name, o in best.items() if o["spread"] > 0.3]
    if noisy:
        print(f"WARNING: step times scattered (IQR/median > 0.3) in {', '.join(noisy)}: other load on the machine; "
              "rerun with --repeat 2 (and --threads 1 on a shared machine)")
    print()
    modes = [m for m in ("eager", "compiled") if f"{m} ours" in tps]
    for mode in modes:
        gap = abs(best[f"{mode} ours"]["loss"] - best[f"{mode} baseline"]["loss"])
        print(f"ratio ours/baseline, {mode}: {tps[f'{mode} ours'] / tps[f'{mode} baseline']:.3f}   (goal >= 0.95); "
              f"last losses {'identical' if gap == 0 else f'differ by {gap:.2e}'}")
    if "compiled" in modes:
        print(f"compiled/eager: ours {tps['compiled ours'] / tps['eager ours']:.2f}x, "
              f"baseline {tps['compiled baseline'] / tps['eager baseline']:.2f}x   (goal >= 1.3)")
        print(f"loss compiled with the model / loss outside the graph (compiled baselines): "
              f"{tps['compiled baseline'] / tps['compiled baseline, loss outside']:.2f}x")

    print("\nwhere ours differs:")
    for mode in modes:
        o, loader = best[f"{mode} ours"], tps[f"{mode} baseline+loader"]
        own = statistics.median(o["own"][warmup:])
        print(f"  {mode}: loader thread + stall (baseline+loader / baseline) {loader / tps[f'{mode} baseline']:.3f}; "
              f"the rest of the loop (ours / baseline+loader) {tps[f'{mode} ours'] / loader:.3f}")
        print(f"    loader_stall median {100 * statistics.median(o['stall'][warmup:]):.2f}% of a step; "
              f"tracker + reporter (metrics cadence - trainer's own clock) {1000 * (o['median'] - own):.1f} ms/step")
        print(f"    train() wall {o['wall']:.1f} s, outside the steps (start-up, peak, checkpoint, finish) "
              f"{o['wall'] - sum(o['times']):.1f} s; first batch waited {o['stall'][0] * o['own'][0]:.1f} s")
    print(f"  guards + metrics dict + tracker row, timed alone: {bookkeeping:.0f} us/step")

HEADS = ("unfused", "fused", "torch chunked")


def head_variant(kind: str, vocab: int, tokens: int, d_model: int, threads: int | None, reps: int = 3) -> dict:
    """One LM head + loss, forward and backward over `tokens` hidden states, in a fresh process:
    median seconds, and peak resident memory beyond the inputs (the kernel's high-water mark,
    reset once the inputs exist: logits, their gradient, the parameter gradients). The parent
    sets MALLOC_MMAP_THRESHOLD_ so every large buffer is mapped and unmapped on its own: resident
    memory then follows the live tensors, not glibc's retained heap.
    - unfused: `F.linear` to fp32 logits [tokens, vocab], then `F.cross_entropy` (the model's
      unfused path);
    - fused: `kernels.linear_cross_entropy.launch` (on CPU the chunked PyTorch path, fp32 sums);
    - torch chunked: PyTorch's own `F.linear_cross_entropy` with `LinearCrossEntropyOptions`
      (token chunks, fp32 accumulation, "accurate" policy: the fast one on CPU), for comparison."""
    from kernels import linear_cross_entropy as lce

    if threads:
        torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, d_model, generator=g).requires_grad_()
    w = (0.02 * torch.randn(vocab, d_model, generator=g)).requires_grad_()
    t = torch.randint(0, vocab, (tokens,), generator=g)
    options = torch.nn.LinearCrossEntropyOptions(acc_policy="accurate")
    step = {"unfused": lambda: lce.reference(h, w, t).mean(), "fused": lambda: lce.launch(h, w, t).mean(),
            "torch chunked": lambda: F.linear_cross_entropy(h, w, t, options=options)}[kind]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size (Linux >= 4.0)
    before = _status_kib("VmRSS")
    times = []
    for _ in range(reps + 1):  # the first is warm-up (allocator, thread pool)
        t0 = time.perf_counter()
        loss = step()
        loss.backward()
        times.append(time.perf_counter() - t0)
        h.grad = w.grad = None
    return {"seconds": statistics.median(times[1:]), "extra": 1024 * (_status_kib("VmHWM") - before), "loss": loss.item()}


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def head_report(opts: dict, vocabs: list[int]) -> None:
    """The fused head + loss against the unfused one (and PyTorch's chunked op) at each vocabulary,
    at the smoke experiment's micro-batch (8 x 255 tokens, d_model 128)."""
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # read by the spawned processes' malloc: see head_variant
    smoke = experiment("smoke")
    tokens, d_model = smoke.micro_batch * (smoke.model.max_seq_len - 1), smoke.model.d_model
    print(f"\nLM head + cross-entropy, forward + backward of {tokens:,} tokens at d_model {d_model} (fp32 inputs); "
          "each in a fresh process, median of 3")
    print(f"{'vocab':>8s} {'variant':>14s} {'ms':>8s} {'peak MiB':>9s} {'speed vs unfused':>17s} "
          f"{'memory vs unfused':>18s} {'loss':>8s}")
    for vocab in vocabs:
        rows = {}
        for kind in HEADS:
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                rows[kind] = pool.submit(head_variant, kind, vocab, tokens, d_model, opts["threads"]).result()
        base = rows["unfused"]
        for kind, r in rows.items():
            print(f"{vocab:>8,d} {kind:>14s} {1e3 * r['seconds']:>8.1f} {r['extra'] / 2**20:>9.1f} "
                  f"{base['seconds'] / r['seconds']:>16.2f}x {r['extra'] / base['extra']:>17.2f}x {r['loss']:>8.4f}")


def hash_report(plan: Plan, opts: dict, step_seconds: dict[str, float] | None = None) -> None:
    """The replica hash of every parameter (`kernels.tensor_hash.launch_many`, what the replica
    checker runs at hash_every=1) against a step: the trainer's steady step times when given, else
    a hand-timed step (`bench/hash_bench.py`)."""
    from hash_bench import hash_cost, step_seconds as measure_step  # bench/ is on sys.path as the script's directory

    model = Transformer(plan.model)
    steps = step_seconds or {"eager (hand-timed)": measure_step(model, 6)}
    print(f"\nreplica hash of all {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters "
          f"({len(list(model.parameters()))} tensors), every step:")
    for mode, seconds in steps.items():
        c = hash_cost(model, seconds)
        print(f"  {mode}: {c['current_s'] * 1e3:.2f} ms per check, {100 * c['current_s'] / seconds:.2f} % of a "
              f"{seconds * 1e3:.0f} ms step (goal < 1 %)")


if __name__ == "__main__":
    main()
