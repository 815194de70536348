"""Programmatic stages shared by pipeline shapes: extracting parts from a seed, assembling a result.

A multi-stage pipeline alternates these with model stages (plan → parts → assemble): the
rephrasing pipeline extracts one function from a source file, asks the model to explain it, and
assembles the explanation as a comment above the code. Each function takes the candidate's
fields and returns text; raising rejects the candidate with the reason.
"""

from __future__ import annotations

import ast


def first_function(fields: dict) -> str:
    """The source of the first top-level function of `text` with at least 3 and at most 40 lines."""
    text = fields["text"]
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise ValueError(f"seed is not Python: {exc.msg} (line {exc.lineno})") from None
    lines = text.splitlines()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            if 3 <= node.end_lineno - start <= 40:
                return "\n".join(lines[start:node.end_lineno])
    raise ValueError("no top-level function of 3-40 lines")


def explained(fields: dict) -> str:
    """The function with the model's explanation as a comment block above it."""
    words = " ".join(fields["explanation"].split())
    comment, line = [], "#"
    for word in words.split(" "):
        if len(line) + len(word) + 1 > 88:
            comment.append(line)
            line = "#"
        line += " " + word
    comment.append(line)
    return "\n".join(comment) + "\n" + fields["function"] + "\n"


def heuristic_judge(fields: dict) -> str:
    """A programmatic judge of `explanation`: a 0-10 score (distinct words, capped) and a critique
    the orchestrator can hand to the evolver. Stands in for an LLM judge at smoke scale."""
    words = fields.get("explanation", "").split()
    distinct = len({w.lower().strip(".,;:") for w in words})
    score = min(10, distinct // 3)
    critique = "good" if score >= 8 else f"too short or repetitive ({len(words)} words, {distinct} distinct)"
    return f"{score}: {critique}"
