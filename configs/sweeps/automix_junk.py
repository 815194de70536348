"""Goal: does the auto-mixer find what is there? (RegMix on a designed case, then on the real corpus)

`automix_junk`: proxies on Dirichlet weights over `configs/mixes/default_with_junk.yaml`, the
default mix's three sources plus `junk.repeated_line` (their documents reduced to the first line,
repeated to the document's length, `factory.data.junk`). Each proxy is scored on held-out bits per
byte of the three real sources only (`heldout_default` suite), so the right answer is known: junk
displaces real text, and the proposal must give it a small weight and beat the uniform mix (junk at
1/4). The mix streams the first 512 tokens of each document (`max_doc_tokens`): the proxies' 120
steps then read ~480 documents, not ~70, so which documents a seed reads weighs less against what
the mix does (in a 2-seed probe junk at 1/2 cost +0.20 bits/byte, seed spread 0.03; the 3-seed
check of the uniform mix still spread 0.095, README).
The proxies have an untied head at lr 3e-2, which learns the common tokens faster than a tied one.

`automix_reversed`: the same proxies over `default_with_reversed_words`, whose junk is the sources'
documents with their words in reverse order (measured: it cost the proxies no more than repeated
lines, README).

`automix_junk_code`: one real source (`refined.site_packages`) plus the same junk on the same
proxies (mix `code_with_junk`, scored by `heldout_code`), so the uniform mix is half junk: the case
where the proposal beat uniform by more than the seed spread.

`automix_cheap`: the real corpus again (the default mix's three sources, no junk), with more and
cheaper proxies than `automix` (16 proxies of 60 steps): does RegMix's proposal beat uniform there?

    .venv/bin/python bench/automix_bench.py            # builds the junk table, runs both, checks at 3 seeds
    factory sweep run automix_junk && factory automix automix_junk --name automix_junk
"""

from __future__ import annotations

from configs.mixes import mix_spec
from configs.sweeps.automix import proxy
from factory.experiments.sweep import Dirichlet, SweepBudget, SweepConfig
from factory.train.config import CheckpointConfig, ModelConfig, OptimizerConfig, ScheduleConfig, TrackerConfig

JUNK_STEPS, CHEAP_STEPS = 120, 30  # at 8 sequences of 257 tokens a step


def _cheap_proxy(name: str, mix: str, steps: int, suite: str, *, tied: bool = True, lr: float = 1e-2,
                 warmup: int = 4):
    """A tiny proxy (d=32, 2 layers, ~0.3 M parameters tied, ~0.56 M untied, mostly embeddings; 8
    sequences a step at a high learning rate): what it learns in a few dozen steps is mostly which
    tokens and short patterns are common, which is what a mix changes. Measured 45-60 s a cell of 40
    steps on a busy 2-core host (load 5-8), ~100 s a cell of 120 steps (80 s training, 20 s eval)."""
    return proxy().derive(
        name=name, description=f"A cheap RegMix proxy on mix {mix}: {steps} steps, scored on {suite}.",
        model=ModelConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, max_seq_len=256, tie_embeddings=tied),
        mix=mix, steps=steps, eval_every=steps, eval_suite=suite, global_batch=8, micro_batch=8,
        optimizer=OptimizerConfig(lr=lr, weight_decay=0.1),
        schedule=ScheduleConfig(kind="cosine", warmup_steps=warmup),
        checkpoint=CheckpointConfig(every=steps, keep_last=1),
        tracker=TrackerConfig(backends=["iceberg"], log_every=steps),
    )


def _proxies(name: str, description: str, mix: str, steps: int, suite: str, samples: int, *,
             max_runs: int, max_tokens: int, **proxy) -> SweepConfig:
    """`samples` cheap proxies on Dirichlet(1) weights over mix `mix`'s tables, scored by `suite`."""
    return SweepConfig(
        name=name, description=description, base=_cheap_proxy(name, mix, steps, suite, **proxy),
        search="random", samples=samples, seed=0,
        params={"mix_weights": Dirichlet(tables=tuple(mix_spec(mix).weights), alpha=1.0)},
        budget=SweepBudget(max_runs=max_runs, max_tokens=max_tokens),
    )


def automix_junk() -> SweepConfig:
    return _proxies("automix_junk", "RegMix's designed case: the default sources plus repeated-line junk; proxies "
                    "scored on the real sources' held-out bits per byte. The fit must give junk a small weight.",
                    "default_with_junk", JUNK_STEPS, "heldout_default", 16, max_runs=32, max_tokens=8_000_000,
                    tied=False, lr=3e-2, warmup=12)


def automix_reversed() -> SweepConfig:
    """`automix_junk` with the second junk kind: mix `default_with_reversed_words`, whose junk is
    the sources' documents with their words in reverse order (the corpus's tokens, the wrong
    successors), on the same proxies."""
    return _proxies("automix_reversed", "RegMix's designed case with word-reversed junk: the default sources plus their "
                    "documents' words in reverse order; proxies scored on the real sources' held-out bits per byte. "
                    "The fit must give junk a small weight.",
                    "default_with_reversed_words", JUNK_STEPS, "heldout_default", 16, max_runs=32,
                    max_tokens=8_000_000, tied=False, lr=3e-2, warmup=12)


def automix_junk_code() -> SweepConfig:
    """The plainest designed case: one real source (`refined.site_packages`) and the junk, so the
    uniform mix is half junk, so the answer (junk ~ 0) is worth more than a seed's noise. On the
    proxies of `automix_junk` (120 steps, untied, first 512 tokens of each document) it is: the
    proposal (junk 0.0008) beat uniform at 3 seeds by 0.165 bits/byte, more than either arm's
    spread (README, "Does the auto-mixer find what is there?"). At 40 steps on whole documents it
    was not."""
    return _proxies("automix_junk_code", "RegMix's plainest designed case: installed packages' code plus repeated-line "
                    "junk; proxies scored on the code's held-out bits per byte. The fit must give junk a small weight.",
                    "code_with_junk", JUNK_STEPS, "heldout_code", 8, max_runs=16, max_tokens=4_000_000,
                    tied=False, lr=3e-2, warmup=12)


def automix_cheap() -> SweepConfig:
    return _proxies("automix_cheap", "RegMix on the real corpus with more, cheaper proxies than `automix`: Dirichlet "
                    "weights of the default mix's sources -> held-out bits per byte.",
                    "default", CHEAP_STEPS, "heldout", 20, max_runs=32, max_tokens=8_000_000)
