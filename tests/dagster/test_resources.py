"""The Dagster resources take their engines from the deployment profile, resolved when a run asks
(not at load): FACTORY_HOME and the profile name may be EnvVars, secrets are resolved from the
variables the profile names, and the lake is built once. CPU, no servers."""

from pathlib import Path

from dagster import EnvVar, build_resources

from resources import InferenceResource, LakeResource, TrackerResource


def test_lake_resource_resolves_env_vars_when_a_run_asks(tmp_path, monkeypatch):
    profile = tmp_path / "team.yaml"
    profile.write_text("catalog: {kind: sql, uri: 'sqlite:///%s'}\ninference: {kind: transformers}\n"
                       % (tmp_path / "team-catalog.db"))
    monkeypatch.setenv("TEST_FACTORY_HOME", str(tmp_path / "from-env"))
    monkeypatch.setenv("TEST_DEPLOY", str(profile))
    resource = LakeResource(home=EnvVar("TEST_FACTORY_HOME"), deploy=EnvVar("TEST_DEPLOY"))
    with build_resources({"lake": resource}) as resources:
        live = resources.lake
        lake = live.lake()
        assert lake.home == Path(tmp_path / "from-env").resolve()
        assert live.profile().name == "team"
        assert lake.catalog.properties["uri"] == f"sqlite:///{tmp_path / 'team-catalog.db'}"
        assert live.lake() is lake  # built once, lazily
    # the other resources read the same profile; a field set on the resource wins over it
    monkeypatch.setenv("FACTORY_DEPLOY", str(profile))
    assert InferenceResource().engine_config().kind == "transformers"
    assert InferenceResource(kind="vllm").engine_config().kind == "vllm"


def test_tracker_resource_fills_unset_fields_from_the_profile(tmp_path, monkeypatch):
    profile = tmp_path / "tracked.yaml"
    profile.write_text("tracker: {backends: [mlflow, neptune], mlflow_tracking_uri: 'http://127.0.0.1:5000', "
                       "neptune_api_token: {env: TEST_NEPTUNE}}\n")
    monkeypatch.setenv("FACTORY_DEPLOY", str(profile))
    monkeypatch.setenv("TEST_NEPTUNE", "tok")
    assert TrackerResource().env() == {
        "FACTORY_TRACKER_BACKENDS": "mlflow,neptune", "FACTORY_MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
        "NEPTUNE_PROJECT": "factory/offline", "NEPTUNE_MODE": "offline", "NEPTUNE_API_TOKEN": "tok"}
    assert TrackerResource(backends=["iceberg"]).env() == {"FACTORY_TRACKER_BACKENDS": "iceberg",
                                                          "FACTORY_MLFLOW_TRACKING_URI": "http://127.0.0.1:5000"}
