"""Fixtures for the mix tests: three small tables of real standard-library text in a tmp lake (built
with the shared `corpus` fixture), a byte-level BPE trained on them, and a registered mix. Runs on
CPU in a few seconds. A module that opts into both catalogs (`catalog`) gets `mix_lake` on the
test's catalog kind: one session lake per kind, the REST one in its own warehouse on the
session's SeaweedFS."""

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


def _build_mix_lake(lake: Lake, corpus, documents) -> Lake:
    for table in PACKAGES:
        corpus.write(lake, table, documents(table), chunks=3)
    train_tokenizer(lake, TokenizerConfig(name="default", vocab_size=512, sources=list(PACKAGES),
                                          sample_bytes_per_source=300_000, measure_bytes_per_source=50_000))
    register_mix_version(lake, spec())
    return lake


@pytest.fixture(scope="session")
def mix_lakes(tmp_path_factory, corpus, documents) -> Callable:
    """`mix_lakes(kind, rest_profile=None)`: the session's mix lake on catalog `kind`, built once."""
    built: dict[str, Lake] = {}

    def get(kind: str, rest_profile=None) -> Lake:
        if kind not in built:
            home = tmp_path_factory.mktemp(f"mixlake-{kind}")
            if kind == "sql":
                lake = Lake.open(home=home)
            else:
                from factory.deploy import open_lake
                from factory.deploy.seaweed import create_warehouse

                lake = open_lake(create_warehouse(rest_profile, "mixlake"), home)
            built[kind] = _build_mix_lake(lake, corpus, documents)
        return built[kind]

    return get


@pytest.fixture
def mix_lake(request, mix_lakes) -> Lake:
    """A lake with refined.alpha/beta/gamma (three appends each), tokenizer `default` and mix `trio` v1
    (read-only: tests that register versions use their own mix names); on the test's `catalog`."""
    if "catalog" not in request.fixturenames or request.getfixturevalue("catalog").kind == "sql":
        return mix_lakes("sql")
    return mix_lakes("rest", request.getfixturevalue("rest_profile"))
