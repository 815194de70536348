"""Seeded AST mutations for bug-fixing tasks, each applied as a text edit and checked against the AST.

Operators (each site of a function's body yields one or two mutants):
- compare_flip: a single comparison's operator negated (< <-> >=, > <-> <=, == <-> !=, in <-> not in,
  is <-> is not);
- off_by_one: an integer constant n becomes n-1 (n+1 for 0), and a non-constant `range` stop becomes
  `stop + 1` and `stop - 1`;
- drop_branch: an if/elif body becomes `pass`, or an if's plain `else` block is removed;
- bool_swap: `and` <-> `or`.

Design: the edit is made on the text at the AST's positions (so the inverse patch is a line or a few),
and a mutant is kept only when parsing its text gives exactly the AST the operator meant (the
original tree with that one node changed): a regex that hit a comment, or a bracket the AST does not
record, is discarded, not turned into a task. `mutants` lists every mutant of a function in source
order; the derivation draws from them with its seed. Which mutants break tests is the test run's job.
"""

from __future__ import annotations

import ast
import copy
import difflib
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from factory.tasks.source import (
    Candidate,
    FunctionSite,
    char_offset,
    coverage_name,
    docstring_node,
    function_node,
    functions,
    mentioning,
    source_files,
    unified_diff,
)

FLIP = {ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
        ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
SYMBOL = {ast.Lt: "<", ast.GtE: ">=", ast.Gt: ">", ast.LtE: "<=", ast.Eq: "==", ast.NotEq: "!=", ast.In: "in",
          ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
COMPARE_TOKEN = re.compile(r"not\s+in\b|is\s+not\b|<=|>=|==|!=|<|>|\bin\b|\bis\b")
OPERATORS = ("compare_flip", "off_by_one", "drop_branch", "bool_swap")


@dataclass(frozen=True)
class Mutant:
    operator: str
    description: str  # e.g. 'compare_flip L12:8 < -> >='
    text: str         # the mutated file


def mutants(source: str, site: FunctionSite, operators=OPERATORS) -> list[Mutant]:
    """Every valid mutant of `site`'s body in `source` by `operators`, in source order."""
    tree = ast.parse(source)
    func = function_node(tree, site.qualname)
    doc = docstring_node(func)
    nodes = [n for stmt in func.body if stmt is not doc for n in ast.walk(stmt)]
    index = {id(n): i for i, n in enumerate(ast.walk(tree))}
    lines = source.splitlines(keepends=True)
    out = []
    for node in sorted(nodes, key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0))):
        for operator, alternatives, change, words in _proposals(node, lines, operators):
            expected = copy.deepcopy(tree)
            change(list(ast.walk(expected))[index[id(node)]])
            want = ast.dump(expected)
            for edits in alternatives:  # the plainest edit first; parentheses only when precedence needs them
                if edits is None:
                    continue
                text = _apply(source, lines, edits)
                try:
                    ok = ast.dump(ast.parse(text)) == want
                except SyntaxError:
                    ok = False
                if ok:
                    out.append(Mutant(operator, f"{operator} L{node.lineno}:{node.col_offset} {words}", text))
                    break
    return out


def _proposals(node, lines, operators):
    """(operator, alternative edit lists (None: not applicable), the AST change, words)."""
    if "compare_flip" in operators and isinstance(node, ast.Compare) and len(node.ops) == 1 \
            and type(node.ops[0]) in FLIP:
        old, new = type(node.ops[0]), FLIP[type(node.ops[0])]
        edit = _token_edit(lines, node.left, node.comparators[0], COMPARE_TOKEN, SYMBOL[new])

        def flip(n, new=new):
            n.ops = [new()]
        yield "compare_flip", [[edit] if edit else None], flip, f"{SYMBOL[old]} -> {SYMBOL[new]}"
    if "bool_swap" in operators and isinstance(node, ast.BoolOp):
        old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        edits = [_token_edit(lines, a, b, re.compile(rf"\b{old}\b"), new) for a, b in zip(node.values, node.values[1:])]

        def swap(n):
            n.op = ast.Or() if isinstance(n.op, ast.And) else ast.And()
        plain = edits if all(edits) else None
        wrapped = plain and plain + _parenthesize(lines, node)
        yield "bool_swap", [plain, wrapped], swap, f"{old} -> {new}"
    if "off_by_one" in operators:
        yield from _off_by_one(node)
    if "drop_branch" in operators and isinstance(node, ast.If):
        yield from _drop_branch(node, lines)


def _off_by_one(node):
    if isinstance(node, ast.Constant) and type(node.value) is int:
        new = node.value - 1 if node.value >= 1 else node.value + 1

        def const(n, new=new):
            n.value = new
        yield "off_by_one", [[_span(node, repr(new))]], const, f"{node.value} -> {new}"
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range" \
            and 1 <= len(node.args) <= 3 and not node.keywords:
        slot = 0 if len(node.args) == 1 else 1
        stop = node.args[slot]
        if isinstance(stop, ast.Constant):
            return  # the constant rule covers it
        for sign, op in (("+", ast.Add), ("-", ast.Sub)):
            def bound(n, slot=slot, op=op):
                n.args[slot] = ast.BinOp(left=n.args[slot], op=op(), right=ast.Constant(1))
            yield "off_by_one", [[_span(stop, None, "{}" + f" {sign} 1")], [_span(stop, None, "({})" + f" {sign} 1")]], \
                bound, f"range stop {sign} 1"


