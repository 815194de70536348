"""Reading a repository's Python sources for task derivation: where its functions are, which test
files mention them, and the unified diffs that record a change.

Design: every edit a task makes (a removed body, a mutation, a spliced candidate) is a text edit at
positions the AST gives, never `ast.unparse` of the file: the broken file differs from the original
only where the break is, so prompts keep the author's formatting and inverse patches stay a few lines.
`FunctionSite` carries the line numbers those edits need; `find_function` locates a site again by
qualified name in an edited text (a candidate is spliced into the broken file, not the original).

Why static coverage (a test file that names the function): it costs nothing, and the broken run over
those files is what decides whether any test notices; a function no test names is never tried.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

SKIP_DIRS = {".git", ".hg", ".tox", ".nox", ".venv", "venv", "build", "dist", "__pycache__", "node_modules",
             ".eggs", "docs", "doc", "examples", "benchmarks", "site-packages"}
TEST_DIRS = {"tests", "test", "testing"}
NOT_SOURCES = {"setup.py", "conftest.py", "noxfile.py", "fabfile.py", "tasks.py", "__main__.py"}
BRANCHES = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.IfExp, ast.ExceptHandler, ast.match_case)


@dataclass(frozen=True)
class FunctionSite:
    """One function or method of a file, with the 1-based line numbers that edits of it need."""

    qualname: str
    name: str
    first_line: int   # the first decorator's line, else the def line
    def_line: int
    header_end: int   # the line holding the signature's closing ':'
    keep_end: int     # last line kept when the body is removed: the docstring's end, else header_end
    end_line: int
    def_indent: str
    body_indent: str  # indentation of the first statement after the docstring ('' when none)
    complexity: int
    removable: bool   # a body after the docstring that starts on its own line

    @property
    def body_lines(self) -> int:
        return self.end_line - self.keep_end if self.removable else 0


def is_test_file(relative: str) -> bool:
    parts = Path(relative).parts
    name = parts[-1]
    return name.startswith("test_") or name.endswith("_test.py") or any(p in TEST_DIRS for p in parts[:-1])


def python_files(root: Path) -> list[str]:
    """Relative POSIX paths of the tree's .py files, sorted, skipping build and VCS directories."""
    out = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if any(p in SKIP_DIRS or p.endswith(".egg-info") for p in relative.parts[:-1]) or path.is_symlink():
            continue
        out.append(relative.as_posix())
    return out


def source_files(root: Path) -> list[str]:
    return [f for f in python_files(root) if not is_test_file(f) and Path(f).name not in NOT_SOURCES]


def test_files(root: Path) -> dict[str, str]:
    """{relative path: text} of the tree's test files."""
    return {f: (root / f).read_text(errors="replace") for f in python_files(root) if is_test_file(f)}


test_files.__test__ = False  # not a pytest test


def mentioning(name: str, tests: dict[str, str]) -> tuple[str, ...]:
    """Test files whose text names `name` as a whole word."""
    word = re.compile(rf"\b{re.escape(name)}\b")
    return tuple(f for f, text in tests.items() if word.search(text))


def coverage_name(site: FunctionSite) -> str:
    """The word tests use for a function: its name, or its class's name for a dunder method."""
    if site.name.startswith("__") and site.name.endswith("__") and "." in site.qualname:
        return site.qualname.rsplit(".", 2)[-2]
    return site.name


def functions(source: str) -> list[FunctionSite]:
    """The module-level functions and (nested) class methods of `source`; functions defined inside
    functions are part of their parent. Raises SyntaxError when `source` does not parse."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    out: list[FunctionSite] = []

    def visit(body, prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append(_site(node, prefix + node.name, lines))

    visit(tree.body, "")
    return out


def find_function(source: str, qualname: str) -> FunctionSite:
    matches = [s for s in functions(source) if s.qualname == qualname]
    if len(matches) != 1:
        raise LookupError(f"function {qualname!r}: {len(matches)} definitions in the file, expected 1")
    return matches[0]


def function_node(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The node of `qualname` in a parsed module (the last definition when redefined)."""
    *classes, name = qualname.split(".")
    body = tree.body
    for cls in classes:
        found = [n for n in body if isinstance(n, ast.ClassDef) and n.name == cls]
        if not found:
            return None
        body = found[-1].body
    found = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    return found[-1] if found else None


