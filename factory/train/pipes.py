"""Reporting from the training process: to Dagster Pipes when launched by the `training_run`
asset, to the terminal otherwise.

`dagster_pipes` is the small, dependency-free protocol package Dagster ships for code running
in *other* processes; it is imported only when the launcher set up a Pipes context, and only on
rank 0 (torchrun's other ranks inherit the environment but must not talk to the orchestrator).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


class Reporter:
    """Log lines and a final summary; the terminal implementation."""

    def log(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    def warn(self, message: str) -> None:
        print(f"WARNING: {message}", file=sys.stderr, flush=True)

    def done(self, metadata: dict) -> None:
        pass


class Silent(Reporter):
    def log(self, message: str) -> None:
        pass

    def warn(self, message: str) -> None:
        print(f"WARNING: {message}", file=sys.stderr, flush=True)


class PipesReporter(Reporter):
    def __init__(self, pipes):
        self.pipes = pipes

    def log(self, message: str) -> None:
        self.pipes.log.info(message)

    def warn(self, message: str) -> None:
        self.pipes.log.warning(message)

    def done(self, metadata: dict) -> None:
        self.pipes.report_asset_materialization(metadata={k: _typed(v) for k, v in metadata.items()})


def _typed(value):
    """Pipes metadata with its type where inference would get it wrong (Markdown, JSON, null)."""
    if value is None:
        return {"raw_value": None, "type": "null"}
    if isinstance(value, str) and value.startswith("!["):
        return {"raw_value": value, "type": "md"}
    if isinstance(value, (list, dict)):
        return {"raw_value": value, "type": "json"}
    return value


@contextlib.contextmanager
def open_reporter(rank: int) -> Iterator[Reporter]:
    if rank != 0:
        yield Silent()
        return
    if "DAGSTER_PIPES_CONTEXT" not in os.environ:
        yield Reporter()
        return
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:
        yield PipesReporter(pipes)
