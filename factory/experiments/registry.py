"""Discovery of experiments and sweeps: the files under `configs/experiments/` and `configs/sweeps/`
as they are on disk *now*.

An experiment is a public function of a module in `configs/experiments/` that returns an
`ExperimentConfig`; a sweep, one in `configs/sweeps/` that returns a `SweepConfig`. Variants call
their base (`smoke().derive(...)`), so a module may import another experiment module (imported
functions belong to their own file and are not found twice). Which functions are called:
- annotated `-> ExperimentConfig`: always; raising or returning anything else is an error;
- not annotated, or annotated with a name the file does not define (`-> ExperimentConfg`): called
  too, so a forgotten or misspelt annotation does not hide an experiment. It is found when it
  returns one; raising, or returning None (a forgotten `return`), is an error; returning other
  data means it is a helper and is left alone;
- annotated with anything else (`-> ModelConfig`, a sweep file's base `-> ExperimentConfig`) or
  private (`_name`): a helper, never called. A function that needs arguments is never called
  (an error when it is annotated as an experiment).

Why a fresh import every time: the experiment sensor runs in a long-lived code server, and a
researcher edits a file and expects the next tick to see the edit. A normal re-import would
reuse `sys.modules` and could even read a stale `.pyc` (its timestamp has one-second
resolution, so an edit that keeps the file size within the same second goes unseen). Discovery
purges the config packages from `sys.modules` and imports them through a finder that compiles
each file's current source, never bytecode.

A function that raises or returns an invalid config does not hide the others: discovery returns
what it found and one error per broken function, naming the file, the function and the problem.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.abc
import importlib.util
import inspect
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from factory.experiments.spec import ExperimentConfig, ExperimentError, validation_message
from factory.home import CHECKOUT

EXPERIMENTS_DIR = CHECKOUT / "configs" / "experiments"
SWEEPS_DIR = CHECKOUT / "configs" / "sweeps"
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Found:
    """One discovered config and the function that made it (`configs/experiments/smoke.py:smoke`)."""

    name: str
    config: object
    source: str


@dataclass
class Discovery:
    found: dict[str, Found] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def get(self, name: str, what: str, where: Path):
        if name not in self.found:
            have = ", ".join(sorted(self.found)) or "none"
            problems = f"; broken files: {' | '.join(self.errors)}" if self.errors else ""
            raise ExperimentError(f"no {what} {name!r} in {where} (have: {have}){problems}")
        return self.found[name].config


class _SourceFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `<package>` and `<package>.<module>` from a directory, compiling the current source."""

    def __init__(self, packages: dict[str, Path]):
        self.packages = packages

    def find_spec(self, fullname, path=None, target=None):
        for package, directory in self.packages.items():
            if fullname == package:
                file, is_pkg = directory / "__init__.py", True
            elif fullname.startswith(package + ".") and "." not in fullname[len(package) + 1:]:
                file, is_pkg = directory / f"{fullname[len(package) + 1:]}.py", False
            else:
                continue
            if not file.exists() and not is_pkg:
                return None
            spec = importlib.util.spec_from_loader(fullname, self, origin=str(file), is_package=is_pkg)
            if is_pkg:
                spec.submodule_search_locations = [str(directory)]
            return spec
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        path = Path(module.__spec__.origin)
        module.__file__ = str(path)
        if path.exists():
            exec(compile(path.read_bytes(), str(path), "exec"), module.__dict__)


def _package_for(directory: Path) -> str:
    """`configs.experiments` for the checkout's directory; a private name for any other."""
    directory = directory.resolve()
    for name, known in (("configs.experiments", EXPERIMENTS_DIR), ("configs.sweeps", SWEEPS_DIR)):
        if directory == known.resolve():
            return name
    return f"_factory_configs_{abs(hash(str(directory))):x}"


@contextmanager
def _fresh(directory: Path):
    packages = {_package_for(d): d for d in {EXPERIMENTS_DIR, SWEEPS_DIR, directory}}
    with _LOCK:
        for name in [m for m in sys.modules if any(m == p or m.startswith(p + ".") for p in packages)]:
            del sys.modules[name]
        importlib.invalidate_caches()
        finder = _SourceFinder(packages)
        sys.meta_path.insert(0, finder)
        try:
            yield _package_for(directory)
        finally:
            sys.meta_path.remove(finder)