def complexity(node: ast.AST) -> int:
    count = 1
    for child in ast.walk(node):
        if isinstance(child, ast.comprehension):
            count += len(child.ifs)
        elif isinstance(child, BRANCHES):
            count += 1
        elif isinstance(child, ast.BoolOp):
            count += len(child.values) - 1
    return count


def docstring_node(node) -> ast.Expr | None:
    first = node.body[0] if node.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first
    return None


def _site(node, qualname: str, lines: list[str]) -> FunctionSite:
    header_end = _header_end(lines, node.lineno)
    doc = docstring_node(node)
    keep_end = doc.end_lineno if doc is not None else header_end
    rest = node.body[1:] if doc is not None else node.body
    removable = bool(rest) and rest[0].lineno > keep_end and _starts_line(lines, rest[0])
    body_indent = lines[rest[0].lineno - 1][: _char_col(lines, rest[0].lineno, rest[0].col_offset)] if rest else ""
    first_line = min([d.lineno for d in node.decorator_list] + [node.lineno])
    def_indent = lines[node.lineno - 1][: _char_col(lines, node.lineno, node.col_offset)]
    return FunctionSite(qualname=qualname, name=node.name, first_line=first_line, def_line=node.lineno,
                        header_end=header_end, keep_end=keep_end, end_line=node.end_lineno, def_indent=def_indent,
                        body_indent=body_indent, complexity=complexity(node), removable=removable)


def _header_end(lines: list[str], def_line: int) -> int:
    """The line of the ':' that ends a def's signature (brackets tracked, so annotations and lambda
    defaults with colons do not count)."""
    depth = 0
    seen_def = False
    text = "".join(lines[def_line - 1:])
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.NAME and tok.string == "def":
                seen_def = True
            elif tok.type == tokenize.OP and seen_def:
                if tok.string in "([{":
                    depth += 1
                elif tok.string in ")]}":
                    depth -= 1
                elif tok.string == ":" and depth == 0:
                    return def_line + tok.start[0] - 1
    except (tokenize.TokenError, IndentationError):
        pass
    return def_line


def _char_col(lines: list[str], lineno: int, byte_col: int) -> int:
    """AST columns are UTF-8 byte offsets; text edits need character offsets."""
    return len(lines[lineno - 1].encode()[:byte_col].decode(errors="replace"))


def _starts_line(lines: list[str], node: ast.AST) -> bool:
    return not lines[node.lineno - 1][: _char_col(lines, node.lineno, node.col_offset)].strip()


def char_offset(lines: list[str], lineno: int, byte_col: int) -> int:
    """Absolute character offset in the joined text of (1-based line, byte column)."""
    return sum(len(line) for line in lines[: lineno - 1]) + _char_col(lines, lineno, byte_col)


def unified_diff(path: str, old: str, new: str) -> str:
    """A unified diff from `old` to `new` of `path`, with a/ b/ prefixes (`patch -p1`, `git apply`),
    marking a last line without newline the way diff does."""
    out = []
    for line in difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                     fromfile=f"a/{path}", tofile=f"b/{path}"):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


@dataclass(frozen=True)
class Candidate:
    """One break of one file, before any test has run on it (derive.py runs it and keeps it or not)."""

    file: str
    target: str           # qualified name of the function the break is in
    mutation: str         # '' for completion, else the mutation's description
    operator: str         # remove_body, compare_flip, off_by_one, drop_branch, bool_swap
    original: str         # the file's text
    broken: str           # the file's text with the break
    reference: str        # the removed body, or the inverse unified diff
    function_text: str    # the original function's source (for decontamination)
    test_files: tuple[str, ...]
    lines_removed: int
    complexity: int
