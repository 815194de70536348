"""LakeResource resolves EnvVar settings (FACTORY_HOME, secrets) when a run asks, not at load,
and builds its catalog once. CPU, no servers."""

from pathlib import Path

from dagster import EnvVar, build_resources

from resources import LakeResource


def test_lake_resource_resolves_env_vars_when_a_run_asks(tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_FACTORY_HOME", str(tmp_path / "from-env"))
    monkeypatch.setenv("TEST_S3_SECRET", "s3cr3t")
    resource = LakeResource(home=EnvVar("TEST_FACTORY_HOME"), s3_secret_access_key=EnvVar("TEST_S3_SECRET"))
    with build_resources({"lake": resource}) as resources:
        live = resources.lake
        lake = live.lake()
        assert lake.home == Path(tmp_path / "from-env").resolve()
        assert live.catalog_config().properties == {"s3.secret-access-key": "s3cr3t"}
        assert live.lake() is lake  # built once, lazily
