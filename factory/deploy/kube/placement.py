"""Where a run's pods go and what they ask for, from the profile's kind table.

Every asset op carries its kind statically (`factory/kind` in its op tags, `op_tags(kind)`);
the profile, chosen at run time, says what a kind means on this cluster (`KubernetesProfile.kinds`:
node pool, CPU/memory, tolerations, PriorityClass). `placement(profile, kind, gpus=...)` joins the
two into one `Placement`: the pod fields of the Kubernetes API (camelCase, as manifests carry
them), and `Placement.k8s_config()` the same as a `dagster-k8s/config` dict, which dagster-k8s
accepts in camelCase and merges into the Job it builds. The run launcher
(`resources.k8s_launcher`) applies it when a run starts; the training pods
(`factory.deploy.kube.training`) use the same `Placement` for torchrun's pods.

Design choices (and why):
- The kind table's `train` is the tag value `training`: the run queue's concurrency limits
  (configs/dagster.yaml), the sensors and the queue's PRIORITY already count runs by
  `factory/kind=training`, so that value stays; `KIND_TAG` is the one place that maps them.
- A run that materializes several kinds (the demo job: ingest, refine, tokenizer) runs in one pod,
  which must fit its most demanding step: `RUN_PRECEDENCE` picks it.
- A training pod's GPUs are the experiment's `parallel.nproc_per_node` (the kind table's `gpu`
  is ignored for train). With training.launcher 'kubernetes' the run pod of a training run only
  launches and watches the torchrun pods (`ORCHESTRATOR`: 1 CPU, no GPU, on the kind's pool and
  priority, so a GPU-only cluster works too). Train and sweep pods get `preemption_grace_s + GRACE_MARGIN_S` as
  terminationGracePeriodSeconds, so the trainer's checkpoint on SIGTERM finishes before the
  kubelet's SIGKILL.
- Extended resources (GPUs) must have limits equal to requests; memory's limit defaults to its
  request (an OOM kill of this pod, never memory pressure on the node's other pods); CPU has no
  limit unless the row sets one (burst on idle cores instead of CFS throttling).
- Pods get the profile itself (FACTORY_DEPLOY_JSON, no secrets) and the profile's Secret as
  environment (envFrom), so the code in the pod uses this profile's engines and credentials.
- FACTORY_HOME is the profile's `home_claim` volume at `home_path` in every pod: checkpoints live
  under it, so a preempted pod's retry (another pod, maybe another node) resumes from them, and
  the nodes of a multi-node run write and read one checkpoint directory.
- With the profile's `metrics` on, every pod gets the factory-health exporter as a native
  sidecar, FACTORY_METRICS=1 and the scrape annotations (monitoring.py); every pod is labelled
  `app.kubernetes.io/part-of: model-factory` (over dagster-k8s's `dagster`; its own name, instance
  and run labels stay), which the PodMonitor selects.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from factory import settings
from factory.deploy.config import ASSET_KINDS, DeployConfig, DeployError
from factory.deploy.kube.monitoring import APP, PART_OF, pod_metrics
from factory.deploy.profiles import profile_env

KIND_TAG_KEY = "factory/kind"
SWEEP_TAG_KEY = "factory/sweep"
KIND_TAG = {kind: ("training" if kind == "train" else kind) for kind in ASSET_KINDS}
TAG_KIND = {tag: kind for kind, tag in KIND_TAG.items()}
RUN_PRECEDENCE = ("train", "sweep", "eval", "export", "synth", "build", "refine", "tokenize", "mix")
KIND_LABEL = "factory.dev/kind"
KUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GRACE_MARGIN_S = 30  # the kubelet's SIGKILL comes this long after the trainer's own deadline
# What the code-eval sandbox needs in a pod (measured with podman, tests/deploy/test_image.py): the
# runtime's default seccomp profile refuses bubblewrap's unshare/mount/sethostname, and the kernel
# refuses a fresh /proc over a masked one (an unmasked /proc needs hostUsers: false)
SANDBOX_SECURITY = {"seccompProfile": {"type": "Unconfined"}, "procMount": "Unmasked",
                    "allowPrivilegeEscalation": False}
GRACEFUL_KINDS = ("train", "sweep")
HOME_VOLUME = "factory-home"
# a training run whose torchrun pods are launched through Pipes only watches them: a small pod
ORCHESTRATOR = {"cpu": "1", "memory": "2Gi"}


def op_tags(kind: str) -> dict[str, str]:
    """The op tags that declare an asset's kind (`@asset(op_tags=op_tags("refine"))`)."""
    if kind not in KIND_TAG:
        raise DeployError(f"asset kind {kind!r} is not one of {', '.join(ASSET_KINDS)}")
    return {KIND_TAG_KEY: KIND_TAG[kind]}


