"""Shared fixtures. Everything here is real and local: a pyiceberg `SqlCatalog` on sqlite with a
`file://` warehouse under the test's own `tmp_path` — no servers, no network, runs on CPU."""

from __future__ import annotations

import pytest

from factory.lake import Lake


@pytest.fixture
def lake(tmp_path):
    """An empty embedded lake with `FACTORY_HOME` = `tmp_path` (its state lives in `tmp_path/lake`;
    put test inputs in another subdirectory)."""
    return Lake.open(home=tmp_path)
