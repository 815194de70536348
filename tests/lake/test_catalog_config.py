"""Catalog selection by config: embedded sqlite defaults under FACTORY_HOME, REST + S3 properties
for the scale-out catalog, and field-named errors for bad configs. CPU, no servers."""

import pytest

from factory.lake import CatalogConfig, Lake, LakeError


def test_embedded_defaults_live_under_factory_home(tmp_path):
    props = CatalogConfig().catalog_properties(tmp_path)
    assert props == {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / 'lake' / 'catalog.db'}",
        "warehouse": (tmp_path / "lake" / "warehouse").as_uri(),
    }
    lake = Lake.open(home=tmp_path)
    assert lake.home == tmp_path.resolve() and lake.tables() == []


def test_factory_home_comes_from_the_environment_at_call_time(tmp_path, monkeypatch):
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "elsewhere"))
    assert Lake.open().home == (tmp_path / "elsewhere").resolve()
    assert (tmp_path / "elsewhere" / "lake" / "warehouse").is_dir()


def test_rest_catalog_takes_endpoint_and_object_store_properties(tmp_path):
    config = CatalogConfig(
        kind="rest", uri="http://127.0.0.1:8181", warehouse="s3://lake/warehouse",
        properties={"s3.endpoint": "http://127.0.0.1:9000", "s3.access-key-id": "k"},
    )
    assert config.catalog_properties(tmp_path) == {
        "type": "rest", "uri": "http://127.0.0.1:8181", "warehouse": "s3://lake/warehouse",
        "s3.endpoint": "http://127.0.0.1:9000", "s3.access-key-id": "k",
    }
    with pytest.raises(LakeError, match="kind='rest' needs `uri`"):
        CatalogConfig(kind="rest").catalog_properties(tmp_path)


def test_bad_catalog_config_names_the_field():
    with pytest.raises(ValueError, match="kind"):
        CatalogConfig(kind="hive")
    with pytest.raises(ValueError, match="catalog_uri"):
        CatalogConfig(catalog_uri="x")
