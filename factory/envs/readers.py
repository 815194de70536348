"""Reading a repository's files without running them: TOML, INI, Python ASTs, pip requirements files.

Every reader returns an empty value for a file that is missing or does not parse: a repository with
a broken tox.ini still builds from its pyproject, and which rule decided is recorded either way.
setup.py is never executed: only literal keyword arguments of its setup() call are read (and names
bound to literals at module level), so a computed install_requires reads as nothing.
"""

from __future__ import annotations

import ast
import configparser
import re
import tomllib
from pathlib import Path


def toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(errors="replace"))
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def ini(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(path.read_text(errors="replace"))
    except (OSError, configparser.Error):
        pass
    return parser


def parse_ast(path: Path):
    try:
        return ast.parse(path.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None


def setup_call(path: Path) -> dict:
    """Literal keyword arguments of the setup() call in setup.py (names bound to literals resolved)."""
    tree = parse_ast(path)
    if tree is None:
        return {}
    bound = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                bound[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, SyntaxError, TypeError):
                pass
    for node in ast.walk(tree):
        func = getattr(node, "func", None)
        if isinstance(node, ast.Call) and (getattr(func, "id", None) == "setup" or getattr(func, "attr", None) == "setup"):
            found = {}
            for kw in node.keywords:
                if kw.arg is None:
                    continue
                if isinstance(kw.value, ast.Name) and kw.value.id in bound:
                    found[kw.arg] = bound[kw.value.id]
                    continue
                try:
                    found[kw.arg] = ast.literal_eval(kw.value)
                except (ValueError, SyntaxError, TypeError):
                    pass
            return found
    return {}


def lines(text: str) -> list[str]:
    """Non-empty, non-comment lines, with backslash continuations joined (setup.cfg markers use them)."""
    joined = re.sub(r"\\\s*\n\s*", " ", str(text))
    return [line.split(" #")[0].strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def str_list(value) -> list[str]:
    if isinstance(value, str):
        return lines(value)
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


def requirements_file(path: Path, root: Path, depth: int = 0) -> list[str]:
    """Requirement lines of a pip requirements file; -r includes followed (inside the repo only)."""
    try:
        if depth > 5 or not path.resolve().is_relative_to(root.resolve()) or not path.is_file():
            return []
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in lines(text):
        line = line.split(" --hash")[0].strip()
        if line.startswith(("-r ", "--requirement ")):
            out += requirements_file(path.parent / line.split(None, 1)[1], root, depth + 1)
        elif line.startswith(("-", ".", "/")) or "://" in line or line.startswith("git+"):
            continue
        else:
            out.append(line)
    return out
