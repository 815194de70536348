"""Next-line completion on held-out standard-library functions: a code task a small model moves on.

HumanEval is flat at zero for a model of a few million parameters; this task is not. For each
held-out document of a code source, functions are found with `ast`; in each function one body
line (not blank, not a comment, at least `min_chars` long, never the first line of the body) is
picked by a seeded generator; the prompt is the file up to the end of the line before it, and the
model greedily completes one line. Scores: exact match of the stripped line, and difflib's
similarity ratio (partial credit that moves earlier in training).

The prompt ends with the previous line's last character, not after its newline: the byte-level
BPE merges a newline with the indentation after it (`\n` + 8 spaces is one token), so a prompt
ending in `\n` would ask the model to continue from a token boundary it never saw in training.
The model's first line break is therefore part of its answer; the line after it is compared.
"""

from __future__ import annotations

import ast
import difflib
import random

from pydantic import Field

from factory.evals.heldout import heldout_docs
from factory.evals.tasks import Metric, TaskConfig, TaskContext, TaskResult, mean_stderr, register
from factory.infer.engine import SamplingConfig


class LineCompletionConfig(TaskConfig):
    task: str = "line_completion"
    source: str = Field("refined.python_stdlib", description="Code table whose held-out files are used.")
    max_examples: int = Field(200, ge=1, description="Lines to complete (at most one per function).")
    min_chars: int = Field(8, ge=1, description="Shortest target line (stripped), in characters.")
    max_tokens: int = Field(48, ge=1, description="Tokens generated per line at most.")
    seed: int = Field(0, description="Seeds the choice of line in each function.")


def examples(texts: list[tuple[str, str]], config: LineCompletionConfig) -> list[tuple[str, str, str]]:
    """(item, prompt, target line) triples from (path, source) pairs, deterministic."""
    out = []
    for path, text in texts:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        lines = text.splitlines(keepends=True)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
                continue
            first = node.body[0].lineno  # 1-based; docstrings count as the first line
            candidates = [i for i in range(first, (node.end_lineno or first))  # 0-based indices after the first
                          if len(s := lines[i].strip()) >= config.min_chars and not s.startswith("#")]
            if not candidates:
                continue
            i = random.Random(f"{config.seed}:{path}:{node.lineno}").choice(candidates)
            out.append((f"{path}:{i + 1}", "".join(lines[:i]).removesuffix("\n"), lines[i].rstrip("\n")))
            if len(out) == config.max_examples:
                return out
    return out


@register(LineCompletionConfig)
def line_completion(config: LineCompletionConfig, ctx: TaskContext) -> TaskResult:
    held = heldout_docs(ctx.lake, ctx.mix_version, config.source)
    cases = examples([(d.path, d.text) for d in held.docs], config)
    if not cases:
        raise ValueError(f"line_completion: no usable functions in the held-out split of {config.source}")
    prompts = [ctx.engine.fit(ctx.engine.document_ids(prompt), config.max_tokens) for _, prompt, _ in cases]
    sampling = SamplingConfig(max_tokens=config.max_tokens, temperature=0.0)
    outputs = ctx.engine.generate(prompts, sampling)
    exact, similar, samples = [], [], []
    for (item, _, target), out in zip(cases, outputs):
        got = out[0].text.removeprefix("\n").split("\n", 1)[0]
        hit = float(got.strip() == target.strip())
        ratio = difflib.SequenceMatcher(None, got.strip(), target.strip()).ratio()
        exact.append(hit)
        similar.append(ratio)
        samples.append({"item": item, "reference": target, "completion": got, "outcome": "match" if hit else "miss",
                        "score": ratio})
    em, em_err = mean_stderr(exact)
    sim, sim_err = mean_stderr(similar)
    ctx.log(f"line_completion: exact match {em:.3f}, similarity {sim:.3f} over {len(cases)} lines")
    return TaskResult([Metric("exact_match", em, len(cases), em_err), Metric("edit_similarity", sim, len(cases), sim_err)],
                      samples, [held.version_id], {"documents": len(held.docs)})
