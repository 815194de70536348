"""Inference and sandbox throughput: vLLM against transformers, the sandbox against bare subprocesses.

Measures, side by side in one process, on one exported model — the lake's newest checkpoint exported
with `export_checkpoint` (an unchanged checkpoint finds its existing export), or, when the lake has no
checkpoint, a randomly initialised smoke-size model written in the export's format to a temp dir:

1. generation: `--prompts` HumanEval prompts (the eval's ids: eos + prompt without its last newline,
   their end fitted into the context with `engine.fit`), greedy, at most `--new-tokens` new tokens and
   no stop strings, so only eos ends a sample early; tokens/s counts the tokens actually generated.
   - vLLM: `open_engine(export, EngineConfig(kind="vllm"))` — our engine;
   - transformers, engine: `TransformersEngine.generate` — the reference as the evals use it, one
     prompt at a time;
   - transformers, batched: `LlamaForCausalLM.generate` on all prompts at once, left-padded — the
     fair baseline (what a user of transformers alone would write).
2. scoring: `engine.logprobs` on `--windows` windows of `max_score_len` tokens cut from HumanEval
   prompts + canonical solutions, in tokens scored/s: vLLM, the reference engine (one forward per
   window), and one batched forward. Greedy ids and log-probs are compared as a sanity check (fp32:
   they should agree).
3. sandbox: `Sandbox(SandboxConfig(workers=W)).map_checked` on `--programs` canonical-solution check
   programs (`humaneval.program`, checked.py's harness), executions/s for each W, against the same
   programs run unsandboxed with `subprocess.run([sys.executable, "-c", text], input=nonce)` one after
   another. Every canonical solution must pass. Each W runs twice, rounds interleaved: hardened (the
   default: seccomp filter, inode-capped /tmp and /dev/shm, trimmed /sys and /proc) and with
   `harden=False` (the sandbox before issue 15), and the ratio hardened / unhardened is printed
   (issue 15 allows a 10 % cost). `--sandbox-only` runs just this part, without a lake or model.

Order: sandbox, then transformers, then vLLM — vLLM's CPU worker turns `torch.set_num_threads` into
a no-op for the rest of the process when it starts, so nothing else is timed after it. Each timing is the best of `--repeat` rounds after a
warm-up (all rounds printed); the load average is printed at both ends: on a shared 2-core machine
rerun when it is above ~1. With other processes on the cores, torch's two OpenMP threads wait on each
other (a forward measured 10x slower than with one thread), and one thread gets about all the matmul
throughput two do: hence `--threads 1` by default, for both engines.
Not part of the tests; a default run takes about 1.5 minutes.

    .venv/bin/python bench/infer_bench.py --home /tmp/evhome [--prompts 32] [--new-tokens 64] [--windows 32]
                                          [--programs 100] [--workers 1,2] [--repeat 2] [--threads 1]
                                          [--skip-vllm] [--skip-sandbox] [--sandbox-only]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from configs.experiments import experiment
from factory.evals import humaneval
from factory.home import artifacts_dir
from factory.infer import EngineConfig, ExportRef, SamplingConfig, close_engines, export_checkpoint, find_export
from factory.infer.engine import TransformersEngine
from factory.infer.export import _write
from factory.lake import Lake
from factory.train.checkpoint import checkpoints
from factory.train.model import Transformer


def timed(fn, repeat: int) -> tuple[float, object, list[float]]:
    """(best seconds, that round's result, every round's seconds)."""
    rounds = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        rounds.append((time.perf_counter() - t0, out))
    best = min(rounds, key=lambda r: r[0])
    return best[0], best[1], [r[0] for r in rounds]


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def model_export(lake: Lake, scratch: Path) -> ExportRef:
    """The newest checkpoint's export, else a random smoke-size model in the export's format."""
    rows = checkpoints(lake)
    if rows:
        return export_checkpoint(lake, max(rows, key=lambda r: r["created_at"])["checkpoint_id"])
    tokenizers = sorted((artifacts_dir(lake.home) / "tokenizers").glob("*/tokenizer.json"),
                        key=lambda p: p.stat().st_mtime)
    if not tokenizers:
        raise SystemExit(f"{lake.home}: no checkpoint and no tokenizer (run `make demo`, or pass --home)")
    from factory.tokenize import load_tokenizer

    tok_dir = tokenizers[-1].parent
    config = experiment("smoke").model.model_copy(
        update={"vocab_size": max(8192, load_tokenizer(str(tok_dir)).get_vocab_size())})
    torch.manual_seed(0)
    # `_write` reads only these fields of a TrainedCheckpoint: the same files as a real export.
    fake = SimpleNamespace(tokenizer_path=str(tok_dir), checkpoint_id="ckpt/random-init@0",
                           ref=SimpleNamespace(sha256="0" * 64),
                           plan=SimpleNamespace(mix_version="none", tokenizer=f"tokenizer/{tok_dir.name}",
                                                seq_len=config.max_seq_len, experiment=SimpleNamespace(name="smoke")))
    _write(scratch, Transformer(config).eval(), fake)
    return find_export(lake, str(scratch))


def score_windows(engine, count: int) -> list[list[int]]:
    """`count` windows of `max_score_len` tokens from HumanEval prompts + solutions, eos-separated."""
    eos, n, flat = engine.tokenizer.eos_token_id, engine.max_score_len, []
    for p in humaneval.problems():
        flat += [eos, *engine.encode(p["prompt"] + p["canonical_solution"])]
        if len(flat) >= n * count:
            break
    return [flat[i * n:(i + 1) * n] for i in range(min(count, len(flat) // n))]


@torch.no_grad()
def batched_generate(engine: TransformersEngine, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """All prompts in one left-padded `generate`; each row's new ids up to and including eos."""
    pad, eos, width = engine.tokenizer.pad_token_id, engine.tokenizer.eos_token_id, max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = engine.model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                temperature=None, top_p=None, top_k=None, pad_token_id=pad, eos_token_id=eos)
    rows = out[:, width:].tolist()
    return [r[:r.index(eos) + 1] if eos in r else r for r in rows]


