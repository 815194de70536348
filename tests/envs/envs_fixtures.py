"""Helpers of the environment-builder tests (imported by conftest.py and the test modules): the local
package mirror they resolve against (never the network), fixture repositories written from dicts, and a
tiny sdist-only package in a mirror of its own.

The mirror is `$FACTORY_TEST_REGISTRY` (default `<checkout>/.cache/registry`), built once by
`factory envs mirror --repos demo --dest .cache/registry` (which `make setup` runs): the demo set's
sdists, their wheel closures, pytest and the build backends the fixtures use.
"""

from __future__ import annotations

import io
import os
import tarfile
import textwrap
from pathlib import Path

import pytest

from factory.envs.mirror import write_index

CHECKOUT = Path(__file__).resolve().parents[2]
MIRROR = Path(os.environ.get("FACTORY_TEST_REGISTRY") or CHECKOUT / ".cache" / "registry")
SETUPTOOLS = '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'


def mirror_index() -> str:
    """The test mirror's simple index URL; fails (never skips) naming the command that builds it."""
    if not (MIRROR / "simple" / "pytest" / "index.html").exists():
        pytest.fail(f"no test package mirror at {MIRROR}: build it with "
                    f"`.venv/bin/factory envs mirror --repos demo --dest {MIRROR}` (or set FACTORY_TEST_REGISTRY)")
    return (MIRROR / "simple").as_uri()


def write_repo(root: Path, files: dict[str, str]) -> Path:
    """A repository at `root` holding `files` ({relative path: text}, dedented)."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


def pyproject(name: str, *, deps: tuple[str, ...] = (), backend: str = SETUPTOOLS, extra: str = "") -> str:
    listed = ", ".join(f'"{d}"' for d in deps)
    return f'{backend}[project]\nname = "{name}"\nversion = "0.1"\ndependencies = [{listed}]\n{extra}'


def sdist_only_mirror(root: Path, name: str = "tinysdist") -> str:
    """A mirror holding one project, `name`, as an sdist only (no wheel): its index URL."""
    files = root / "files"
    files.mkdir(parents=True)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for rel, text in {"setup.py": "from setuptools import setup\nsetup(name=%r, version='0.1')\n" % name,
                          f"{name}.py": "X = 1\n"}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-0.1/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (files / f"{name}-0.1.tar.gz").write_bytes(buffer.getvalue())
    write_index(root)
    return (root / "simple").as_uri()
