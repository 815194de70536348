"""Where the training process reports: the terminal by default, or a reporter the launcher names.

The `training_run` asset launches the trainer with `--reporter resources.pipes_reporter:open_pipes_reporter`,
which reports to Dagster Pipes; the core never imports Dagster (or its Pipes protocol package)
itself — it only calls the context manager it was told to use. Only rank 0 reports: torchrun's
other ranks inherit the launcher's environment but must not talk to the orchestrator.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator


class Reporter:
    """Log lines, warnings and a final summary; this one writes to the terminal."""

    def log(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    def warn(self, message: str) -> None:
        print(f"WARNING: {message}", file=sys.stderr, flush=True)

    def done(self, metadata: dict) -> None:
        pass


class Silent(Reporter):
    """Ranks other than 0: warnings only."""

    def log(self, message: str) -> None:
        pass


@contextlib.contextmanager
def open_reporter(rank: int, spec: str | None = None) -> Iterator[Reporter]:
    """The reporter for this rank; `spec` (`module:function`) names a context manager yielding one."""
    if rank != 0:
        yield Silent()
        return
    if not spec:
        yield Reporter()
        return
    module, _, name = spec.partition(":")
    with getattr(importlib.import_module(module), name)() as reporter:
        yield reporter
