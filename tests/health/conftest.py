"""Fixtures for the factory-health tests: metrics switched on into a tmp multiprocess directory,
and `scrape(dir)`, the merged series as the exporter would serve them."""

from __future__ import annotations

import pytest

from factory.health import metrics


@pytest.fixture
def metrics_on(tmp_path, monkeypatch):
    """FACTORY_METRICS=1 with PROMETHEUS_MULTIPROC_DIR under tmp_path; off again afterwards."""
    path = tmp_path / "prom"
    monkeypatch.setenv("FACTORY_METRICS", "1")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(path))
    metrics.reset()
    yield path
    monkeypatch.delenv("FACTORY_METRICS")
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics.reset()


def scrape(path, collectors=()) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted label pairs): value} of every series under `path`."""
    from factory.health.exporter import build_registry

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in build_registry(path, collectors).collect() for s in family.samples}


@pytest.fixture(name="scrape")
def scrape_fixture():
    return scrape
