"""The `Tracker` interface every backend implements, and `MultiTracker`, which fans calls out.

A tracker receives a run's parameters, metrics, texts and files. `MultiTracker` is what the
trainer holds: it sends each call to every backend in order, owns the logging cadence (`due`,
from `TrackerConfig.log_every`), and with no backends at all it is the inert tracker of the
ranks that do not report (only rank 0 does), so the loop has no `if tracker` branches.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, Iterator, Mapping, Sequence

log = logging.getLogger(__name__)

STATUSES = ("FINISHED", "FAILED", "KILLED")


class Tracker:
    """Where a run's parameters, metrics, texts and files go. Subclasses implement what they store;
    the rest is a no-op. Usable as a context manager: `finish` gets FINISHED, KILLED (Ctrl-C /
    SystemExit) or FAILED (any other exception)."""

    def start(self, run: str, params: dict, tags: dict) -> None:
        raise NotImplementedError

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def log_text(self, name: str, text: str) -> None:
        """Store `text` as a file called `name` (e.g. the experiment's Markdown card)."""

    def log_artifact(self, path: str) -> None:
        """Store the file or directory at `path`."""

    def flush(self) -> None:
        """Make everything logged so far durable."""

    def finish(self, status: str = "FINISHED") -> None:
        raise NotImplementedError

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish("FINISHED")
        else:
            self.finish("KILLED" if issubclass(exc_type, (KeyboardInterrupt, SystemExit)) else "FAILED")


def check_status(status: str) -> str:
    if status not in STATUSES:
        raise ValueError(f"tracker status {status!r} is not one of {STATUSES}")
    return status


def plain(value: Any) -> Any:
    """Pydantic models (configs) as JSON-able dicts; everything else unchanged."""
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested params as `model.d_model`-style keys with string values (JSON for non-strings, so
    `True` reads `true`, `None` reads `null` and lists keep their brackets)."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        value = plain(value)
        if isinstance(value, Mapping) and value:
            flat.update(flatten_params(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value, default=str)
    return flat


def finite(metrics: Mapping[str, float]) -> dict[str, float]:
    """The finite metrics (see the `factory.train.trackers` docstring for who drops NaN and why)."""
    return {k: float(v) for k, v in metrics.items() if math.isfinite(v)}


def chunks(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


class MultiTracker(Tracker):
    """Sends every call to each tracker in order. `flush` and `finish` reach every tracker even
    when one fails (a broken MLflow store must not lose the Iceberg rows), then raise the first
    error. `due(step)` says whether `step` is one the config wants logged (`log_every`)."""

    def __init__(self, trackers: Sequence[Tracker] = (), *, log_every: int = 1):
        self.trackers = list(trackers)
        self.log_every = log_every

    def due(self, step: int) -> bool:
        return step % self.log_every == 0

    def start(self, run: str, params: dict, tags: dict) -> None:
        for tracker in self.trackers:
            tracker.start(run, params, tags)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for tracker in self.trackers:
            tracker.log_metrics(step, metrics)

    def log_text(self, name: str, text: str) -> None:
        for tracker in self.trackers:
            tracker.log_text(name, text)

    def log_artifact(self, path: str) -> None:
        for tracker in self.trackers:
            tracker.log_artifact(path)

    def flush(self) -> None:
        self._each(lambda t: t.flush())

    def finish(self, status: str = "FINISHED") -> None:
        check_status(status)
        self._each(lambda t: t.finish(status))

    def _each(self, call) -> None:
        errors = []
        for tracker in self.trackers:
            try:
                call(tracker)
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the others ran
                log.error("%s failed: %s", type(tracker).__name__, exc)
                errors.append(exc)
        if errors:
            raise errors[0]
