"""Content digests of directory trees: what makes an environment content-addressed.

`tree_digest` hashes sorted relative paths, each file's bytes, each symlink's target and each
file's exec bit, skipping caches (`__pycache__`, `.pytest_cache`, `.git`). Nothing else enters:
not mtimes, owners or directory modes, which differ between two builds of the same thing (a
sandbox build runs as a throwaway uid; a copy gets a fresh mtime). So the same revision built from
the same wheelhouse has the same digest on any host, which a test proves.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

SKIPPED = frozenset({"__pycache__", ".pytest_cache", ".git", ".hg", ".tox", ".nox", ".mypy_cache"})


def tree_digest(root: Path, *, into: "hashlib._Hash | None" = None, label: str = "") -> str:
    """sha256 hex of the tree at `root` (see the module docstring); `into` feeds an outer hash instead."""
    h = into if into is not None else hashlib.sha256()
    root = Path(root)
    entries: list[str] = []
    for directory, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED)
        rel_dir = os.path.relpath(directory, root)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(directory, d))]:
            if name.endswith(".pyc"):
                continue
            entries.append(os.path.normpath(os.path.join(rel_dir, name)))
    for rel in sorted(set(entries)):
        path = root / rel
        h.update(f"{label}\0{rel}\0".encode())
        if path.is_symlink():
            h.update(b"L" + os.readlink(path).encode() + b"\0")
        else:
            h.update(b"X" if os.stat(path).st_mode & 0o111 else b"F")
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            h.update(b"\0")
    return h.hexdigest()


def environment_digest(venv: Path, src: Path, lock_bytes: bytes) -> str:
    """The digest of a built environment: its venv tree, its source tree and its lock."""
    h = hashlib.sha256()
    tree_digest(venv, into=h, label="venv")
    tree_digest(src, into=h, label="src")
    h.update(b"lock\0" + lock_bytes)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
