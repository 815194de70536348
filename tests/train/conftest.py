"""Fixtures for the training tests: a lake the `smoke` experiment can train on, and a reporter
that keeps what the trainer says.

`make_lake(name)` (or `shared_lake`, one per module) builds, under the test's tmp dir, a real
embedded lake (sqlite catalog, `file://` warehouse) holding refined.python_stdlib,
refined.site_packages and refined.package_docs made from standard-library text by the shared
`corpus` fixture, a 512-token BPE `default` trained on them, and mix `default` registered from
configs/mixes/default.yaml — what `configs.experiments.smoke()` asks for. ~3 s per lake on CPU.

The packages are chosen so that every one of the smoke experiment's 8 logical loader shards holds
training documents of every source (shards are drawn from document-id hashes; a source with an
empty shard fails the loader with "has no training documents in logical shard ...").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from factory.lake import Lake
from factory.train.report import Reporter

CODE = {"refined.python_stdlib": ["json", "email", "xml"],  # 55 modules
        "refined.site_packages": ["urllib", "http", "logging", "importlib"]}  # 37 modules
DOCS = "refined.package_docs"  # 40 module docstrings


def build_training_lake(home: Path, corpus, *, tokenizer: bool = True, mix: bool = True) -> Lake:
    """The refined tables at `home`, then (optionally) the tokenizer, then (optionally) mix `default` v1."""
    from configs.mixes import mix_spec
    from factory.mix import register_mix_version
    from factory.tokenize import TokenizerConfig, train_tokenizer

    lake = Lake.open(home=home)
    for table, packages in CODE.items():
        corpus.write(lake, table, corpus.code(table, packages))
    corpus.write(lake, DOCS, corpus.docstrings(DOCS, count=40))
    if tokenizer:
        train_tokenizer(lake, TokenizerConfig(name="default", vocab_size=512, sources=[*CODE, DOCS],
                                              sample_bytes_per_source=200_000, measure_bytes_per_source=50_000))
    if tokenizer and mix:
        register_mix_version(lake, mix_spec("default"))
    return lake


@pytest.fixture
def make_lake(tmp_path, corpus) -> Callable[..., Lake]:
    """`make_lake(name, tokenizer=True, mix=True)`: a fresh training lake with home `tmp_path/name`."""
    return lambda name, **kw: build_training_lake(tmp_path / name, corpus, **kw)


@pytest.fixture(scope="module")
def shared_lake(tmp_path_factory, corpus) -> Lake:
    """One training lake for a test module; its tests keep apart by run name (checkpoints, metrics,
    incidents, lineage and MLflow runs are all keyed by run)."""
    return build_training_lake(tmp_path_factory.mktemp("shared") / "home", corpus)


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