def _claim(fn, cls: type) -> str:
    """What `fn`'s return annotation says: "yes" (it is `cls`), "no" (something else: a helper),
    "none" (no annotation) or "unknown" (a name the file does not define, e.g. a typo)."""
    annotation = inspect.signature(fn).return_annotation
    if annotation is inspect.Signature.empty:
        return "none"
    if annotation is cls or annotation == cls.__name__:
        return "yes"
    if not isinstance(annotation, str):
        return "no"
    try:  # `from __future__ import annotations` leaves a string: resolve it as typing would
        resolved = eval(annotation, fn.__globals__)  # noqa: S307 - the experiment file's own annotation
    except (NameError, AttributeError, SyntaxError, TypeError):
        return "unknown"
    return "yes" if resolved is cls else "no"


def _required(fn) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _not_a(cls: type, fn, claim: str, config) -> str | None:
    """Why `fn`'s result is an error, or None when it is a helper's data to leave alone."""
    got = f"returned {type(config).__name__}, not {cls.__name__}"
    if claim == "yes":
        return got
    if claim == "unknown":
        annotation = inspect.signature(fn).return_annotation
        close = difflib.get_close_matches(annotation.rpartition(".")[2], [cls.__name__], n=1)
        hint = f" (did you mean {cls.__name__}?)" if close else ""
        return f"annotated -> {annotation}, which the file does not define{hint}, and {got}"
    if config is None:
        return f"{got} (a missing `return`? make it private, `_{fn.__name__}`, if it is not one)"
    return None


def discover(directory: Path, cls: type, what: str) -> Discovery:
    """Every `cls` returned by a public function of a module in `directory`, and one error per
    function that looks like a failed attempt at one (see the module docstring)."""
    result = Discovery()
    if not directory.is_dir():
        result.errors.append(f"{directory}: not a directory")
        return result
    with _fresh(directory) as package:
        for path in sorted(directory.glob("*.py")):
            if path.name.startswith("_"):
                continue
            try:
                module = importlib.import_module(f"{package}.{path.stem}")
            except Exception as e:  # a broken file must not hide the others
                result.errors.append(f"{path.name}: cannot import: {type(e).__name__}: {e}")
                continue
            for fname, fn in inspect.getmembers(module, inspect.isfunction):
                if fname.startswith("_") or fn.__module__ != module.__name__:
                    continue
                claim = _claim(fn, cls)
                if claim == "no":
                    continue
                source = f"{path.name}:{fname}"
                required = _required(fn)
                if required:
                    if claim != "none":
                        result.errors.append(f"{source}: takes arguments ({', '.join(required)}); "
                                             f"{what}s are functions without arguments")
                    continue
                try:
                    config = fn()
                except ValidationError as e:
                    part = "" if e.title == cls.__name__ else f" ({e.title})"
                    result.errors.append(f"{source}: invalid {what}{part}: {validation_message(e)}")
                    continue
                except Exception as e:  # a broken function must not hide the others
                    result.errors.append(f"{source}: {type(e).__name__}: {e}")
                    continue
                if not isinstance(config, cls):
                    problem = _not_a(cls, fn, claim, config)
                    if problem:
                        result.errors.append(f"{source}: {problem}")
                    continue
                if config.name in result.found:
                    result.errors.append(f"{source}: {what} name {config.name!r} is already defined by "
                                         f"{result.found[config.name].source}")
                    continue
                result.found[config.name] = Found(config.name, config, source)
    return result


def discover_experiments(directory: Path | None = None) -> Discovery:
    return discover(directory or EXPERIMENTS_DIR, ExperimentConfig, "experiment")


def discover_sweeps(directory: Path | None = None) -> Discovery:
    from factory.experiments.sweep import SweepConfig

    return discover(directory or SWEEPS_DIR, SweepConfig, "sweep")


def get_experiment(name: str, directory: Path | None = None) -> ExperimentConfig:
    return discover_experiments(directory).get(name, "experiment", directory or EXPERIMENTS_DIR)


def discover_rl_experiments(directory: Path | None = None) -> Discovery:
    """The functions in configs/experiments annotated `-> RLConfig` (RL runs are experiments too)."""
    from factory.posttrain.rl.config import RLConfig

    return discover(directory or EXPERIMENTS_DIR, RLConfig, "RL experiment")


def get_rl_experiment(name: str, directory: Path | None = None):
    return discover_rl_experiments(directory).get(name, "RL experiment", directory or EXPERIMENTS_DIR)


def discover_sft_experiments(directory: Path | None = None) -> Discovery:
    """The functions in configs/experiments annotated `-> SFTConfig`."""
    from factory.posttrain.sft.config import SFTConfig

    return discover(directory or EXPERIMENTS_DIR, SFTConfig, "SFT experiment")


def get_sft_experiment(name: str, directory: Path | None = None):
    return discover_sft_experiments(directory).get(name, "SFT experiment", directory or EXPERIMENTS_DIR)


def get_sweep(name: str, directory: Path | None = None):
    return discover_sweeps(directory).get(name, "sweep", directory or SWEEPS_DIR)
