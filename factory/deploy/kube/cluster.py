"""The factory's own cluster objects, as plain dicts rendered from a profile's `kubernetes` section.

Dagster's chart (helm.py) installs Dagster; these are what the factory adds around it:

- the Namespace, and the ServiceAccount every Dagster and run pod runs as, with a Role on what the
  run launcher (run Jobs), Dagster Pipes (training pods, their logs, the rendezvous Service) and
  run monitoring (pod status, events) touch in that namespace, nothing cluster-wide;
- the PriorityClasses of the kind table (evals > training > sweep cells > ... > synthetic backfill,
  backfill with `preemptionPolicy: Never`: it fills idle GPUs and never evicts anything);
- empty-valued Secret templates: the env Secret with every variable the profile's `Secret`s name,
  and the Postgres password Secret the chart and dagster-k8s read. Fill them with `kubectl create
  secret` (deploy/README.md); a real credential is never rendered;
- the shared vLLM server: a Deployment running vLLM's OpenAI server on the model volume, its
  Service, and a HorizontalPodAutoscaler on vLLM's own queue metric `vllm:num_requests_waiting`
  (a Pods metric served by prometheus-adapter, whose rule is rendered as a ConfigMap): a replica
  is added when more than `target_waiting_requests` requests wait per replica, which tracks load
  better than GPU utilisation (always high while vLLM holds its KV cache);
- Kueue, when `kueue_queue` is set: the LocalQueue the Jobs name, and example ResourceFlavors
  (one per node pool) and a ClusterQueue sized by the cluster admin;
- monitoring, when `metrics` is on (monitoring.py): the run-queue exporter, the alert rules as a
  PrometheusRule, PodMonitors, the Grafana dashboard ConfigMap;
- Podium (`factory podium`), when `podium_user_header` is set: one replica and its Service, users
  named by the auth proxy's header.
"""

from __future__ import annotations

from urllib.parse import urlparse

from pydantic import BaseModel

from factory.deploy.config import DeployConfig, DeployError, Secret
from factory.deploy.kube.helm import PG_SECRET, named_profile_env, require_kubernetes
from factory.deploy.kube.monitoring import APP, monitoring_objects
VLLM = "vllm"  # Deployment, Service and HPA: the profile's inference.endpoint names this Service
HOME_PVC_SIZE = "1Ti"  # FACTORY_HOME of every pod: checkpoints, exports, tokenizers (ReadWriteMany)
WAITING_METRIC = "vllm:num_requests_waiting"
SERVING_KIND = "eval"  # the server runs where evals do: GPU pool, eval priority
CLUSTER_QUEUE = "factory-cluster-queue"
KUEUE = "kueue.x-k8s.io/v1beta1"


def _meta(name: str, namespace: str | None = None, **extra) -> dict:
    meta = {"name": name, "labels": {"app.kubernetes.io/part-of": APP}}
    if namespace:
        meta["namespace"] = namespace
    return meta | extra


def secret_envs(node) -> list[str]:
    """Every environment variable a `Secret` in the profile names, in field order."""
    found: list[str] = []
    if isinstance(node, Secret):
        return [node.env]
    if isinstance(node, BaseModel):
        for name in type(node).model_fields:
            found += secret_envs(getattr(node, name))
    elif isinstance(node, (list, tuple)):
        for item in node:
            found += secret_envs(item)
    elif isinstance(node, dict):
        for item in node.values():
            found += secret_envs(item)
    return list(dict.fromkeys(found))


def access(profile: DeployConfig) -> list[dict]:
    """Namespace, ServiceAccount, Role and RoleBinding, and the home volume every pod mounts as
    FACTORY_HOME (a preempted run's retry, and every node of a multi-node run, read its checkpoints)."""
    k8s = require_kubernetes(profile)
    ns, sa = k8s.namespace, k8s.service_account
    rules = [
        {"apiGroups": ["batch"], "resources": ["jobs", "jobs/status"],
         "verbs": ["create", "get", "list", "watch", "delete", "patch", "update"]},
        {"apiGroups": [""], "resources": ["pods", "pods/status"],
         "verbs": ["create", "get", "list", "watch", "delete", "patch"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["services"], "verbs": ["create", "get", "list", "watch", "delete"]},
        {"apiGroups": [""], "resources": ["events", "configmaps"], "verbs": ["get", "list", "watch"]},
    ]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(ns)},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(sa, ns)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(f"{sa}-runs", ns),
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(f"{sa}-runs", ns),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{sa}-runs"},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]},
    ] + ([{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(k8s.home_claim, ns),
           "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": HOME_PVC_SIZE}}}}]
         if k8s.home_claim else [])


def priority_classes(profile: DeployConfig) -> list[dict]:
    return [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": _meta(p.name),
             "value": p.value, "preemptionPolicy": p.preemption_policy, "globalDefault": False,
             "description": p.description or p.name}
            for p in require_kubernetes(profile).priority_classes]


