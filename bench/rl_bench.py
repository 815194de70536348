"""RL throughput and learning on this machine, each against a baseline measured in the same script:

- rollout tokens/s: the vLLM actor's groups (completion tokens / wall time), beside transformers'
  `generate` on the same prompts (the reference engine);
- reward scoring: toy checks through the task engine (Ray workers, Iceberg commits) against the same
  checks as bare sandbox executions (`Sandbox.map_checked`), executions/s and the ratio;
- the weight sync's share of a step (push + digests + log-prob probe, from a sync run);
- async against sync: the wall time of the same number of updates (and samples) in each mode, ratio;
- the toy curriculum's reward curve over `--seeds` seeds (sync mode): first and last 20 % means.

Needs a trained checkpoint: by default the demo's (`make demo` trains smoke), on the demo home.

    .venv/bin/python bench/rl_bench.py [--home .factory] [--start ckpt/smoke@120] [--steps 24] [--seeds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from factory.infer.engine import EngineConfig, TransformersEngine  # noqa: E402
from factory.infer.export import export_checkpoint  # noqa: E402
from factory.lake import Lake  # noqa: E402
from factory.posttrain.rl import RLConfig, run_rl  # noqa: E402
from factory.posttrain.rl.components import CHECK_SANDBOX, toy_reward  # noqa: E402
from factory.posttrain.rl.config import OptimConfig, RolloutConfig, start_checkpoint  # noqa: E402
from factory.posttrain.rl.loop import open_scorer  # noqa: E402
from factory.posttrain.rl.rollout import VLLMActor  # noqa: E402
from factory.posttrain.rl.toy import curriculum  # noqa: E402
from factory.sandbox import Sandbox, checked_program  # noqa: E402
from factory.tasks.engine import AttemptRequest  # noqa: E402
from factory.train.report import Reporter  # noqa: E402

TOY = RolloutConfig(prompts_per_step=8, group_size=4, max_tokens=1)


class Quiet(Reporter):
    def log(self, message: str) -> None:
        pass


def rollout_rates(lake: Lake, start, n_groups: int = 16) -> None:
    export = export_checkpoint(lake, start)
    tasks = [t for t in toy_reward(None, lake).tasks][:n_groups]
    config = RolloutConfig(prompts_per_step=len(tasks), group_size=8, max_tokens=16, stop=())
    actor = VLLMActor(export, EngineConfig(kind="vllm", dtype="float32"))
    actor.generate(tasks, config, seed=0)  # warm
    t0 = time.perf_counter()
    rollouts = actor.generate(tasks, config, seed=1)
    vllm_s = time.perf_counter() - t0
    tokens = sum(len(r.completion_ids) for r in rollouts)
    prompts = [actor.prompt_ids(t, config.max_tokens) for t in tasks]
    actor.close()
    from factory.infer.engine import SamplingConfig

    reference = TransformersEngine(export, EngineConfig(kind="transformers"))
    t0 = time.perf_counter()
    outs = reference.generate(prompts, SamplingConfig(max_tokens=16, temperature=1.0, n=8, seed=1))
    ref_s = time.perf_counter() - t0
    ref_tokens = sum(len(s.token_ids) for o in outs for s in o)
    print(f"rollouts: vLLM {tokens / vllm_s:,.0f} tok/s ({len(rollouts)} completions, {tokens} tokens in {vllm_s:.2f} s); "
          f"transformers generate {ref_tokens / ref_s:,.0f} tok/s: {tokens / vllm_s / (ref_tokens / ref_s):.1f}x")


def scoring_rates(lake: Lake, start, n: int = 64) -> None:
    tasks = curriculum()
    # n distinct checks: int tasks with different literals, so every attempt key is new
    checks = [(tasks[i % 3], f" {i}") for i in range(n)]
    sandbox = Sandbox(CHECK_SANDBOX.model_copy(update={"workers": 2}))
    sandbox.map_checked([checked_program(tasks[0].prompt + " 1\n", test=tasks[0].test, entry_point=tasks[0].entry_point)])
    t0 = time.perf_counter()
    verdicts = sandbox.map_checked([checked_program(t.prompt + c + "\n", test=t.test, entry_point=t.entry_point)
                                    for t, c in checks])
    bare = n / (time.perf_counter() - t0)
    config = RLConfig(name="bench-score", start=start.ref.checkpoint_id, reward="toy", steps=1,
                      rollout=RolloutConfig(prompts_per_step=n, group_size=2))
    with open_scorer(config, toy_reward(config, lake), lake) as scorer:
        scorer.run([AttemptRequest(task_id=tasks[0].task_id, candidate=f" -{time.time_ns()}")])  # warm the workers
        t0 = time.perf_counter()
        results = scorer.run([AttemptRequest(task_id=t.task_id, candidate=f"{c}  # {time.time_ns()}") for t, c in checks])
        engine = n / (time.perf_counter() - t0)
    assert sum(v.passed for v in verdicts) == sum(r.reward for r in results) == n
    print(f"scoring: task engine {engine:.1f} checks/s, bare sandbox {bare:.1f} checks/s: {engine / bare:.2f}x")


def modes(lake: Lake, start, steps: int) -> None:
    walls = {}
    base = RLConfig(name="bench-sync", start=start.ref.checkpoint_id, reward="toy", steps=steps, rollout=TOY,
                    checkpoint_every=steps, optimizer=OptimConfig(lr=3e-3))
    with open_scorer(base, toy_reward(base, lake), lake) as scorer:
        for mode in ("sync", "async"):
            name = f"bench-{mode}-{time.time_ns() % 10**8}"
            config = RLConfig.model_validate({**base.model_dump(), "name": name, "mode": mode, "max_staleness": 1})
            t0 = time.perf_counter()
            result = run_rl(config, lake, scorer=scorer, reporter=Quiet())
            walls[mode] = time.perf_counter() - t0
            print(f"{mode}: {steps} updates of {TOY.prompts_per_step * TOY.group_size} samples in {walls[mode]:.1f} s; "
                  f"sync {100 * result.sync_share:.1f}% of the step; dropped batches {result.dropped_batches}")
    print(f"async vs sync wall time: {walls['sync'] / walls['async']:.2f}x faster")


def curves(lake: Lake, start, steps: int, seeds: int) -> None:
    gains = []
    base = RLConfig(name="bench-curve", start=start.ref.checkpoint_id, reward="toy", steps=steps, rollout=TOY,
                    optimizer=OptimConfig(lr=3e-3))
    with open_scorer(base, toy_reward(base, lake), lake) as scorer:
        for seed in range(seeds):
            config = RLConfig.model_validate({**base.model_dump(), "name": f"bench-curve-{seed}-{time.time_ns() % 10**8}",
                                              "seed": seed, "checkpoint_every": steps})
            result = run_rl(config, lake, scorer=scorer, reporter=Quiet())
            cut = max(1, len(result.rewards) // 5)
            first, last = statistics.mean(result.rewards[:cut]), statistics.mean(result.rewards[-cut:])
            gains.append(last - first)
            print(f"seed {seed}: first 20% {first:.3f} -> last 20% {last:.3f} "
                  f"({result.seconds:.0f} s): {' '.join(f'{r:.2f}' for r in result.rewards)}")
    spread = statistics.stdev(gains) if len(gains) > 1 else 0.0
    print(f"gain over {seeds} seeds: mean {statistics.mean(gains):.3f}, std {spread:.3f}, min {min(gains):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", default=str(REPO / ".factory"))
    parser.add_argument("--start", default="ckpt/smoke@120")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--only", choices=["rollouts", "scoring", "modes", "curves"])
    args = parser.parse_args()
    lake = Lake.open(home=args.home)
    start = start_checkpoint(RLConfig(name="bench", start=args.start, reward="toy", steps=1), lake)
    print(f"start: {start.ref.checkpoint_id}")
    for name, run in (("rollouts", lambda: rollout_rates(lake, start)), ("scoring", lambda: scoring_rates(lake, start)),
                      ("modes", lambda: modes(lake, start, args.steps)),
                      ("curves", lambda: curves(lake, start, args.steps, args.seeds))):
        if args.only in (None, name):
            run()


if __name__ == "__main__":
    main()
