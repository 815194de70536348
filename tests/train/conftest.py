"""Fixtures for the training tests: a lake the `smoke` experiment can train on, and a reporter
that keeps what the trainer says.

`make_lake(name)` (or `shared_lake`, one per module) builds, under the test's tmp dir, a training
lake with the top-level `build_training_lake` fixture (see tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from factory.lake import Lake
from factory.train.report import Reporter


@pytest.fixture
def make_lake(tmp_path, build_training_lake) -> Callable[..., Lake]:
    """`make_lake(name, tokenizer=True, mix=True)`: a fresh training lake with home `tmp_path/name`."""
    return lambda name, **kw: build_training_lake(tmp_path / name, **kw)


@pytest.fixture(scope="module")
def shared_lake(tmp_path_factory, build_training_lake) -> Lake:
    """One training lake for a test module; its tests keep apart by run name (checkpoints, metrics,
    incidents, lineage and MLflow runs are all keyed by run). Always the embedded sqlite catalog:
    a module-scoped lake must not follow whichever `[rest]` test happens to build it first."""
    from factory.deploy import load_profile

    return build_training_lake(tmp_path_factory.mktemp("shared") / "home", profile=load_profile("embedded"))


class CollectingReporter(Reporter):
    """A `Reporter` that keeps every log line, warning and the final summary."""

    def __init__(self):
        self.logs: list[str] = []
        self.warnings: list[str] = []
        self.summary: dict | None = None

    def log(self, message: str) -> None:
        self.logs.append(message)

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def done(self, metadata: dict) -> None:
        self.summary = metadata


@pytest.fixture
def reporter() -> CollectingReporter:
    return CollectingReporter()


@pytest.fixture
def training_env(monkeypatch) -> Iterator[pytest.MonkeyPatch]:
    """No fault injection and no tracker overrides from the developer's shell, and one intra-op
    thread here and in child processes (`OMP_NUM_THREADS`, which Pipes passes on); yields
    `monkeypatch` for the test's own variables.

    One thread because these tests run on small shared CPUs: with another busy process on a
    2-core machine, two OpenMP threads that spin-wait on each other made smoke steps 3-10x slower
    (0.9 s vs 3-13 s measured) than a single thread."""
    for name in ("FACTORY_FAULTS", "FACTORY_TRACKER_BACKENDS", "FACTORY_MLFLOW_TRACKING_URI", "FACTORY_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield monkeypatch
    finally:
        torch.set_num_threads(threads)