def secret_templates(profile: DeployConfig) -> list[dict]:
    """Empty-valued Secrets: the keys to fill, never a value."""
    k8s = require_kubernetes(profile)
    out = []
    if k8s.env_secret:
        out.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": _meta(k8s.env_secret, k8s.namespace),
                    "stringData": {env: "" for env in secret_envs(profile)}})
    if profile.dagster.storage == "postgres":
        out.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": _meta(PG_SECRET, k8s.namespace),
                    "stringData": {"postgresql-password": ""}})
    return out


def serving(profile: DeployConfig) -> list[dict]:
    """The vLLM Deployment, its Service, the model volume claim, the HPA and the adapter rule."""
    k8s = require_kubernetes(profile)
    s, ns = k8s.serving, k8s.namespace
    if s is None:
        return []
    if s.min_replicas < 1:
        raise DeployError(f"kubernetes.serving.min_replicas = {s.min_replicas}: an HPA needs at least 1 "
                          f"(scale-to-zero is an alpha feature gate)")
    if s.max_replicas < s.min_replicas:
        raise DeployError(f"kubernetes.serving.max_replicas = {s.max_replicas} is below min_replicas {s.min_replicas}")
    _check_endpoint(profile)
    if not k8s.home_claim:
        raise DeployError("kubernetes.serving: the vLLM server loads its export from the home volume, but "
                          "kubernetes.home_claim is None")
    model_path = f"{k8s.home_path}/artifacts/exports/{s.export_dir}"
    shape = k8s.kinds[SERVING_KIND]
    labels = {"app.kubernetes.io/name": VLLM, "app.kubernetes.io/part-of": APP}
    gpu = {k8s.gpu_resource: str(s.gpu)} if s.gpu else {}
    inference = profile.inference
    # served under the export's id (what the OpenAI engine asks for and checks) and a stable alias
    args = ["--model", model_path, "--served-model-name", s.export, s.alias, "--host", "0.0.0.0",
            "--port", str(s.port), "--dtype", inference.dtype, "--max-num-seqs", str(inference.max_num_seqs)]
    if s.gpu:
        args += ["--gpu-memory-utilization", str(inference.gpu_memory_utilization)]
        if s.gpu > 1:
            args += ["--tensor-parallel-size", str(s.gpu)]
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10}
    container = {
        "name": "vllm", "image": k8s.image, "imagePullPolicy": k8s.image_pull_policy,
        "command": ["python", "-m", "vllm.entrypoints.openai.api_server"], "args": args,
        "ports": [{"name": "http", "containerPort": s.port}],
        "env": [{"name": k, "value": v} for k, v in named_profile_env(profile).items()],
        "resources": {"requests": {"cpu": s.cpu, "memory": s.memory} | gpu, "limits": {"memory": s.memory} | gpu},
        "readinessProbe": probe | {"initialDelaySeconds": 30},
        "livenessProbe": probe | {"initialDelaySeconds": 300, "failureThreshold": 6},
        "volumeMounts": [{"name": "home", "mountPath": k8s.home_path, "readOnly": True}],
    }
    pod = {"serviceAccountName": k8s.service_account, "priorityClassName": shape.priority_class,
           "nodeSelector": {k8s.pool_label: shape.pool} | shape.node_selector, "containers": [container],
           "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": k8s.home_claim, "readOnly": True}}]}
    if shape.tolerations:
        pod["tolerations"] = [t.model_dump(exclude_none=True) for t in shape.tolerations]
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(s.port), "prometheus.io/path": "/metrics"}
    rule = (f"# prometheus-adapter rule (add it under the adapter's `rules.custom`): vLLM's own queue length\n"
            f"# per pod, served as a Pods metric of the custom metrics API for the HPA {VLLM}.\n"
            f"- seriesQuery: '{WAITING_METRIC}{{namespace!=\"\",pod!=\"\"}}'\n"
            f"  resources:\n    overrides:\n      namespace: {{resource: namespace}}\n      pod: {{resource: pod}}\n"
            f"  name:\n    matches: '^{WAITING_METRIC}$'\n    as: '{WAITING_METRIC}'\n"
            f"  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'\n")
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(VLLM, ns),
         "spec": {"replicas": s.min_replicas, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels, "annotations": scrape}, "spec": pod}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta(VLLM, ns),
         "spec": {"selector": labels, "ports": [{"name": "http", "port": s.port, "targetPort": "http"}]}},
        {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": _meta(VLLM, ns),
         "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": VLLM},
                  "minReplicas": s.min_replicas, "maxReplicas": s.max_replicas,
                  "metrics": [{"type": "Pods", "pods": {
                      "metric": {"name": WAITING_METRIC},
                      "target": {"type": "AverageValue", "averageValue": _quantity(s.target_waiting_requests)}}}],
                  # a new replica loads the model for minutes: scale down slowly so it is not thrown away
                  "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}}}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta("prometheus-adapter-factory-rules", ns),
         "data": {"rules.yaml": rule}},
    ]


