"""Finding the active profile and handing it on.

The profile is chosen by one setting, read when a process first asks: `--deploy` on the CLI,
else `FACTORY_DEPLOY` (a function name in `configs/deploy`, or a `.yaml`/`.json` file), else
`embedded`. A process the factory starts (the trainer through Pipes, `factory sweep run`'s cells,
jobs/queue_runs.py) receives the profile it must use explicitly, as JSON in `FACTORY_DEPLOY_JSON`,
which wins over the name: a child never re-resolves the name in a different environment and
lands on another catalog.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import yaml
from pydantic import ValidationError

from factory import settings
from factory.deploy.config import DeployConfig, DeployError

DEFAULT = "embedded"


def _field_errors(where: str, error: ValidationError) -> DeployError:
    lines = [f"{'.'.join(str(p) for p in e['loc']) or '(profile)'}: {e['msg']}" for e in error.errors()]
    return DeployError(f"deploy profile {where}: " + "; ".join(lines))


def profile_names() -> list[str]:
    """The profiles shipped in configs/deploy (public functions annotated `-> DeployConfig`)."""
    module = importlib.import_module("configs.deploy")
    return sorted(name for name, fn in vars(module).items()
                  if inspect.isfunction(fn) and not name.startswith("_")
                  and inspect.signature(fn).return_annotation in (DeployConfig, "DeployConfig"))


def load_profile(name: str | None = None) -> DeployConfig:
    """The profile `name` (a configs/deploy function or a .yaml/.json file); without a name, the
    one handed down in FACTORY_DEPLOY_JSON, else FACTORY_DEPLOY, else `embedded`."""
    if name is None and (handed := settings.deploy_json()):
        try:
            return DeployConfig.model_validate_json(handed)
        except ValidationError as e:
            raise _field_errors(f"from {settings.DEPLOY_JSON}", e) from None
    name = name or settings.deploy_name() or DEFAULT
    if name.endswith((".yaml", ".yml", ".json")):
        path = Path(name)
        try:
            data = yaml.safe_load(path.read_text()) if path.suffix != ".json" else json.loads(path.read_text())
        except OSError as e:
            raise DeployError(f"deploy profile {name}: cannot read the file ({e.strerror})") from None
        except (yaml.YAMLError, json.JSONDecodeError) as e:
            raise DeployError(f"deploy profile {name}: not valid {path.suffix[1:].upper()}: {e}") from None
        if not isinstance(data, dict):
            raise DeployError(f"deploy profile {name}: expected a mapping of sections, got {type(data).__name__}")
        try:
            return DeployConfig.model_validate({"name": path.stem, **data})
        except ValidationError as e:
            raise _field_errors(name, e) from None
    names = profile_names()
    if name not in names:
        raise DeployError(f"unknown deploy profile {name!r}: configs/deploy has {', '.join(names)} "
                          f"(or give a .yaml/.json file)")
    try:
        return getattr(importlib.import_module("configs.deploy"), name)()
    except ValidationError as e:
        raise _field_errors(f"configs/deploy:{name}", e) from None


def profile_env(profile: DeployConfig) -> dict[str, str]:
    """The environment that hands `profile` to a child process (no secret values: they stay in
    the variables the profile names, which the child inherits)."""
    return {settings.DEPLOY_JSON: profile.model_dump_json(), settings.DEPLOY: profile.name}


def catalog_config(profile: DeployConfig):
    """The lake's `CatalogConfig` for `profile`, secrets resolved."""
    from factory.lake import CatalogConfig

    c = profile.catalog
    return CatalogConfig(kind=c.kind, name=c.name, uri=c.uri, warehouse=c.warehouse,
                         properties=c.properties_resolved())


def open_lake(profile: DeployConfig | None = None, home=None):
    """The lake of `profile` (default: the active one), with `home` for local state."""
    from factory.lake import Lake

    return Lake.open(catalog_config(profile or load_profile()), home=home)
