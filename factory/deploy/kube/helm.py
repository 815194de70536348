"""Values for Dagster's official Helm chart (`dagster/dagster`), rendered from a deploy profile.

The chart runs the webserver, the daemon and one user-code deployment (`dagster api grpc -m
definitions`), all from the factory image so the daemon can import the factory's run launcher.
What the values carry, and where each part comes from (nothing is typed twice):

- the run queue: `QueuedRunCoordinator` with `configs/dagster.yaml`'s max concurrent runs and
  tag concurrency limits (the same file every other profile's instance is rendered from), so the
  cluster queues runs exactly as a laptop does; run order is the runs' `dagster/priority` tags
  (`factory.experiments.queue.PRIORITY`, listed in the file's header);
- run retries and run monitoring, from the same file's `run_retries` / `run_monitoring` (enabled
  with Dagster's defaults if the file says nothing), keys camelCased as the chart wants them: a
  preempted run's pod dies, monitoring marks the run failed, the retry resumes from the last
  checkpoint. (The chart's instance template renders the keys it knows; Dagster's defaults apply
  to any other, so keep the file's values at Dagster's defaults for keys the chart leaves out);
- the run launcher: the factory's `FactoryK8sRunLauncher` (a `K8sRunLauncher` that places each run
  by its asset kind, `resources/k8s_launcher.py`) as the chart's `CustomRunLauncher`, with the
  keys the chart would fill for its own K8sRunLauncher (instance ConfigMap, Postgres Secret,
  DAGSTER_HOME) and the profile's namespace, service account, image and env Secret;
- Postgres: the profile's `dagster.postgres` as the chart's external Postgres; the password is
  never a value: it is read from the Secret `PG_SECRET` (key `postgresql-password`, the key
  dagster-k8s mounts into run pods as DAGSTER_PG_PASSWORD);
- the profile itself: every pod gets FACTORY_DEPLOY=<name> (or FACTORY_DEPLOY_JSON for a profile
  that is not a file in configs/deploy), and the env Secret's keys as its environment.

The chart version is pinned to the Dagster release the factory is pinned to (CHART_VERSION).
"""

from __future__ import annotations

import yaml

from factory.deploy.config import DeployConfig, DeployError
from factory.deploy.instance import base_config

CHART = "dagster/dagster"
CHART_REPO = "https://dagster-io.github.io/helm"
CHART_VERSION = "1.13.27"  # the chart is released with Dagster itself: same version as pyproject's dagster
RELEASE = "dagster"  # helm install <RELEASE>: the chart's object names start with it
PG_SECRET = "dagster-postgresql-secret"
DAGSTER_HOME = "/opt/dagster/dagster_home"  # where the chart mounts the instance ConfigMap (its default)
GRPC_PORT = 3030
CONTROL_KIND = "mix"  # webserver, daemon and code server sit on the pool of the lightest CPU asset kind
LAUNCHER_MODULE, LAUNCHER_CLASS = "resources.k8s_launcher", "FactoryK8sRunLauncher"


def require_kubernetes(profile: DeployConfig):
    if profile.kubernetes is None:
        raise DeployError(f"profile {profile.name!r} has no `kubernetes` section (image, namespace, kind table): "
                          f"nothing to render for a cluster")
    return profile.kubernetes


def split_image(image: str) -> tuple[str, str]:
    """`registry:5000/name:tag` -> (`registry:5000/name`, `tag`); no tag = `latest`."""
    repo, _, tag = image.rpartition(":")
    if not repo or "/" in tag:
        return image, "latest"
    return repo, tag


def named_profile_env(profile: DeployConfig) -> dict[str, str]:
    """How a chart pod learns its profile: by name when it is a function in configs/deploy (so the
    rendered values stay short and stable), else as JSON. Factory-placed pods get the whole
    profile (`factory.deploy.profiles.profile_env`)."""
    from factory.deploy.profiles import profile_names

    if profile.name in profile_names():
        return {"FACTORY_DEPLOY": profile.name}
    return {"FACTORY_DEPLOY_JSON": profile.model_dump_json(exclude_none=True)}


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part.title() for part in rest)


def _camel_keys(config: dict) -> dict:
    return {_camel(k): v for k, v in config.items()}


def run_queue(base: dict) -> dict:
    """configs/dagster.yaml's run_coordinator as the chart's `dagsterDaemon.runCoordinator`."""
    coordinator = base.get("run_coordinator") or {}
    if coordinator.get("class") != "QueuedRunCoordinator":
        raise DeployError(f"configs/dagster.yaml: run_coordinator.class is {coordinator.get('class')!r}; the chart's "
                          f"values render a QueuedRunCoordinator")
    config = coordinator.get("config") or {}
    queued = {"maxConcurrentRuns": config["max_concurrent_runs"]} if "max_concurrent_runs" in config else {}
    queued["tagConcurrencyLimits"] = [dict(limit) for limit in config.get("tag_concurrency_limits") or []]
    for key in ("dequeue_interval_seconds", "dequeue_use_threads", "dequeue_num_workers"):
        if key in config:
            queued[_camel(key)] = config[key]
    return {"enabled": True, "type": "QueuedRunCoordinator", "config": {"queuedRunCoordinator": queued}}


