"""Training on Kubernetes through Dagster Pipes: the `training_run` asset's launcher 'kubernetes'.

`run_training_pods` creates what `factory.deploy.kube.training.training_pods` describes: for a
multi-node run first the headless Service and the workers' Indexed Job (they wait at the c10d
rendezvous, up to `RDZV_TIMEOUT_S`), then rank 0's pod through `PipesK8sClient`, which streams its
logs and Pipes messages back and waits for it to end. The Service and the Job are deleted in a
`finally`, whether rank 0 succeeded, failed or the run was terminated, so a failed run leaves no
worker holding GPUs (the Job's `ttlSecondsAfterFinished` is the backstop if this process dies).

The Kubernetes API clients are arguments, so a test passes recording fakes; by default they are
dagster-k8s's own, built after PipesK8sClient loads the cluster config (in-cluster in a run pod).
"""

from __future__ import annotations

from dagster import PipesClientCompletedInvocation
from dagster_k8s import PipesK8sClient
from dagster_k8s.client import DagsterKubernetesClient
from kubernetes.client.rest import ApiException

from factory.deploy import DeployConfig
from factory.deploy.kube.training import TrainingPods, training_pods


def run_training_pods(context, plan, profile: DeployConfig, *, run: str, home: str, reporter: str,
                      env: dict[str, str], kind: str = "train", pipes: PipesK8sClient | None = None,
                      core_api=None, batch_api=None) -> tuple[PipesClientCompletedInvocation, TrainingPods]:
    """Run `plan` on `profile`'s cluster; rank 0's Pipes session is returned with the pods' spec."""
    pipes = pipes or PipesK8sClient()
    pods = training_pods(plan, profile, run=run, run_id=context.run_id, home=home, reporter=reporter, env=env,
                         kind=kind)
    if core_api is None or batch_api is None:
        pipes._load_k8s_config()  # the same cluster config PipesK8sClient.run loads
        client = DagsterKubernetesClient.production_client()
        core_api, batch_api = core_api or client.core_api, batch_api or client.batch_api
    created: list[tuple[str, str]] = []
    try:
        if pods.service:
            core_api.create_namespaced_service(pods.namespace, pods.service)
            created.append(("service", pods.service["metadata"]["name"]))
        if pods.workers:
            batch_api.create_namespaced_job(pods.namespace, pods.workers)
            created.append(("job", pods.workers["metadata"]["name"]))
        workers = (f", {pods.workers['spec']['completions']} worker pod(s) (Job {pods.workers['metadata']['name']}) "
                   f"meeting at {pods.rdzv_endpoint}" if pods.workers else "")
        context.log.info(f"{run}: rank 0 through Pipes{workers}")
        # the image and command are in the pod spec's first container (Pipes refuses them as arguments
        # beside an init container); the metrics sidecar never decides whether rank 0 succeeded
        sidecars = {c["name"] for c in pods.pod_spec.get("initContainers", [])}
        completed = pipes.run(context=context, namespace=pods.namespace, base_pod_meta=pods.pod_meta,
                              base_pod_spec=pods.pod_spec, ignore_containers=sidecars or None)
    finally:
        for what, name in reversed(created):
            try:
                if what == "job":  # Background: the Job's pods go with it
                    batch_api.delete_namespaced_job(name, pods.namespace, propagation_policy="Background")
                else:
                    core_api.delete_namespaced_service(name, pods.namespace)
            except ApiException as e:  # never hide the run's own error behind a cleanup one
                context.log.warning(f"{run}: could not delete {what} {name} ({e.status} {e.reason}); "
                                    "its ttlSecondsAfterFinished removes a finished Job")
    return completed, pods
