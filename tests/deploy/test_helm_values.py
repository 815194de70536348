"""The Helm values of Dagster's chart rendered from a deploy profile (`factory.deploy.kube.helm`):
the checked-in deploy/helm/values.yaml is exactly the rendering of the kubernetes profile; the
values pass the chart's own values schema (an excerpt vendored under tests/assets/helm/, see its
$comment), and a misspelt key fails it; the run queue, run retries and run monitoring are the ones
configs/dagster.yaml gives every other instance; the run launcher's config is one Dagster's
K8sRunLauncher accepts; every pod gets the profile and the env Secret; the Postgres password is a
Secret reference, never a value. Unit tier, CPU, no cluster and no helm binary."""

import json

import jsonschema
import pytest
import yaml

from factory.deploy import DeployError, load_profile
from factory.deploy.instance import base_config
from factory.deploy.kube.helm import CHART_VERSION, PG_SECRET, helm_values, split_image, values_yaml
from factory.home import CHECKOUT

SCHEMA = json.loads((CHECKOUT / "tests/assets/helm/values.schema.json").read_text())


@pytest.fixture(scope="module")
def profile():
    return load_profile("kubernetes")


@pytest.fixture(scope="module")
def values(profile):
    return helm_values(profile)


def test_checked_in_values_are_the_rendering(profile):
    checked_in = (CHECKOUT / "deploy/helm/values.yaml").read_text()
    assert checked_in == values_yaml(profile), "deploy/helm/values.yaml is stale: run " \
                                               "`factory deploy render --deploy kubernetes` and copy values.yaml"


def test_chart_version_is_the_pinned_dagster():
    pyproject = (CHECKOUT / "pyproject.toml").read_text()
    assert f'"dagster=={CHART_VERSION}"' in pyproject


def test_values_pass_the_chart_schema_and_a_typo_does_not(values):
    validator = jsonschema.Draft202012Validator(SCHEMA)
    assert [e.message for e in validator.iter_errors(values)] == []
    bad = json.loads(json.dumps(values))
    bad["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]["maxConcurentRuns"] = 3
    bad["runLauncher"]["type"] = "K8sLauncher"
    messages = sorted(e.message for e in validator.iter_errors(bad))
    assert any("maxConcurentRuns" in m for m in messages) and any("K8sLauncher" in m for m in messages), messages


def test_run_queue_is_configs_dagster_yaml(values):
    base = base_config()
    coordinator = values["dagsterDaemon"]["runCoordinator"]
    assert coordinator["type"] == base["run_coordinator"]["class"] == "QueuedRunCoordinator"
    queued = coordinator["config"]["queuedRunCoordinator"]
    assert queued["maxConcurrentRuns"] == base["run_coordinator"]["config"]["max_concurrent_runs"]
    assert queued["tagConcurrencyLimits"] == base["run_coordinator"]["config"]["tag_concurrency_limits"]
    assert {"key": "factory/kind", "value": "training", "limit": 1} in queued["tagConcurrencyLimits"]


def test_run_retries_and_monitoring_mirror_configs_dagster_yaml(values):
    base = base_config()
    daemon = values["dagsterDaemon"]
    assert daemon["runRetries"]["enabled"] is True and daemon["runMonitoring"]["enabled"] is True
    for section, key in (("run_retries", "runRetries"), ("run_monitoring", "runMonitoring")):
        for snake, value in (base.get(section) or {}).items():
            camel = snake.split("_")[0] + "".join(p.title() for p in snake.split("_")[1:])
            assert daemon[key][camel] == value, f"{key}.{camel}"


def test_priorities_are_named_in_the_header(profile):
    from factory.experiments.queue import PRIORITY

    header = values_yaml(profile).split("\nglobal:")[0]
    for kind, priority in PRIORITY.items():
        assert f"{kind} {priority:+d}" in header


def test_launcher_config_is_one_k8s_run_launcher_accepts(values, profile):
    from dagster._config import process_config
    from dagster_k8s import K8sRunLauncher

    launcher = values["runLauncher"]["config"]["customRunLauncher"]
    assert (launcher["module"], launcher["class"]) == ("resources.k8s_launcher", "FactoryK8sRunLauncher")
    result = process_config(K8sRunLauncher.config_type(), launcher["config"])
    assert result.success, result.errors
    assert launcher["config"]["job_namespace"] == profile.kubernetes.namespace
    assert launcher["config"]["job_image"] == profile.kubernetes.image
    assert launcher["config"]["env_secrets"] == [profile.kubernetes.env_secret]


def test_every_pod_gets_the_profile_and_the_secret(values, profile):
    env = {"FACTORY_DEPLOY": "kubernetes"}
    user = values["dagster-user-deployments"]["deployments"][0]
    assert user["dagsterApiGrpcArgs"] == ["-m", "definitions"]
    repo, tag = split_image(profile.kubernetes.image)
    for pod in (values["dagsterWebserver"], values["dagsterDaemon"], user):
        assert pod["env"] == env and pod["envSecrets"] == [{"name": "factory-secrets"}]
        assert pod["image"] == {"repository": repo, "tag": tag, "pullPolicy": "IfNotPresent"}
        assert pod["nodeSelector"] == {"factory.dev/pool": "cpu"}
    assert "FACTORY_DEPLOY=kubernetes" in values["runLauncher"]["config"]["customRunLauncher"]["config"]["env_vars"]


def test_a_profile_outside_configs_deploy_travels_as_json(profile):
    renamed = profile.derive(name="my-cluster")
    env = helm_values(renamed)["dagsterWebserver"]["env"]
    assert list(env) == ["FACTORY_DEPLOY_JSON"]
    assert json.loads(env["FACTORY_DEPLOY_JSON"])["name"] == "my-cluster"


def test_postgres_is_external_with_the_password_in_a_secret(values, profile):
    pg = profile.dagster.postgres
    assert values["postgresql"] == {"enabled": False, "postgresqlHost": pg.host, "postgresqlUsername": pg.user,
                                    "postgresqlDatabase": pg.db, "service": {"port": pg.port}}
    assert values["generatePostgresqlPasswordSecret"] is False
    assert values["global"]["postgresqlSecretName"] == PG_SECRET
    assert "password" not in yaml.safe_dump(values).lower().replace("postgresql-password", "").replace(
        "postgres_password_secret", "").replace("generatepostgresqlpasswordsecret", "")


def test_image_split_keeps_registry_ports():
    assert split_image("registry:5000/factory:1.2") == ("registry:5000/factory", "1.2")
    assert split_image("registry:5000/factory") == ("registry:5000/factory", "latest")


def test_a_profile_without_kubernetes_is_refused_by_name():
    with pytest.raises(DeployError, match=r"profile 'embedded' has no `kubernetes` section"):
        helm_values(load_profile("embedded"))
