"""Does the auto-mixer find what is there? RegMix end to end on a designed case, then on the real corpus.

Designed case (default): the answer is known.
1. build `junk.repeated_line` (training documents of the default mix's sources reduced to their
   first line, repeated to the document's length, `factory.data.junk`; idempotent) and
   register mix `default_with_junk` over it;
2. run the `automix_junk` sweep (`configs/sweeps/automix_junk.py`: tiny proxies on Dirichlet weights
   of the four tables, each scored on held-out bits per byte of the three *real* sources only,
   suite `heldout_default`) with `factory sweep run`'s machinery (`run_sweep`, no Dagster);
3. fit and propose (`propose_from_sweep`: sweeps.results, Scheffé quadratic ridge fit, Dirichlet
   search; registered as `mix/automix_junk@vN`);
4. train the proposal and the uniform mix (junk at 1/4) at 3 seeds each — a grid sweep over
   `mix_weights` x `seed` on the proxy's config, so the fit's predictions are for these very runs —
   and print per seed uniform vs proposal, mean and spread, the ratio proposal / uniform, and whether
   the proposal beats uniform by more than the seed spread (spread = max - min over seeds; "beats"
   = the gap of the means exceeds both arms' spreads).

`--junk reversed_words`: the same with a second junk kind, the sources' documents with their words
in reverse order (mix `default_with_reversed_words`, sweep `automix_reversed`).

`--case code`: the plainest designed case, one real source (`refined.site_packages`) plus the same
junk (mix `code_with_junk`, sweep `automix_junk_code`: 8 proxies of 120 steps on the first 512
tokens of each document, scored by suite `heldout_code`), where the uniform mix is half junk.

`--real`: the same on the real corpus (`automix_cheap`: the default mix's three sources, more and
cheaper proxies than `automix`'s 16 of 60 steps, scored on `heldout`), reported as it comes out.

The baseline (uniform) is measured in the same run. Cells already trained and evaluated are not
trained again (their run names are their configs' hashes), so a rerun only fits and prints.

    OMP_NUM_THREADS=1 .venv/bin/python bench/automix_bench.py            # designed case (FACTORY_HOME)
    OMP_NUM_THREADS=1 .venv/bin/python bench/automix_bench.py --real     # the real corpus
    ... --fit-only --check-steps 360     # refit the scored proxies, check on 3x longer runs
    ... --junk reversed_words            # the designed case with word-reversed junk
    ... --case code                      # one real source plus junk (uniform = half junk)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from configs.evals import suite
from configs.mixes import mix_spec
from configs.sweeps.automix_junk import automix_cheap, automix_junk, automix_junk_code, automix_reversed
from factory import settings
from factory.data.junk import JunkConfig, build_junk_table
from factory.experiments.automix import propose_from_sweep
from factory.experiments.local import run_sweep
from factory.experiments.results import write_sweep_results
from factory.experiments.sweep import SweepBudget, SweepConfig, round_weights
from factory.infer import EngineConfig
from factory.lake import Lake
from factory.mix import register_mix_version

JUNK = {kind: JunkConfig(name=kind, shuffle=kind, sources=tuple(mix_spec("default").weights), max_docs_per_source=300)
        for kind in ("repeated_line", "reversed_words")}


def check_sweep(sweep: SweepConfig, arms: dict[str, dict[str, float]], seeds: int, steps: int | None) -> SweepConfig:
    """The proxy's config at each arm's weights and `seeds` seeds: a grid sweep, so the runs are
    named by their configs and a rerun trains nothing twice."""
    base = sweep.base.derive(name=f"{sweep.name}_check", description=f"{sweep.name}: proposal vs uniform, by seed.")
    if steps:
        base = base.derive(steps=steps, eval_every=steps, checkpoint={"every": steps, "keep_last": 1})
    return SweepConfig(name=f"{sweep.name}_check", description=base.description, base=base, search="grid",
                       params={"mix_weights": list(arms.values()), "seed": list(range(seeds))},
                       budget=SweepBudget(max_runs=len(arms) * seeds))


def run_case(lake: Lake, sweep: SweepConfig, *, seeds: int, steps: int | None, engine: EngineConfig,
             train_proxies: bool = True) -> bool:
    started = time.perf_counter()
    if train_proxies:
        run_sweep(lake, sweep, suites=suite, engine=engine, log=print)
    swept = time.perf_counter() - started
    proposal, version = propose_from_sweep(lake, sweep, name=sweep.name, log=print)
    print(f"\n{sweep.name}: {proposal.n_proxies} proxies in {swept:.0f} s ({swept / proposal.n_proxies:.1f} s each); "
          f"proposal registered as {version.version_id}\n\n{proposal.summary()}\n")

    tables = sweep.params["mix_weights"].tables
    arms = {"uniform": round_weights({t: 1 / len(tables) for t in tables}), "proposal": proposal.weights}
    check = check_sweep(sweep, arms, seeds, steps)
    started = time.perf_counter()
    run_sweep(lake, check, suites=suite, engine=engine, log=print)
    checked = time.perf_counter() - started
    report = write_sweep_results(lake, check, asset_key="bench", partition=check.name)
    scores = {arm: {} for arm in arms}
    for entry in report.ranking:
        arm = next(a for a, w in arms.items() if entry["params"]["mix_weights"] == w)
        scores[arm][entry["params"]["seed"]] = entry["value"]

    print(f"\n{check.name}: {len(report.ranking)} runs in {checked:.0f} s ({check.base.steps} steps each), "
          f"held-out {check.metric} ({check.base.eval_suite} suite), lower is better")
    print("| seed | uniform | proposal | proposal / uniform |\n|---:|---:|---:|---:|")
    for seed in range(seeds):
        u, p = scores["uniform"][seed], scores["proposal"][seed]
        print(f"| {seed} | {u:.4f} | {p:.4f} | {p / u:.4f} |")
    stats = {arm: (statistics.mean(v.values()), max(v.values()) - min(v.values()), statistics.stdev(v.values()))
             for arm, v in scores.items()}
    predicted = {"uniform": proposal.uniform_loss, "proposal": proposal.predicted_loss}
    scale = "" if check.base.steps == sweep.base.steps else f" (for the proxies' {sweep.base.steps} steps)"
    for arm, (mean, spread, sd) in stats.items():
        print(f"| **{arm}** mean | {mean:.4f} | spread (max - min) {spread:.4f} | sd {sd:.4f}; "
              f"predicted {predicted[arm]:.4f}{scale} |")
    gap = stats["uniform"][0] - stats["proposal"][0]
    beats = gap > max(stats["uniform"][1], stats["proposal"][1])
    print(f"\nproposal / uniform = {stats['proposal'][0] / stats['uniform'][0]:.4f} (mean gap {gap:+.4f} bits/byte); "
          f"every seed better: {'yes' if max(scores['proposal'].values()) < min(scores['uniform'].values()) else 'no'}")
    for t in tables:
        print(f"  weight {t}: proposal {proposal.weights[t]:.4f}, uniform {arms['uniform'][t]:.4f}")
    print(f"beats uniform by more than the seed spread: {'yes' if beats else 'no'}\n")
    return beats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--home", default=None, help="factory home (default: $FACTORY_HOME, else ./.factory)")
    parser.add_argument("--real", action="store_true", help="rerun on the real corpus (automix_cheap) instead")
    parser.add_argument("--case", choices=["default", "code"], default="default",
                        help="designed case: the default mix's 3 sources + junk, or one source (site_packages) + junk")
    parser.add_argument("--junk", choices=sorted(JUNK), default="repeated_line",
                        help="the default case's junk: repeated first lines (mix default_with_junk, sweep automix_junk) "
                             "or words in reverse order (mix default_with_reversed_words, sweep automix_reversed)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per arm of the check (default 3)")
    parser.add_argument("--check-steps", type=int, default=None, help="steps of the check runs (default: the proxy's)")
    parser.add_argument("--fit-only", action="store_true", help="train no proxy: fit the ones the lake has scored")
    parser.add_argument("--engine", choices=["transformers", "vllm"], default="transformers",
                        help="engine scoring every export (transformers: no per-cell vLLM start-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads here and in every trainer (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings.export({"OMP_NUM_THREADS": str(args.threads)})  # the trainers are child processes
    lake = Lake.open(home=args.home)
    print(f"lake {lake.home}; torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    if args.real:
        sweep = automix_cheap()
    else:
        if args.case == "code" and args.junk != "repeated_line":
            parser.error("--case code has repeated-line junk only (mix code_with_junk)")
        junk = build_junk_table(lake, JUNK[args.junk], log=print)
        print(f"{junk.version_id}: {junk.rows} documents, {junk.bytes:,} bytes; skipped {junk.skipped}")
        mix = {"code": "code_with_junk", "reversed_words": "default_with_reversed_words"}.get(
            args.case if args.case == "code" else args.junk, "default_with_junk")
        version, created = register_mix_version(lake, mix_spec(mix), asset_key="bench", log=print)
        print(f"{version.version_id}: {'registered' if created else 'unchanged'}")
        sweep = (automix_junk_code() if args.case == "code"
                 else automix_reversed() if args.junk == "reversed_words" else automix_junk())
    run_case(lake, sweep, seeds=args.seeds, steps=args.check_steps, engine=EngineConfig(kind=args.engine),
             train_proxies=not args.fit_only)


if __name__ == "__main__":
    main()