def _drop_branch(node: ast.If, lines):
    first, last = node.body[0], node.body[-1]
    if first.lineno > node.test.end_lineno and not (len(node.body) == 1 and isinstance(first, ast.Pass)):
        indent = lines[first.lineno - 1][: len(lines[first.lineno - 1]) - len(lines[first.lineno - 1].lstrip())]

        def body_pass(n):
            n.body = [ast.Pass()]
        yield "drop_branch", [[(first.lineno, 0, last.end_lineno, None, f"{indent}pass")]], body_pass, \
            f"if body at L{node.lineno} -> pass"
    if node.orelse and not _is_elif(node.orelse, lines):
        else_line = next((i for i in range(last.end_lineno + 1, node.orelse[0].lineno + 1)
                          if re.match(r"\s*else\s*:", lines[i - 1])), None)
        if else_line is not None:
            def no_else(n):
                n.orelse = []
            yield "drop_branch", [[(else_line, 0, node.orelse[-1].end_lineno, None, None)]], no_else, \
                f"else at L{else_line} removed"


def _is_elif(orelse, lines) -> bool:
    head = orelse[0]
    return len(orelse) == 1 and isinstance(head, ast.If) and lines[head.lineno - 1].lstrip().startswith("elif")


def _span(node, text: str | None, template: str = "{}"):
    """An edit replacing `node`'s own text (template gets the old text when `text` is None)."""
    return (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, text, template)


def _parenthesize(lines, node):
    """Two insertions that put `node`'s text in parentheses (kept apart from edits inside it)."""
    start = char_offset(lines, node.lineno, node.col_offset)
    end = char_offset(lines, node.end_lineno, node.end_col_offset)
    return [("abs", end, end, ")"), ("abs", start, start, "(")]


def _token_edit(lines, left, right, pattern: re.Pattern, new: str):
    """Replace the single operator token between two operands' texts, or None when not exactly one."""
    start = char_offset(lines, left.end_lineno, left.end_col_offset)
    end = char_offset(lines, right.lineno, right.col_offset)
    segment = "".join(lines)[start:end]
    found = list(pattern.finditer(segment))
    if len(found) != 1:
        return None
    return ("abs", start + found[0].start(), start + found[0].end(), new)


def _apply(source: str, lines, edits) -> str:
    """Apply edits (made on `source`) from the last to the first, so earlier offsets stay valid."""
    absolute = []
    for edit in edits:
        if edit[0] == "abs":
            absolute.append((edit[1], edit[2], edit[3]))
        elif len(edit) == 6:  # node span
            lineno, col, end_lineno, end_col, text, template = edit
            start, end = char_offset(lines, lineno, col), char_offset(lines, end_lineno, end_col)
            absolute.append((start, end, text if text is not None else template.format(source[start:end])))
        else:  # whole lines: (first line, 0, last line, None, replacement line or None to delete)
            first, _, last, _, text = edit
            start, end = char_offset(lines, first, 0), char_offset(lines, last + 1, 0) if last < len(lines) else len(source)
            absolute.append((start, end, "" if text is None else text + "\n"))
    for start, end, text in sorted(absolute, reverse=True):
        source = source[:start] + text + source[end:]
    return source



def mutation_candidates(root: Path, tests: dict[str, str], *, operators=OPERATORS, seed: int = 0,
                        tries_per_function: int = 3) -> Iterator[Candidate]:
    """Mutants of the tree's covered functions, lazily: functions in seeded order, then up to
    `tries_per_function` of each one's mutants in seeded order (mutating every function of a large
    repository up front would cost a parse per mutant for candidates never tried)."""
    rng = random.Random(seed)
    sites = []
    for file in source_files(root):
        text = (root / file).read_text(errors="replace")
        try:
            found = functions(text)
        except (SyntaxError, ValueError):
            continue
        names = [s.qualname for s in found]
        for site in found:
            covering = mentioning(coverage_name(site), tests)
            if covering and names.count(site.qualname) == 1:
                sites.append((file, text, site, covering))
    rng.shuffle(sites)
    for file, text, site, covering in sites:
        found = mutants(text, site, operators)
        rng.shuffle(found)
        lines = text.splitlines(keepends=True)
        for mutant in found[:tries_per_function]:
            changed = sum(1 for op in difflib.ndiff(lines, mutant.text.splitlines(keepends=True)) if op[:1] == "-")
            yield Candidate(file=file, target=site.qualname, mutation=mutant.description, operator=mutant.operator,
                            original=text, broken=mutant.text, reference=unified_diff(file, mutant.text, text),
                            function_text="".join(lines[site.first_line - 1:site.end_line]), test_files=covering,
                            lines_removed=max(changed, 1), complexity=site.complexity)


def bug_prompt(repo: str, file: str, failing: tuple[str, ...], broken: str) -> str:
    listed = "\n".join(f"- {t}" for t in failing)
    return (f"These tests of the Python repository `{repo}` fail because of a bug in `{file}`:\n{listed}\n\n"
            f"Reply with a unified diff (paths a/{file} and b/{file}) that fixes the bug; it may change only "
            f"`{file}`, and the repository's tests decide.\n\n```python\n# {file}\n{broken}```\n")
