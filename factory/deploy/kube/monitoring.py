"""Factory-health metrics on Kubernetes: the exporter beside every factory pod, and the monitoring objects.

Two halves, both switched by the profile's `kubernetes.metrics` (True by default):

- Per pod (`PodMetrics`, used by placement.py for run Jobs, step Jobs and the training pods): the
  factory container runs with FACTORY_METRICS=1 and PROMETHEUS_MULTIPROC_DIR on an emptyDir shared
  with a *native sidecar* (an init container with `restartPolicy: Always`, GA in Kubernetes 1.29):
  `factory metrics serve --host 0.0.0.0` over that directory, on the named port `metrics`. A Job
  still completes when its main container exits (the kubelet then stops the sidecar, whose SIGTERM
  handler exits 0), and dagster-k8s waits for native sidecars (its pod wait treats a ready init
  container as started). The pod carries the `prometheus.io/*` annotations for annotation-based
  scraping, and `app.kubernetes.io/part-of: model-factory` for the PodMonitor.
- The group `05-monitoring` (`monitoring_objects`): the run-queue exporter (one Deployment with
  one replica, `Recreate`, so the queue is never counted twice; it reads the Dagster instance from
  the chart's `dagster-instance` ConfigMap mounted as `$DAGSTER_HOME/dagster.yaml`, as the chart's
  own pods do, with the Postgres password from the chart's Secret), the alert rules as a Prometheus
  Operator `PrometheusRule` (deploy/prometheus/rules.yml's groups, unchanged), a `PodMonitor` for
  the factory's pods on port `metrics` (and one for vLLM's `/metrics`, which the HPA's adapter
  reads), and the Grafana dashboard as a ConfigMap labelled `grafana_dashboard: "1"` (the Grafana
  sidecar's convention), its JSON exactly deploy/grafana/dashboards/'s.

Why a sidecar and not an exporter in the main container: the run pod's command is Dagster's
(`dagster api execute_run`) and the worker pods' is torchrun; a second container needs neither to
change, and all ranks' processes already write into the one multiprocess directory.
Why the pod-level pieces also survive a run's own `dagster-k8s/config`: dagster-k8s deep-merges
list fields of `pod_spec_config` (initContainers and volumes are appended, de-duplicated), so a
run tag adds to the sidecar rather than replacing it (a tag with `merge_behavior: SHALLOW` that
sets its own `initContainers` or `volumes` does replace them, as that mode says).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from factory.deploy.config import DeployConfig, DeployError, KubernetesProfile
from factory.deploy.kube.helm import CONTROL_KIND, DAGSTER_HOME, PG_SECRET, RELEASE, named_profile_env, require_kubernetes
from factory.health.exporter import DEFAULT_PORT
from factory.home import CHECKOUT

APP = "model-factory"
PART_OF = "app.kubernetes.io/part-of"
PORT_NAME = "metrics"
PORT = DEFAULT_PORT
VOLUME = "factory-metrics"
MOUNT = "/metrics"
DIR = f"{MOUNT}/prom"
SIDECAR = "metrics"
SIDECAR_RESOURCES = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}}  # ~26 MB RSS
QUEUE_EXPORTER = "factory-run-queue-metrics"
QUEUE_RESOURCES = {"requests": {"cpu": "50m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}  # imports dagster
RULES = CHECKOUT / "deploy" / "prometheus" / "rules.yml"
DASHBOARD_LABEL = "grafana_dashboard"
MONITORING = "monitoring.coreos.com/v1"
SCRAPE_INTERVAL = "15s"


def scrape_annotations(port: int = PORT) -> dict[str, str]:
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"}


def exporter_command() -> list[str]:
    return ["factory", "metrics", "serve", "--host", "0.0.0.0", "--port", str(PORT), "--dir", DIR]


@dataclass(frozen=True)
class PodMetrics:
    """What a factory pod gets for metrics: env and mount of its own container, the sidecar, the
    shared volume, the annotations. Empty when the profile's metrics are off."""

    env: dict[str, str] = field(default_factory=dict)
    volumes: list[dict] = field(default_factory=list)
    mounts: list[dict] = field(default_factory=list)
    init_containers: list[dict] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)


def pod_metrics(k8s: KubernetesProfile) -> PodMetrics:
    if not k8s.metrics:
        return PodMetrics()
    mount = {"name": VOLUME, "mountPath": MOUNT}
    sidecar = {"name": SIDECAR, "image": k8s.image, "imagePullPolicy": k8s.image_pull_policy,
               "restartPolicy": "Always", "command": exporter_command(),
               "ports": [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}],
               "resources": {k: dict(v) for k, v in SIDECAR_RESOURCES.items()}, "volumeMounts": [dict(mount)]}
    return PodMetrics(env={"FACTORY_METRICS": "1", "PROMETHEUS_MULTIPROC_DIR": DIR},
                      volumes=[{"name": VOLUME, "emptyDir": {}}], mounts=[mount], init_containers=[sidecar],
                      annotations=scrape_annotations())


