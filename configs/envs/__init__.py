"""Repository sets: which repositories `factory envs build --repos NAME` builds.

Each entry of `REPO_SETS` is a function returning a `factory.envs.sources.RepoSet`; nothing is built
or fetched at import time. `corpus` (configs/envs/corpus.py) is the shipped corpus of real PyPI
sdists, `demo` the small subset `make demo` builds.
"""

from __future__ import annotations

from configs.envs import corpus as _corpus

REPO_SETS = {"demo": _corpus.demo, "corpus": _corpus.corpus}


def repo_set(name: str):
    """The repository set called `name` (ValueError naming the defined ones otherwise)."""
    if name not in REPO_SETS:
        raise ValueError(f"unknown repository set {name!r}; defined in configs/envs/: {sorted(REPO_SETS)}")
    return REPO_SETS[name]()