def kind_of_tag(value: str) -> str:
    if value not in TAG_KIND:
        raise DeployError(f"tag {KIND_TAG_KEY}={value!r} names no asset kind (have: {', '.join(TAG_KIND)})")
    return TAG_KIND[value]


def run_kind(run_tags: Mapping[str, str], op_tag_sets: Iterable[Mapping[str, str]] = ()) -> str | None:
    """The kind that places a run's pod: its own `factory/kind` tag (a training run with a
    `factory/sweep` tag is a sweep cell), else the most demanding kind among its ops, else None."""
    if KIND_TAG_KEY in run_tags:
        kind = kind_of_tag(run_tags[KIND_TAG_KEY])
        return "sweep" if kind == "train" and SWEEP_TAG_KEY in run_tags else kind
    kinds = {kind_of_tag(tags[KIND_TAG_KEY]) for tags in op_tag_sets if KIND_TAG_KEY in tags}
    return next((k for k in RUN_PRECEDENCE if k in kinds), None)


@dataclass(frozen=True)
class Placement:
    """One kind's pod fields on one cluster, in the Kubernetes API's own (camelCase) form."""

    kind: str
    image: str
    image_pull_policy: str
    namespace: str
    service_account: str
    labels: dict[str, str]
    node_selector: dict[str, str]
    tolerations: list[dict]
    priority_class: str
    resources: dict[str, dict[str, str]]
    env: list[dict] = field(default_factory=list)
    env_from: list[dict] = field(default_factory=list)
    grace_s: int | None = None
    volumes: list[dict] = field(default_factory=list)
    volume_mounts: list[dict] = field(default_factory=list)
    init_containers: list[dict] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    sandboxed: bool = False

    def pod_meta(self, labels: Mapping[str, str] | None = None) -> dict:
        """Pod metadata: the placement's labels (plus `labels`) and annotations."""
        meta = {"labels": {**self.labels, **(labels or {})}}
        if self.annotations:
            meta["annotations"] = dict(self.annotations)
        return meta

    def pod_spec(self) -> dict:
        """PodSpec fields without the containers."""
        spec = {"serviceAccountName": self.service_account, "nodeSelector": dict(self.node_selector),
                "priorityClassName": self.priority_class}
        if self.tolerations:
            spec["tolerations"] = [dict(t) for t in self.tolerations]
        if self.grace_s is not None:
            spec["terminationGracePeriodSeconds"] = self.grace_s
        if self.volumes:
            spec["volumes"] = [dict(v) for v in self.volumes]
        if self.init_containers:
            spec["initContainers"] = copy.deepcopy(self.init_containers)
        if self.sandboxed:  # the pod in its own user namespace: what an unmasked /proc needs
            spec["hostUsers"] = False
        return spec

    def container(self, name: str, command: list[str] | None = None, env: Mapping[str, str] | None = None) -> dict:
        c = {"name": name, "image": self.image, "imagePullPolicy": self.image_pull_policy,
             "resources": {k: dict(v) for k, v in self.resources.items()},
             "env": list(({e["name"]: e for e in self.env} | {k: {"name": k, "value": v} for k, v in (env or {}).items()})
                         .values())}  # one entry per name: the caller's value wins
        if command:
            c["command"] = list(command)
        if self.env_from:
            c["envFrom"] = [dict(e) for e in self.env_from]
        if self.volume_mounts:
            c["volumeMounts"] = [dict(m) for m in self.volume_mounts]
        if self.sandboxed:  # bubblewrap as uid 10001 (deploy/Dockerfile): unshare/mount, a fresh /proc
            c["securityContext"] = dict(SANDBOX_SECURITY)
        return c

    def k8s_config(self) -> dict:
        """The `dagster-k8s/config` dict: what K8sRunLauncher and k8s_job_executor merge into
        the Job they build (the image and namespace stay theirs)."""
        container = {k: v for k, v in self.container("dagster").items() if k in ("resources", "env", "envFrom",
                                                                                   "volumeMounts", "securityContext")}
        return {"container_config": container,
                "pod_spec_config": self.pod_spec(),
                "pod_template_spec_metadata": self.pod_meta(),
                "job_metadata": {"labels": dict(self.labels)}}


