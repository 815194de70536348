"""Mix specs, one YAML file per mix (`<name>.yaml`, validated by `factory.mix.MixSpec`).

Register a version with the `mix` asset (partition = mix name) or `factory mix register <name>`.
"""

from __future__ import annotations

from pathlib import Path

from factory.mix import MixError, MixSpec, load_spec

DIR = Path(__file__).parent


def mix_names() -> list[str]:
    return sorted(p.stem for p in DIR.glob("*.yaml"))


def mix_spec(name: str) -> MixSpec:
    path = DIR / f"{name}.yaml"
    if not path.exists():
        raise MixError(f"no mix spec {name!r} in {DIR} (have: {', '.join(mix_names())})")
    return load_spec(path)
