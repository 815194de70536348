"""What `python -m factory.posttrain.sft` and `python -m factory.posttrain.rl` share: the arguments, and
loading a config (an experiment function's or JSON) and the lake, checked before anything starts."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from pydantic import ValidationError

from factory.overrides import validation_message


def parser(prog: str, doc: str, kind: str) -> argparse.ArgumentParser:
    """The shared arguments; `kind` names the config class (SFTConfig, RLConfig)."""
    out = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    which = out.add_mutually_exclusive_group(required=True)
    which.add_argument("--experiment", help=f"a function in configs/experiments returning an {kind}")
    which.add_argument("--config-json", help=f"a validated {kind} as JSON")
    out.add_argument("--run-id", default="", help="Dagster run id, for lineage")
    out.add_argument("--home", help="FACTORY_HOME")
    out.add_argument("--deploy", help="deployment profile (default: the one handed down, else embedded)")
    out.add_argument("--reporter", help="module:function, a context manager yielding a Reporter")
    return out


def load(args, prog: str, cls, experiment: Callable, check: Callable, errors: tuple[type[Exception], ...]):
    """(config, profile, lake, faults), or None after printing the error (the caller exits 2): the config
    from `--config-json` or `experiment(name)`, the lake of the profile, `check(config, lake)` passed."""
    from factory import settings
    from factory.deploy import load_profile, open_lake
    from factory.experiments.spec import ExperimentError
    from factory.lake import LakeError

    try:
        config = cls.model_validate_json(args.config_json) if args.config_json else experiment(args.experiment)
        faults = settings.faults()
        profile = load_profile(args.deploy)
        lake = open_lake(profile, home=args.home)
        check(config, lake)
    except ValidationError as e:
        print(f"{prog.removeprefix('python -m ')}: error: {validation_message(e)}", file=sys.stderr)
        return None
    except (*errors, ExperimentError, LakeError, KeyError, ValueError) as e:
        print(f"{prog.removeprefix('python -m ')}: error: {e}", file=sys.stderr)
        return None
    return config, profile, lake, faults