def placement(profile: DeployConfig, kind: str, *, gpus: int | None = None, orchestrator: bool = False) -> Placement:
    """`kind`'s placement on `profile`'s cluster. `gpus` overrides the row's (a training pod:
    the experiment's nproc_per_node); `orchestrator` = a pod that only launches and watches
    others (the run pod of a training run whose torchrun pods come through Pipes)."""
    k8s = profile.kubernetes
    if k8s is None:
        raise DeployError(f"deploy profile {profile.name}: no `kubernetes` section (image, kind table)")
    if kind not in k8s.kinds:
        raise DeployError(f"deploy profile {profile.name}: kinds has no row {kind!r} (have: {', '.join(k8s.kinds)})")
    shape = k8s.kinds[kind]
    cpu, memory = (ORCHESTRATOR["cpu"], ORCHESTRATOR["memory"]) if orchestrator else (shape.cpu, shape.memory)
    n_gpu = 0 if orchestrator else (shape.gpu if gpus is None else gpus)
    if n_gpu < 0:
        raise DeployError(f"kind {kind}: GPUs per pod must be >= 0, got {n_gpu}")
    requests = {"cpu": cpu, "memory": memory}
    limits = {"memory": memory if orchestrator else (shape.memory_limit or shape.memory)}
    if shape.cpu_limit and not orchestrator:
        limits["cpu"] = shape.cpu_limit
    if n_gpu:
        requests[k8s.gpu_resource] = limits[k8s.gpu_resource] = str(n_gpu)
    labels = {PART_OF: APP, KIND_LABEL: kind}
    if k8s.kueue_queue:
        labels[KUEUE_LABEL] = k8s.kueue_queue
    tolerations = [t.model_dump(exclude_none=True) for t in shape.tolerations]
    metrics = pod_metrics(k8s)
    env = {**profile_env(profile), settings.HOME: k8s.home_path, **metrics.env}
    volumes, mounts = [], []
    if k8s.home_claim:
        volumes = [{"name": HOME_VOLUME, "persistentVolumeClaim": {"claimName": k8s.home_claim}}]
        mounts = [{"name": HOME_VOLUME, "mountPath": k8s.home_path}]
    volumes, mounts = volumes + metrics.volumes, mounts + metrics.mounts
    grace = math.ceil(profile.training.preemption_grace_s) + GRACE_MARGIN_S if kind in GRACEFUL_KINDS else None
    return Placement(
        kind=kind, image=k8s.image, image_pull_policy=k8s.image_pull_policy, namespace=k8s.namespace,
        service_account=k8s.service_account, labels=labels,
        node_selector={k8s.pool_label: shape.pool, **shape.node_selector}, tolerations=tolerations,
        priority_class=shape.priority_class, resources={"requests": requests, "limits": limits},
        env=[{"name": k, "value": v} for k, v in sorted(env.items())],
        env_from=[{"secretRef": {"name": k8s.env_secret}}] if k8s.env_secret else [], grace_s=grace,
        volumes=volumes, volume_mounts=mounts, init_containers=metrics.init_containers,
        annotations=metrics.annotations, sandboxed=shape.sandboxed)


def run_placement(profile: DeployConfig, kind: str, nproc_per_node: int | None = None) -> Placement:
    """The run pod's placement. A training run (train, sweep) launched through Pipes pods only
    orchestrates; one trained in its own pod (launcher local) gets the experiment's GPUs."""
    if kind in GRACEFUL_KINDS:
        if profile.training.launcher == "kubernetes":
            return placement(profile, kind, orchestrator=True)
        return placement(profile, kind, gpus=nproc_per_node or 1)
    return placement(profile, kind)


def k8s_config(profile: DeployConfig, kind: str, *, gpus: int | None = None) -> dict:
    """`kind`'s `dagster-k8s/config` on `profile`'s cluster (see `Placement.k8s_config`)."""
    return placement(profile, kind, gpus=gpus).k8s_config()