def _check_endpoint(profile: DeployConfig) -> None:
    """An `openai` inference endpoint inside the namespace must be this Service on this port: the
    runs would otherwise call a server nobody deployed."""
    k8s, inference = profile.kubernetes, profile.inference
    if inference.kind != "openai" or not inference.endpoint:
        return
    url = urlparse(inference.endpoint)
    host = url.hostname or ""
    if not (host.endswith(f".{k8s.namespace}.svc") or host.endswith(f".{k8s.namespace}.svc.cluster.local")):
        return  # a server outside the namespace is the cluster admin's
    expected = f"{VLLM}.{k8s.namespace}.svc"
    if host.split(".")[0] != VLLM or (url.port or 80) != k8s.serving.port:
        raise DeployError(f"inference.endpoint {inference.endpoint!r}: the vLLM Service this profile deploys is "
                          f"http://{expected}:{k8s.serving.port}/v1 (kubernetes.serving.port)")


def _quantity(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{round(value * 1000)}m"


def kueue(profile: DeployConfig) -> list[dict]:
    """LocalQueue (what the Jobs name) + example ResourceFlavors per pool and a ClusterQueue."""
    k8s = require_kubernetes(profile)
    if not k8s.kueue_queue:
        return []
    pools = sorted({shape.pool for shape in k8s.kinds.values()})
    flavors = [{"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": _meta(f"factory-{pool}"),
                "spec": {"nodeLabels": {k8s.pool_label: pool}}} for pool in pools]
    covered = ["cpu", "memory", k8s.gpu_resource]
    # example quotas: the cluster admin sizes them to the pools' real capacity
    quota = {"cpu": "64", "memory": "512Gi", k8s.gpu_resource: "8"}
    cluster_queue = {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": _meta(CLUSTER_QUEUE),
                     "spec": {"namespaceSelector": {}, "queueingStrategy": "BestEffortFIFO",
                              "preemption": {"withinClusterQueue": "LowerPriority"},
                              "resourceGroups": [{"coveredResources": covered, "flavors": [
                                  {"name": f"factory-{pool}", "resources": [
                                      {"name": r, "nominalQuota": quota[r]} for r in covered]} for pool in pools]}]}}
    local = {"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": _meta(k8s.kueue_queue, k8s.namespace),
             "spec": {"clusterQueue": CLUSTER_QUEUE}}
    return flavors + [cluster_queue, local]


PODIUM, PODIUM_PORT = "podium", 8100


def podium(profile: DeployConfig) -> list[dict]:
    """Podium's Deployment and Service: one replica (the app checks votes against its own memory of
    the tables, so two replicas could each accept a vote on one battle), replaced with Recreate, on
    the home volume (exports) and the profile's lake; users come from the auth proxy's header."""
    k8s = require_kubernetes(profile)
    if k8s.podium_user_header is None:
        return []
    if not k8s.home_claim:
        raise DeployError("kubernetes.podium_user_header: Podium reads exports from the home volume, but "
                          "kubernetes.home_claim is None")
    labels = {"app.kubernetes.io/name": PODIUM, "app.kubernetes.io/part-of": APP}
    probe = {"httpGet": {"path": "/static/podium.css", "port": "http"}, "periodSeconds": 10}
    container = {
        "name": PODIUM, "image": k8s.image, "imagePullPolicy": k8s.image_pull_policy,
        "command": ["factory", "podium", "--host", "0.0.0.0", "--port", str(PODIUM_PORT), "--auth", "header",
                    "--user-header", k8s.podium_user_header],
        "ports": [{"name": "http", "containerPort": PODIUM_PORT}],
        "env": [{"name": k, "value": v} for k, v in named_profile_env(profile).items()]
               + [{"name": "FACTORY_HOME", "value": k8s.home_path}],
        "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}},
        "readinessProbe": probe | {"initialDelaySeconds": 10}, "livenessProbe": probe | {"initialDelaySeconds": 60},
        "volumeMounts": [{"name": "home", "mountPath": k8s.home_path}],
    }
    if k8s.env_secret:
        container["envFrom"] = [{"secretRef": {"name": k8s.env_secret}}]
    pod = {"serviceAccountName": k8s.service_account, "containers": [container],
           "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": k8s.home_claim}}]}
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(PODIUM, k8s.namespace),
         "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": pod}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta(PODIUM, k8s.namespace),
         "spec": {"selector": labels, "ports": [{"name": "http", "port": PODIUM_PORT, "targetPort": "http"}]}},
    ]


GROUPS = {"00-access": access, "01-priority-classes": priority_classes, "02-secrets": secret_templates,
          "03-kueue": kueue, "04-serving": serving, "05-monitoring": monitoring_objects, "06-podium": podium}


def cluster_manifests(profile: DeployConfig) -> dict[str, list[dict]]:
    """Apply-ordered groups (file stem -> objects); empty groups left out."""
    require_kubernetes(profile)
    return {name: objects for name, build in GROUPS.items() if (objects := build(profile))}
