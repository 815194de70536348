"""Fixtures for the mix tests: three small tables of real standard-library text in a tmp lake (built
with the shared `corpus` fixture), a byte-level BPE trained on them, and a registered mix. Runs on
CPU in a few seconds."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from factory.lake import Lake
from factory.mix import MixSpec, register_mix_version
from factory.tokenize import TokenizerConfig, train_tokenizer

# three code sources, each the modules of different stdlib packages
PACKAGES = {"refined.alpha": ["json", "email", "xml"], "refined.beta": ["asyncio", "concurrent"],
            "refined.gamma": ["http", "urllib", "logging", "importlib"]}


def spec(name: str = "trio", **overrides) -> MixSpec:
    fields = {"name": name, "seq_len": 32, "sources": [
        {"table": "refined.alpha", "weight": 0.5}, {"table": "refined.beta", "weight": 0.3},
        {"table": "refined.gamma", "weight": 0.2}]}
    return MixSpec.model_validate({**fields, **overrides})


@pytest.fixture(scope="session")
def documents(corpus) -> Callable[[str], list[dict]]:
    """`documents(table)`: the rows of one of the PACKAGES tables (its packages' modules as code)."""
    return lambda table: corpus.code(table, PACKAGES[table])


@pytest.fixture(scope="session")
def mix_lake(tmp_path_factory, corpus, documents) -> Lake:
    """A lake with refined.alpha/beta/gamma (three appends each), tokenizer `default` and mix `trio` v1
    (read-only: tests that register versions use their own mix names)."""
    lake = Lake.open(home=tmp_path_factory.mktemp("mixlake"))
    for table in PACKAGES:
        corpus.write(lake, table, documents(table), chunks=3)
    train_tokenizer(lake, TokenizerConfig(name="default", vocab_size=512, sources=list(PACKAGES),
                                          sample_bytes_per_source=300_000, measure_bytes_per_source=50_000))
    register_mix_version(lake, spec())
    return lake
