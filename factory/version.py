"""Identity of the code, the environment and a config — the three things lineage pins.

- code version: the checkout's git SHA plus a `-dirty` flag when tracked files differ from it
  (`FACTORY_CODE_VERSION` overrides it for images built without `.git`);
- environment lock hash: a hash over every installed distribution and its version, so two runs
  with the same code but a different `torch` do not look identical;
- config hash: a hash over the canonical JSON of a config, so "same config" is checkable.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
from importlib import metadata
from typing import Any

from factory.home import CHECKOUT
from factory import settings


def code_version() -> str:
    """`<git sha>` or `<git sha>-dirty`; `unknown` outside a git checkout."""
    if override := settings.code_version_override():
        return override
    return _git_code_version()


@functools.cache
def _git_code_version() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}-dirty" if dirty else sha


@functools.cache
def env_lock_hash() -> str:
    """sha256 (16 hex chars) over sorted `name==version` of every installed distribution."""
    pins = sorted(
        {f"{(d.metadata['Name'] or '').lower()}=={d.version}" for d in metadata.distributions()}
    )
    return hashlib.sha256("\n".join(pins).encode()).hexdigest()[:16]


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the form every hash in the factory is taken over."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def config_hash(config: Any) -> str:
    """sha256 (16 hex chars) of a config's canonical JSON (pydantic models, dicts, lists)."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()[:16]
