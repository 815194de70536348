"""Run names as people type them: an experiment's name means its latest run.

Runs are named `<experiment>-<hash8>` (the identity hash of the validated experiment), so the
name a researcher remembers, `smoke`, is never a run id. Wherever the CLI expects a run, a
checkpoint (`<run>@<step>`, `ckpt/...`) or an export (`export/...`), `resolve_run` accepts the
experiment's name too and picks its run with the newest checkpoint, and `resolve_ref` rewrites the
run part of a checkpoint or export id the same way; both return a note that says which run was
meant, so the choice is never silent. An id that matches nothing gets the closest known ones.

The core lookups (`find_checkpoint`, `find_export`, lineage) stay exact: assets and sensors pass
real ids, and only what a person typed goes through here.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from factory import suggest
from factory.lake import Lake
from factory.train import checkpoint as ckpt

_HASHED = re.compile(r"(?P<experiment>.+)-[0-9a-f]{8}")


class UnknownRun(ValueError):
    """A run name that is neither a run in `train.checkpoints` nor an experiment with runs there."""


@dataclass(frozen=True)
class Resolved:
    value: str  # the run (or checkpoint / export id) the text meant
    note: str | None = None  # what was resolved, when it was not the text itself


def runs(lake: Lake) -> list[str]:
    """Every run with a checkpoint, oldest newest-checkpoint first."""
    newest: dict[str, object] = {}
    for row in ckpt.checkpoints(lake):
        newest[row["run"]] = max(newest.get(row["run"], row["created_at"]), row["created_at"])
    return sorted(newest, key=lambda run: (newest[run], run))


def _experiment_of(name: str) -> list[str]:
    """A run or checkpoint id as its experiment would be typed (`ckpt/smoke-1a2b3c4d@8` -> `smoke`,
    `ckpt/smoke@8`), if its run is hashed."""
    prefix = next((p for p in ("ckpt/", "export/") if name.startswith(p)), "")
    run, at, step = name.removeprefix(prefix).partition("@")
    found = _HASHED.fullmatch(run)
    return [found["experiment"], f"{prefix}{found['experiment']}{at}{step}"] if found else []


def closest(text: str, known: list[str]) -> str:
    """`; closest: ...` runs or checkpoint ids to `text`, else the newest few, for an error message."""
    near = suggest.closest(text, known, forms=_experiment_of)
    if near:
        return "; closest: " + ", ".join(near)
    return f"; newest of {len(known)}: " + ", ".join(known[-3:]) if known else ""


def resolve_run(lake: Lake, text: str, also: tuple[str, ...] = ()) -> Resolved:
    """`text` if it is a run (with a checkpoint, or among `also`: e.g. runs with eval results), else
    the latest run of the experiment named `text`."""
    if text in also:
        return Resolved(text)
    known = runs(lake)
    if text in known:
        return Resolved(text)
    of_experiment = [r for r in known if (m := _HASHED.fullmatch(r)) and m["experiment"] == text]
    if of_experiment:
        latest = of_experiment[-1]
        others = f" of {len(of_experiment)}" if len(of_experiment) > 1 else ""
        return Resolved(latest, f"{text} -> {latest} (experiment {text}'s latest run{others})")
    if not known:
        raise UnknownRun(f"run {text!r}: no run has a checkpoint yet (train.checkpoints is empty)")
    raise UnknownRun(f"run {text!r}: not a run or an experiment with checkpoints{closest(text, known)}")


def resolve_ref(lake: Lake, text: str) -> Resolved:
    """A checkpoint or export id as typed (`smoke@120`, `ckpt/smoke@120`, `export/smoke@120`) with
    its run part resolved when it names an experiment; anything else (a real id, a path, an unknown
    run) comes back unchanged, for the exact lookup to accept or refuse with the closest ids."""
    prefix = next((p for p in ("ckpt/", "export/") if text.startswith(p)), "")
    run, at, step = text.removeprefix(prefix).rpartition("@")
    if not at or not run or "/" in run or not step.isdigit():
        return Resolved(text)
    try:
        found = resolve_run(lake, run)
    except UnknownRun:
        return Resolved(text)
    return Resolved(f"{prefix}{found.value}@{step}", found.note)


def as_typed(lake: Lake, text: str, *, run: bool = False, also: tuple[str, ...] = ()) -> str:
    """The id `text` means (a run when `run`, else a checkpoint or export id), saying any
    resolution on stderr (stdout may be JSON): the CLI's one entry point for what a person typed."""
    found = resolve_run(lake, text, also) if run else resolve_ref(lake, text)
    if found.note:
        print(found.note, file=sys.stderr)
    return found.value
