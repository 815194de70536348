"""The training process's side of Dagster Pipes: a `factory.train.report.Reporter` that sends
logs and the final materialization metadata to the run that launched it.

Named on the trainer's command line by the `training_run` asset (`--reporter
resources.pipes_reporter:open_pipes_reporter`); it imports only `dagster_pipes`, the small
protocol package meant for code running in other processes.
"""

import contextlib
from collections.abc import Iterator

from dagster_pipes import open_dagster_pipes

from factory.train.report import Reporter

SPEC = "resources.pipes_reporter:open_pipes_reporter"


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
def open_pipes_reporter() -> Iterator[PipesReporter]:
    with open_dagster_pipes() as pipes:
        yield PipesReporter(pipes)
