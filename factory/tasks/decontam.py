"""Decontamination of tasks against the eval sets: a task whose target function overlaps an eval
problem is dropped before any sandbox run is spent on it.

Two checks, either one drops:
- long n-gram overlap (13 normalized word tokens by default) of the target function's text with a
  problem's prompt + canonical solution, through the refinement chain's index
  (factory.data.refine.decontam.build_index, so training data and tasks are held to one rule);
- the same body: the function's body, docstring removed, has the AST of a problem's canonical
  solution (`ast.dump`: formatting, comments and docstrings do not matter), which catches short
  solutions no 13-gram fits in.

Why the target function and not the whole prompt: the prompt holds the whole file, and another
function of that file matching a problem does not leak this task's answer.
"""

from __future__ import annotations

import ast
import functools
import textwrap

from factory.data.refine.decontam import build_index
from factory.tasks.source import docstring_node, function_node


class Decontaminator:
    """Checks function texts against `benchmarks` (built once per (benchmarks, n) per process)."""

    def __init__(self, benchmarks: tuple[str, ...] = ("humaneval",), n: int = 13):
        self.benchmarks, self.n = tuple(benchmarks), n
        self.index = build_index(list(self.benchmarks), n)
        self.bodies = _solution_bodies(self.benchmarks)

    @property
    def label(self) -> str:
        """What tasks were checked against, e.g. 'humaneval@3a1b2c3d4e5f 13-gram+body'."""
        return f"{'+'.join(_version(b) for b in self.benchmarks)} {self.n}-gram+body"

    def verdict(self, function_text: str) -> str | None:
        """The eval item `function_text` overlaps (with how), or None when it is clean."""
        hit = self.index.match(function_text)
        if hit is not None:
            return f"{hit[0]} ({hit[1]} {self.n}-grams)"
        dump = body_dump(function_text)
        if dump is not None and dump in self.bodies:
            return f"{self.bodies[dump]} (same body)"
        return None


def body_dump(function_text: str, name: str | None = None) -> str | None:
    """The AST dump of a function's body without its docstring (the first def, or the one named)."""
    try:
        tree = ast.parse(textwrap.dedent(function_text))
    except SyntaxError:
        return None
    if name is not None:
        node = function_node(tree, name)
    else:
        node = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if node is None:
        return None
    doc = docstring_node(node)
    body = [s for s in node.body if s is not doc]
    return ast.dump(ast.Module(body=body, type_ignores=[])) if body else None


@functools.lru_cache(maxsize=4)
def _solution_bodies(benchmarks: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for benchmark in benchmarks:
        if benchmark != "humaneval":
            raise ValueError(f"decontamination benchmarks: unknown benchmark {benchmark!r} (known: humaneval)")
        from factory.evals.humaneval import problems

        for problem in problems():
            dump = body_dump(problem["prompt"] + problem["canonical_solution"], problem["entry_point"])
            if dump is not None:
                out.setdefault(dump, f"humaneval:{problem['task_id']}")
    return out


def _version(benchmark: str) -> str:
    if benchmark == "humaneval":
        from factory.evals.humaneval import dataset_version

        return dataset_version()
    return benchmark
