"""Function completion: remove a covered function's body, and splice a candidate back in.

`remove_body` keeps the signature and the docstring and replaces the rest of the body by one
`raise NotImplementedError` line at the body's indentation; the reference is the removed lines,
verbatim. `splice` is its inverse for any candidate, which is either

- a body: inserted verbatim when its first line already has the body's indentation (the reference
  always does, so splicing it gives back the original lines), else dedented and re-indented; or
- the whole function: one `def` of the target's name (decorators optional; without any, the
  original decorators are kept), dedented and re-indented to the def's column.

A spliced file must parse, and its AST outside the target function must equal the broken file's:
a candidate that closes the function early and adds module-level code (say, redefining a helper the
tests use) is an error, not a pass. `completion_candidates` lists the functions worth trying: a
removable body of min..max lines that is not already a stub, whose name a test file mentions.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from factory.tasks.source import (
    Candidate,
    FunctionSite,
    coverage_name,
    docstring_node,
    find_function,
    function_node,
    functions,
    mentioning,
    source_files,
)

PLACEHOLDER = "raise NotImplementedError"


class CandidateError(ValueError):
    """A candidate cannot be applied: it does not parse, or it changes code outside its target."""


def remove_body(source: str, qualname: str) -> tuple[str, str]:
    """(the file with `qualname`'s body replaced by the placeholder, the removed body lines)."""
    return _remove(source.splitlines(keepends=True), find_function(source, qualname))


def _remove(lines: list[str], site: FunctionSite) -> tuple[str, str]:
    if not site.removable:
        raise ValueError(f"function {site.qualname!r}: no body to remove after the signature/docstring "
                         f"(a one-line def or a docstring-only function)")
    removed = "".join(lines[site.keep_end:site.end_line])
    broken = "".join(lines[:site.keep_end] + [f"{site.body_indent}{PLACEHOLDER}\n"] + lines[site.end_line:])
    return broken, removed


def splice(broken: str, qualname: str, candidate: str) -> str:
    """`broken` with `candidate` (a body or the whole function) in place of `qualname`'s body."""
    site = find_function(broken, qualname)
    lines = broken.splitlines(keepends=True)
    text = _strip_blank_edges(candidate.replace("\r\n", "\n"))
    if not text.strip():
        raise CandidateError(f"candidate for {qualname!r} is empty")
    whole = _as_function(text, site.name)
    if whole is not None:
        start = site.first_line if whole.decorator_list else site.def_line
        new = textwrap.indent(textwrap.dedent(text), site.def_indent) + "\n"
        result = "".join(lines[: start - 1]) + new + "".join(lines[site.end_line:])
    else:
        first = next(line for line in text.splitlines() if line.strip())
        indent = first[: len(first) - len(first.lstrip())]
        body = text if indent == site.body_indent else textwrap.indent(textwrap.dedent(text), site.body_indent)
        result = "".join(lines[: site.keep_end]) + body + "\n" + "".join(lines[site.end_line:])
    _check_only_target_changed(broken, result, qualname)
    return result


def completion_candidates(root: Path, tests: dict[str, str], *, min_lines: int = 1,
                          max_lines: int = 80) -> list[Candidate]:
    """Every function of the tree's source files that a completion task can be made of, in file order."""
    out = []
    for file in source_files(root):
        text = (root / file).read_text(errors="replace")
        try:
            sites = functions(text)
        except (SyntaxError, ValueError):
            continue  # not Python 3 (a py2 leftover): no tasks from it
        names = [s.qualname for s in sites]
        lines = text.splitlines(keepends=True)
        tree = ast.parse(text)
        for site in sites:
            if names.count(site.qualname) != 1 or not site.removable or not min_lines <= site.body_lines <= max_lines:
                continue
            if _is_stub(function_node(tree, site.qualname)):
                continue
            covering = mentioning(coverage_name(site), tests)
            if not covering:
                continue
            broken, removed = _remove(lines, site)
            out.append(Candidate(file=file, target=site.qualname, mutation="", operator="remove_body", original=text,
                                 broken=broken, reference=removed,
                                 function_text="".join(lines[site.first_line - 1:site.end_line]),
                                 test_files=covering, lines_removed=site.body_lines, complexity=site.complexity))
    return out


def completion_prompt(repo: str, file: str, target: str, broken: str) -> str:
    return (f"Complete the function `{target}` in `{file}` of the Python repository `{repo}`.\n"
            f"Its body has been replaced by `{PLACEHOLDER}`. Reply with the function's new body (or the whole "
            "function definition); it replaces that line, and the repository's tests decide.\n\n"
            f"```python\n# {file}\n{broken}```\n")


def _is_stub(node) -> bool:
    """A body that is already a stub (pass, ..., raise NotImplementedError): removing it breaks nothing."""
    rest = node.body[1:] if docstring_node(node) is not None else node.body
    if len(rest) != 1:
        return False
    only = rest[0]
    if isinstance(only, ast.Pass) or (isinstance(only, ast.Expr) and isinstance(only.value, ast.Constant)):
        return True
    if isinstance(only, ast.Raise) and only.exc is not None:
        exc = only.exc.func if isinstance(only.exc, ast.Call) else only.exc
        return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
    return False


def _as_function(text: str, name: str):
    try:
        tree = ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return None
    if len(tree.body) == 1 and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) \
            and tree.body[0].name == name:
        return tree.body[0]
    return None


def _strip_blank_edges(text: str) -> str:
    lines = text.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def _check_only_target_changed(before: str, after: str, qualname: str) -> None:
    try:
        tree = ast.parse(after)
    except SyntaxError as e:
        raise CandidateError(f"candidate for {qualname!r} does not parse: {e.msg} (line {e.lineno})") from None
    if function_node(tree, qualname) is None:
        raise CandidateError(f"candidate for {qualname!r}: the function is gone from the file")
    if _without(tree, qualname) != _without(ast.parse(before), qualname):
        raise CandidateError(f"candidate for {qualname!r} changes code outside the function")


def _without(tree: ast.Module, qualname: str) -> str:
    """The module's AST dump with `qualname`'s definition replaced by `pass`."""
    *classes, name = qualname.split(".")
    body = tree.body
    for cls in classes:
        body = [n for n in body if isinstance(n, ast.ClassDef) and n.name == cls][-1].body
    for i in range(len(body) - 1, -1, -1):
        if isinstance(body[i], (ast.FunctionDef, ast.AsyncFunctionDef)) and body[i].name == name:
            body[i] = ast.Pass()
            break
    return ast.dump(tree)