def _meta(name: str, namespace: str, labels: dict | None = None, **extra) -> dict:
    return {"name": name, "namespace": namespace, "labels": {PART_OF: APP, **(labels or {})}} | extra


def queue_exporter(profile: DeployConfig) -> dict:
    """The run-queue exporter: one pod reading the Dagster instance the chart configures."""
    k8s = require_kubernetes(profile)
    control = k8s.kinds[CONTROL_KIND]  # beside the chart's daemon and webserver
    labels = {"app.kubernetes.io/name": QUEUE_EXPORTER, PART_OF: APP}
    env = [{"name": k, "value": v} for k, v in named_profile_env(profile).items()]
    env.append({"name": "DAGSTER_HOME", "value": DAGSTER_HOME})
    if profile.dagster.storage == "postgres":
        env.append({"name": "DAGSTER_PG_PASSWORD",
                    "valueFrom": {"secretKeyRef": {"name": PG_SECRET, "key": "postgresql-password"}}})
    container = {
        "name": "exporter", "image": k8s.image, "imagePullPolicy": k8s.image_pull_policy,
        "command": ["python", "-m", "resources.run_queue_metrics", "--host", "0.0.0.0", "--port", str(PORT),
                    "--dagster-home", DAGSTER_HOME, "--dir", DIR],
        "ports": [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}], "env": env,
        "resources": {k: dict(v) for k, v in QUEUE_RESOURCES.items()},
        "readinessProbe": {"tcpSocket": {"port": PORT_NAME}, "periodSeconds": 10},
        "volumeMounts": [{"name": "dagster-instance", "mountPath": f"{DAGSTER_HOME}/dagster.yaml",
                          "subPath": "dagster.yaml"}, {"name": VOLUME, "mountPath": MOUNT}]}
    pod = {"serviceAccountName": k8s.service_account,
           "nodeSelector": {k8s.pool_label: control.pool} | control.node_selector, "containers": [container],
           "volumes": [{"name": "dagster-instance", "configMap": {"name": f"{RELEASE}-instance"}},
                       {"name": VOLUME, "emptyDir": {}}]}
    if control.tolerations:
        pod["tolerations"] = [t.model_dump(exclude_none=True) for t in control.tolerations]
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(QUEUE_EXPORTER, k8s.namespace),
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"},  # two replicas would count the queue twice
                     "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels, "annotations": scrape_annotations()}, "spec": pod}}}


def alert_groups() -> list[dict]:
    """deploy/prometheus/rules.yml's groups, as Prometheus loads them."""
    try:
        groups = yaml.safe_load(RULES.read_text())["groups"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
        raise DeployError(f"{RULES}: no alert rule groups to render ({e})") from None
    return groups


def dashboards() -> dict[str, str]:
    """File name -> dashboard JSON, as deploy/grafana/dashboards/ holds it."""
    from factory.health.dashboards import rendered

    return rendered()


def monitoring_objects(profile: DeployConfig) -> list[dict]:
    """The `05-monitoring` group: [] when the profile's metrics are off."""
    k8s = require_kubernetes(profile)
    if not k8s.metrics:
        return []
    ns, extra = k8s.namespace, dict(k8s.monitoring_labels)
    endpoint = {"path": "/metrics", "interval": SCRAPE_INTERVAL}
    out = [
        queue_exporter(profile),
        {"apiVersion": MONITORING, "kind": "PrometheusRule", "metadata": _meta("factory-health", ns, extra),
         "spec": {"groups": alert_groups()}},
        {"apiVersion": MONITORING, "kind": "PodMonitor", "metadata": _meta("factory-health", ns, extra),
         "spec": {"selector": {"matchLabels": {PART_OF: APP}},
                  "podMetricsEndpoints": [{"port": PORT_NAME, **endpoint}]}},
    ]
    if k8s.serving is not None:  # vLLM's own /metrics: the HPA's adapter rule reads vllm:num_requests_waiting
        from factory.deploy.kube.cluster import VLLM

        out.append({"apiVersion": MONITORING, "kind": "PodMonitor", "metadata": _meta("factory-vllm", ns, extra),
                    "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": VLLM, PART_OF: APP}},
                             "podMetricsEndpoints": [{"port": "http", **endpoint}]}})
    out.append({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": _meta("factory-grafana-dashboards", ns, {DASHBOARD_LABEL: "1"}),
                "data": dashboards()})
    return out
