"""A training run's pods on Kubernetes: torchrun on `parallel.nnodes` pods of
`parallel.nproc_per_node` GPUs each, rank 0 reporting to Dagster through Pipes.

`training_pods(plan, profile, ...)` returns the objects the `training_run` asset creates
(`resources.k8s_training`), as plain dicts in the API's own form:

- rank 0: the fields of the pod `PipesK8sClient` launches (its metadata, its PodSpec whose first
  container carries the image and the command `factory.train.launch.launch_command` gives node
  rank 0: Pipes refuses `image`/`command` arguments once the pod has an init container, such as
  the metrics sidecar). Pipes names the pod and injects its context; rank 0 hosts the c10d
  rendezvous store (`is_host=1`).
- for nnodes > 1, the other nodes as one Indexed Job (completions = parallelism = nnodes - 1):
  pod `i` is node rank `i + 1`, computed in the pod from `JOB_COMPLETION_INDEX` by a one-line
  shell (`exec "$@"`: the argv is passed through untouched, no quoting of the experiment JSON).
- a headless Service (`clusterIP: None`, `publishNotReadyAddresses`) selecting the run's pods, so
  every pod's `<hostname>.<service>` resolves before any is Ready: workers reach rank 0's store at
  `<name>-0.<name>.<namespace>.svc:29400`, and torch's process group reaches group rank 0.

Why the hostnames: c10d numbers the agents by sorting their host names (torch's
`DynamicRendezvousHandler`), not by `--node-rank`. Rank 0's pod is `<name>-0` and the workers
are `<name>-w-<index>` (the Indexed Job's own hostnames), and "0" sorts before "w": the pod that
Pipes reads logs from holds global rank 0, the one process that reports (`open_reporter`).

Every pod is placed by the `train` row (or `sweep`, for a sweep cell) with the experiment's GPUs,
so a preempted worker gets the same grace as rank 0; the Job never retries (`backoffLimit: 0`):
a dead node ends the run, which resumes from its last checkpoint when Dagster retries it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from factory.deploy.config import DeployConfig
from factory.deploy.kube.placement import Placement, placement
from factory.experiments.spec import Plan
from factory.train.launch import launch_command

RDZV_PORT = 29400
RUN_LABEL = "factory.dev/training-run"
ROLE_LABEL = "factory.dev/training-role"
CONTAINER = "trainer"


@dataclass(frozen=True)
class TrainingPods:
    """What one training run creates: rank 0 (through Pipes), and for several nodes the workers'
    Indexed Job and the headless Service they meet at."""

    name: str
    namespace: str
    image: str
    command: list[str]
    pod_meta: dict
    pod_spec: dict
    workers: dict | None
    service: dict | None

    @property
    def rdzv_endpoint(self) -> str:
        return f"{self.name}-0.{self.name}.{self.namespace}.svc:{RDZV_PORT}"


def pods_name(run: str, run_id: str) -> str:
    """A DNS label for the run's objects: the run name (lowercased, `_` -> `-`) and the Dagster
    run id's first 8 characters (a retried run never meets its predecessor's leftovers), short
    enough that `<name>-w-<index>` stays within 63 characters."""
    slug = re.sub(r"[^a-z0-9-]+", "-", run.lower()).strip("-")[:40].rstrip("-") or "run"
    return f"{slug}-{run_id[:8].lower()}" if run_id else slug


def training_pods(plan: Plan, profile: DeployConfig, *, run: str, run_id: str, home: str,
                  reporter: str | None = None, env: dict[str, str] | None = None, kind: str = "train",
                  python: str | None = None) -> TrainingPods:
    """The pods of `plan`'s run on `profile`'s cluster (see the module docstring). The commands
    start this interpreter (the run pod's, which is the image's) unless `python` names another."""
    parallel = plan.experiment.parallel
    where = placement(profile, kind, gpus=parallel.nproc_per_node)
    name = pods_name(run, run_id)
    labels = {**where.labels, RUN_LABEL: name}
    multinode = parallel.nnodes > 1
    training = profile.training.model_copy(update={"rdzv_endpoint": f"{name}-0.{name}.{where.namespace}.svc:{RDZV_PORT}"})

    def command(node_rank: int) -> list[str]:
        argv = launch_command(plan, home=home, run_id=run_id, run=run, reporter=reporter, training=training,
                              node_rank=node_rank)
        return [python or argv[0], *argv[1:]]

    spec = {**where.pod_spec(), "restartPolicy": "Never",
            "containers": [where.container(CONTAINER, command(0), env=env)]}
    if multinode:
        spec |= {"hostname": f"{name}-0", "subdomain": name}
    pods = TrainingPods(name=name, namespace=where.namespace, image=where.image, command=command(0),
                        pod_meta=where.pod_meta({RUN_LABEL: name, ROLE_LABEL: "rank0"}), pod_spec=spec,
                        workers=None, service=None)
    if not multinode:
        return pods
    return TrainingPods(**{**pods.__dict__, "workers": _workers(name, where, labels, command(1), parallel.nnodes, env),
                           "service": _service(name, where.namespace, labels)})


def worker_command(command: list[str]) -> list[str]:
    """Node rank 1's command made generic: the rank is JOB_COMPLETION_INDEX + 1, read in the pod."""
    rest = [a for a in command[3:] if not a.startswith("--node-rank=")]
    return ["/bin/sh", "-c", 'exec "$0" -m torch.distributed.run --node-rank=$((JOB_COMPLETION_INDEX + 1)) "$@"',
            command[0], *rest]


def _workers(name: str, where: Placement, labels: dict, command: list[str], nnodes: int,
             env: dict[str, str] | None) -> dict:
    role = {**labels, ROLE_LABEL: "worker"}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"{name}-w", "namespace": where.namespace, "labels": dict(role)},
        "spec": {
            "completionMode": "Indexed", "completions": nnodes - 1, "parallelism": nnodes - 1,
            "backoffLimit": 0, "ttlSecondsAfterFinished": 3600,
            "template": {"metadata": where.pod_meta(role), "spec": {
                **where.pod_spec(), "restartPolicy": "Never", "subdomain": name,
                "containers": [where.container(CONTAINER, worker_command(command), env=env)]}},
        },
    }


def _service(name: str, namespace: str, labels: dict) -> dict:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {RUN_LABEL: name},
                 "ports": [{"name": "c10d", "port": RDZV_PORT, "targetPort": RDZV_PORT, "protocol": "TCP"}]},
    }
