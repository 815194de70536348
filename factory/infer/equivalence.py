"""The export's equivalence check: our training model, transformers and the engine must agree.

Purpose: an exporter bug (a transposed projection, a lost logit multiplier, a RoPE convention
mismatch) produces a model that loads, generates fluent-looking text and scores slightly worse —
the worst kind of bug, because nothing fails. So every export is checked, and the check blocks
evaluation: on a fixed prompt set,

1. logits of our `Transformer` and of transformers' `LlamaForCausalLM` agree within `atol`
   (fp32, full vocabulary, every position);
2. the engine's (vLLM's) top-k log-probs agree with ours within `atol` at every position, with
   the same top-1 token;
3. greedy generations of all three match token for token.

Tolerances are for fp32 (the export's dtype): the implementations differ only in operation order,
~1e-6 on log-probs; 1e-4 leaves room for longer contexts and still catches a 1 % weight error by
orders of magnitude.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from factory.infer.engine import Engine, EngineConfig, SamplingConfig, TransformersEngine, open_engine
from factory.infer.export import ExportRef, TrainedCheckpoint, find_checkpoint, training_model
from factory.train.model import Transformer

PROMPTS = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "The json module can be used to",
    "    for i in range(len(values)):\n        if values[i] < 0:\n",
    "# Copyright 2001 Python Software Foundation\n\"\"\"Utilities for",
    "Returns a list of all the",
    "try:\n    import numpy as np\nexcept ImportError:\n",
)


class EquivalenceConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    prompts: tuple[str, ...] = Field(PROMPTS, min_length=1, description="Fixed prompt set.")
    atol: float = Field(1e-4, gt=0, description="Largest allowed |difference| of logits / log-probs (fp32).")
    top_k: int = Field(20, ge=1, le=20, description="Engine log-probs compared per position.")
    greedy_tokens: int = Field(24, ge=1, description="Tokens generated greedily by each implementation.")


class EquivalenceReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    passed: bool
    engine: str
    prompts: int
    positions: int
    max_logit_diff_transformers: float
    max_logprob_diff_engine: float
    top1_mismatches: int
    greedy_mismatches: list[str]
    problems: list[str]

    def summary(self) -> str:
        verdict = "agree" if self.passed else "DISAGREE"
        return (f"ours / transformers / {self.engine} {verdict} on {self.prompts} prompts ({self.positions} positions): "
                f"max |Δlogit| {self.max_logit_diff_transformers:.2e}, max |Δlogprob| {self.max_logprob_diff_engine:.2e}, "
                f"greedy mismatches {len(self.greedy_mismatches)}")


@torch.no_grad()
def _greedy(model: Transformer, prompt: list[int], n: int, eos: int) -> list[int]:
    ids, out = list(prompt), []
    for _ in range(n):
        nxt = int(model(torch.tensor([ids]))[0, -1].argmax())
        out.append(nxt)
        if nxt == eos:
            break
        ids.append(nxt)
    return out


@torch.no_grad()
def check_equivalence(ours: Transformer, reference: TransformersEngine, engine: Engine,
                      config: EquivalenceConfig = EquivalenceConfig()) -> EquivalenceReport:
    """Compare the three implementations on `config.prompts` (see the module docstring)."""
    prompts = [engine.fit(engine.encode(p), config.greedy_tokens) for p in config.prompts]
    problems: list[str] = []
    logit_diff = logprob_diff = 0.0
    top1 = positions = 0
    engine_top = engine.top_logprobs(prompts, config.top_k)
    for i, ids in enumerate(prompts):
        mine = ours(torch.tensor([ids]))[0].float()
        logit_diff = max(logit_diff, float((mine - reference.logits(ids)).abs().max()))
        mine_lp = torch.log_softmax(mine, -1)
        for t, top in enumerate(engine_top[i]):
            positions += 1
            tokens = torch.tensor(list(top))
            values = torch.tensor(list(top.values()))
            logprob_diff = max(logprob_diff, float((values - mine_lp[t, tokens]).abs().max()))
            top1 += int(tokens[values.argmax()]) != int(mine_lp[t].argmax())
    if logit_diff > config.atol:
        problems.append(f"transformers logits differ from ours by {logit_diff:.3e} > atol {config.atol:g}")
    if logprob_diff > config.atol:
        problems.append(f"{engine.name} log-probs differ from ours by {logprob_diff:.3e} > atol {config.atol:g}")
    if top1:
        problems.append(f"{engine.name} picks a different top-1 token than ours at {top1} of {positions} positions")

    greedy = SamplingConfig(max_tokens=config.greedy_tokens, temperature=0.0)
    eos = engine.tokenizer.eos_token_id
    theirs = {e.name: [s[0].token_ids for s in e.generate(prompts, greedy)] for e in (reference, engine)}
    mismatches = []
    for i, ids in enumerate(prompts):
        want = _greedy(ours, ids, config.greedy_tokens, eos)
        for name, outputs in theirs.items():
            if outputs[i] != want:
                mismatches.append(f"prompt {i}: {name} generated {outputs[i][:8]}… where ours generated {want[:8]}…")
    problems.extend(mismatches)
    return EquivalenceReport(
        passed=not problems, engine=engine.name, prompts=len(prompts), positions=positions,
        max_logit_diff_transformers=logit_diff, max_logprob_diff_engine=logprob_diff, top1_mismatches=top1,
        greedy_mismatches=mismatches, problems=problems,
    )


def verify_export(lake, export: ExportRef, engine_config: EngineConfig = EngineConfig(),
                  config: EquivalenceConfig = EquivalenceConfig(),
                  checkpoint: TrainedCheckpoint | None = None) -> EquivalenceReport:
    """Check `export` against the checkpoint it came from (pass it when already found: finding
    hashes the whole file), on the engine `engine_config` selects (kept open afterwards: the evals
    that follow use the same engine)."""
    ours = training_model(checkpoint or find_checkpoint(lake, export.checkpoint_id))
    reference = TransformersEngine(export, EngineConfig(kind="transformers", dtype="float32"))
    return check_equivalence(ours, reference, open_engine(export, engine_config), config)