@torch.no_grad()
def batched_logprobs(engine: TransformersEngine, windows: list[list[int]], chunk: int = 8) -> list[list[float]]:
    out = []
    for i in range(0, len(windows), chunk):
        ids = torch.tensor(windows[i:i + chunk])
        lp = torch.log_softmax(engine.model(ids).logits.float(), -1)
        out += lp[:, :-1].gather(2, ids[:, 1:, None])[..., 0].tolist()
    return out


def bench_engine(name: str, gen, score, prompts, windows, sampling, repeat: int, results: dict) -> None:
    gen(prompts[:2], sampling.model_copy(update={"max_tokens": 4}))  # warm-up
    score(windows[:2])
    s, ids, rounds = timed(lambda: gen(prompts, sampling), repeat)
    results[f"generate {name}"] = (sum(map(len, ids)) / s, rounds, ids)
    s, lps, rounds = timed(lambda: score(windows), repeat)
    results[f"score {name}"] = (sum(map(len, lps)) / s, rounds, lps)
    print(f"  {name}: done ({load()}, torch threads {torch.get_num_threads()}, "
          f"affinity {sorted(os.sched_getaffinity(0))})", flush=True)


def bench_sandbox(programs: list, workers: list[int], repeat: int, results: dict) -> None:
    from factory.sandbox import Sandbox, SandboxConfig
    from factory.sandbox.checked import MARKER

    def bare() -> list[bool]:  # the same checked programs, nonce on stdin, pass = the marker at the end
        done = [subprocess.run([sys.executable, "-c", p.text], input=p.stdin, capture_output=True, text=True, timeout=60)
                for p in programs]
        return [d.returncode == 0 and d.stdout.endswith(f"\n{MARKER} {p.nonce}\n") for d, p in zip(done, programs)]

    s, ok, rounds = timed(bare, repeat)
    results["sandbox bare"] = (len(programs) / s, rounds, ok)
    for w in workers:
        # hardened (seccomp, inode-capped scratch, trimmed /sys and /proc) and the older sandbox
        # (harden=False), their rounds interleaved so a neighbour's burst of load hits both alike
        boxes = {f"sandbox W={w}": Sandbox(SandboxConfig(workers=w)),  # construction probes: not timed
                 f"sandbox W={w} unhardened": Sandbox(SandboxConfig(workers=w, harden=False))}
        best: dict[str, tuple[float, object]] = {}
        spent: dict[str, list[float]] = {name: [] for name in boxes}
        for _ in range(repeat):
            for name, box in boxes.items():
                s, out, _ = timed(lambda: [v.passed for v in box.map_checked(programs)], 1)
                spent[name].append(s)
                if name not in best or s < best[name][0]:
                    best[name] = (s, out)
        for name, (s, out) in best.items():
            results[name] = (len(programs) / s, spent[name], out)
        print(f"  sandbox W={w}: done ({load()})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", default=None, help="FACTORY_HOME (default: $FACTORY_HOME or ./.factory)")
    parser.add_argument("--prompts", type=int, default=32, help="HumanEval prompts to generate from")
    parser.add_argument("--new-tokens", type=int, default=64, help="new tokens per prompt at most (greedy)")
    parser.add_argument("--windows", type=int, default=32, help="full-context windows to score")
    parser.add_argument("--programs", type=int, default=100, help="canonical-solution programs to run")
    parser.add_argument("--workers", default="1,2", help="sandbox widths, comma-separated")
    parser.add_argument("--repeat", type=int, default=2, help="rounds per timing; the best is kept")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both engines (0 = torch's default)")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--skip-sandbox", action="store_true")
    parser.add_argument("--sandbox-only", action="store_true", help="only the sandbox part (no lake, no model)")
    args = parser.parse_args()
    if args.home:
        os.environ["FACTORY_HOME"] = str(Path(args.home).resolve())  # vLLM's caches go under the same home
    start_load = os.getloadavg()[0]
    if args.threads:
        torch.set_num_threads(args.threads)  # vLLM runs in this process: its model uses the same threads
    print(f"start: {load()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads",
          flush=True)
    results: dict[str, tuple[float, list[float], object]] = {}

    if not args.skip_sandbox:
        chosen = humaneval.problems()[:args.programs]
        bench_sandbox([humaneval.program(p, p["canonical_solution"]) for p in chosen],
                      [int(w) for w in args.workers.split(",")], args.repeat, results)
    if args.sandbox_only:
        print(f"\n=== summary ({load()}; at start {start_load:.2f}) ===")
        report_sandbox(results, with_rates=True)
        return

    lake = Lake.open(home=args.home)
    with tempfile.TemporaryDirectory(prefix="infer-bench-") as scratch:
        export = model_export(lake, Path(scratch))
        ref = TransformersEngine(export, EngineConfig(kind="transformers"))
        cfg, params = ref.model.config, sum(p.numel() for p in ref.model.parameters())
        model = (f"model: {export.export_id} ({export.path}): {params / 1e6:.2f} M params, vocab {cfg.vocab_size}, "
                 f"context {ref.max_len}, d_model {cfg.hidden_size}, {cfg.num_hidden_layers} layers, fp32")
        print(model, flush=True)
        prompts = [ref.fit(ref.document_ids(p["prompt"].removesuffix("\n")),
                           args.new_tokens) for p in humaneval.problems()[:args.prompts]]
        windows = score_windows(ref, args.windows)
        sampling = SamplingConfig(max_tokens=args.new_tokens, temperature=0.0)

        def engine_gen(engine):
            return lambda ps, sp: [out[0].token_ids for out in engine.generate(ps, sp)]

        bench_engine("transformers batched", lambda ps, sp: batched_generate(ref, ps, sp.max_tokens),
                     lambda ws: batched_logprobs(ref, ws), prompts, windows, sampling, args.repeat, results)
        bench_engine("transformers engine", engine_gen(ref), ref.logprobs, prompts, windows, sampling,
                     args.repeat, results)
        if not args.skip_vllm:
            from factory.infer import open_engine

            t0 = time.perf_counter()
            vllm = open_engine(export, EngineConfig(kind="vllm"))
            results["vllm start"] = (time.perf_counter() - t0, [], None)
            bench_engine("vllm", engine_gen(vllm), vllm.logprobs, prompts, windows, sampling, args.repeat, results)
            close_engines()
    report(results, args, model, len(prompts), len(windows), start_load)


def report(results: dict, args, model: str, n_prompts: int, n_windows: int, start_load: float) -> None:
    print(f"\n=== summary ({load()}; at start {start_load:.2f}; torch threads {args.threads or 'default'}) ===")
    if start_load > 1.0 or os.getloadavg()[0] > 2.0:  # this run alone keeps about one core busy
        print("WARNING: other processes share the cores (see the load averages): ratios are noisy, rerun when idle")
    rate = {k: v[0] for k, v in results.items()}
    units = {"generate": "tokens/s", "score": "tokens scored/s", "sandbox": "programs/s"}
    for name, (value, rounds, _) in results.items():
        if name != "vllm start":
            print(f"{name:28s} {value:>10,.1f} {units[name.split()[0]]:16s} rounds (s): "
                  + " ".join(f"{r:.2f}" for r in rounds))
    if "vllm start" in rate:
        print(f"{'vllm start (import+engine)':28s} {rate['vllm start']:>10.1f} s")
    print(f"\n{model}\ngeneration: {n_prompts} prompts x <= {args.new_tokens} new tokens, greedy; "
          f"scoring: {n_windows} windows")
    for kind in ("generate", "score"):
        base = rate[f"{kind} transformers batched"]
        line = f"  {kind}: transformers engine / batched {rate[f'{kind} transformers engine'] / base:.2f}x"
        if f"{kind} vllm" in rate:
            line += (f"; vLLM / transformers batched {rate[f'{kind} vllm'] / base:.2f}x, "
                     f"vLLM / transformers engine {rate[f'{kind} vllm'] / rate[f'{kind} transformers engine']:.2f}x")
        print(line)
    gen = {k: results[f"generate {k}"][2] for k in ("transformers batched", "transformers engine", "vllm")
           if f"generate {k}" in results}
    ref = gen["transformers engine"]
    print("  tokens generated: " + ", ".join(f"{k} {sum(map(len, ids))}" for k, ids in gen.items())
          + f" (of {n_prompts * args.new_tokens} at most)")
    for k, ids in gen.items():
        if k != "transformers engine":
            same = sum(a == b for a, b in zip(ids, ref))
            print(f"  greedy ids {k} == transformers engine: {same}/{len(ref)} prompts")
    if "score vllm" in results:
        diff = max(abs(a - b) for x, y in zip(results["score vllm"][2], results["score transformers engine"][2])
                   for a, b in zip(x, y))
        print(f"  logprobs max |vLLM - transformers engine|: {diff:.2e}")
    report_sandbox(results)


def report_sandbox(results: dict, *, with_rates: bool = False) -> None:
    """Sandbox lines (`with_rates`: the rates too, which report() lists otherwise): each against bare
    subprocesses, and hardened against unhardened."""
    if "sandbox bare" not in results:
        return
    rate = {k: v[0] for k, v in results.items() if k.startswith("sandbox")}
    if with_rates:
        for name, (value, rounds, _) in results.items():
            print(f"{name:28s} {value:>10,.1f} programs/s       rounds (s): " + " ".join(f"{r:.2f}" for r in rounds))
    passed = {k: sum(results[k][2]) for k in rate}
    n = len(results["sandbox bare"][2])
    for k in passed:
        if k != "sandbox bare":
            print(f"  {k} / bare sequential: {rate[k] / rate['sandbox bare']:.2f}x")
    for k in passed:
        if f"{k} unhardened" in rate:  # the hardening's cost; issue 15 allows 10 %
            print(f"  {k} hardened / unhardened: {rate[k] / rate[f'{k} unhardened']:.3f}x")
    print("  canonical solutions passed: " + ", ".join(f"{k.removeprefix('sandbox ')} {v}/{n}" for k, v in passed.items()))
    assert all(v == n for v in passed.values()), f"a canonical solution failed: {passed}"


if __name__ == "__main__":
    main()