def launcher_config(profile: DeployConfig) -> dict:
    """The FactoryK8sRunLauncher's config (K8sRunLauncher's keys, as the chart fills them for its own)."""
    k8s = require_kubernetes(profile)
    config = {"instance_config_map": f"{RELEASE}-instance", "postgres_password_secret": PG_SECRET,
              "dagster_home": DAGSTER_HOME, "load_incluster_config": True, "job_namespace": k8s.namespace,
              "job_image": k8s.image, "image_pull_policy": k8s.image_pull_policy,
              "service_account_name": k8s.service_account,
              "env_vars": [f"{k}={v}" for k, v in named_profile_env(profile).items()]}
    if k8s.env_secret:
        config["env_secrets"] = [k8s.env_secret]
    if profile.dagster.storage != "postgres":
        config.pop("postgres_password_secret")
    return config


def helm_values(profile: DeployConfig, base: dict | None = None) -> dict:
    """The chart's values for `profile` (base: configs/dagster.yaml)."""
    k8s = require_kubernetes(profile)
    base = base_config() if base is None else base
    repository, tag = split_image(k8s.image)
    image = {"repository": repository, "tag": tag, "pullPolicy": k8s.image_pull_policy}
    env = named_profile_env(profile)
    secrets = [{"name": k8s.env_secret}] if k8s.env_secret else []
    control = k8s.kinds[CONTROL_KIND]
    placement = {"nodeSelector": {k8s.pool_label: control.pool} | control.node_selector}
    if control.tolerations:
        placement["tolerations"] = [t.model_dump(exclude_none=True) for t in control.tolerations]
    values: dict = {
        # every Dagster pod runs as the profile's service account (cluster.py's Role), not a chart-made one
        "global": {"serviceAccountName": k8s.service_account, "dagsterHome": DAGSTER_HOME},
        "serviceAccount": {"create": False, "name": k8s.service_account},
        "dagsterWebserver": {"image": image, "env": env, "envSecrets": secrets, **placement},
        "dagster-user-deployments": {"enabled": True, "enableSubchart": True, "deployments": [{
            "name": "factory", "image": image, "dagsterApiGrpcArgs": ["-m", "definitions"], "port": GRPC_PORT,
            "env": env, "envSecrets": secrets, "includeConfigInLaunchedRuns": {"enabled": True}, **placement}]},
        "dagsterDaemon": {
            "image": image, "env": env, "envSecrets": secrets, **placement,
            "runCoordinator": run_queue(base),
            "runRetries": {"enabled": True} | _camel_keys(base.get("run_retries") or {}),
            "runMonitoring": {"enabled": True} | _camel_keys(base.get("run_monitoring") or {}),
        },
        "runLauncher": {"type": "CustomRunLauncher", "config": {"customRunLauncher": {
            "module": LAUNCHER_MODULE, "class": LAUNCHER_CLASS, "config": launcher_config(profile)}}},
        "telemetry": {"enabled": bool((base.get("telemetry") or {}).get("enabled", False))},
    }
    if profile.dagster.storage == "postgres":
        pg = profile.dagster.postgres
        values["global"] |= {"postgresqlSecretName": PG_SECRET}
        values["generatePostgresqlPasswordSecret"] = False
        values["postgresql"] = {"enabled": False, "postgresqlHost": pg.host, "postgresqlUsername": pg.user,
                                "postgresqlDatabase": pg.db, "service": {"port": pg.port}}
    return values


def values_yaml(profile: DeployConfig, base: dict | None = None) -> str:
    """The values file as checked in (deploy/helm/values.yaml for the kubernetes profile)."""
    from factory.experiments.queue import PRIORITY

    order = ", ".join(f"{kind} {p:+d}" for kind, p in sorted(PRIORITY.items(), key=lambda kv: -kv[1]))
    header = (f"# Values for Dagster's official chart {CHART} {CHART_VERSION} ({CHART_REPO}), deploy profile "
              f"{profile.name!r}.\n# Rendered by `factory deploy render --deploy {profile.name}` "
              f"(factory/deploy/kube/helm.py): do not edit by hand.\n"
              f"# Run queue from configs/dagster.yaml; queued runs start in dagster/priority order: {order}.\n"
              f"# The Postgres password is read from Secret {PG_SECRET} (key postgresql-password).\n")
    return header + dump_yaml(helm_values(profile, base))


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data):  # the same env/image dict in three places stays three plain copies
        return True


def dump_yaml(data) -> str:
    return yaml.dump(data, Dumper=_NoAliases, sort_keys=False, width=120)


def dump_all_yaml(objects: list) -> str:
    return yaml.dump_all(objects, Dumper=_NoAliases, sort_keys=False, width=120)
