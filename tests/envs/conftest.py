"""Fixtures of the environment-builder tests: `registry`, the local package mirror (envs_fixtures.py)."""

from __future__ import annotations

import pytest
from envs_fixtures import mirror_index

from factory.envs.registry import RegistryConfig


@pytest.fixture(scope="session")
def registry() -> RegistryConfig:
    return RegistryConfig(index_url=mirror_index())
