"""Example manifests of the factory's pods, built by dagster-k8s's own functions, for review.

`example_manifests(profile)` returns, per asset kind, the run Job `FactoryK8sRunLauncher` creates
(`construct_dagster_k8s_job`, component run_worker, the kind's placement merged as the launcher
merges it) and the step Job `k8s_job_executor` would create for one of the kind's ops (component
step_worker), plus one multi-node training run's pods: rank 0's pod as `PipesK8sClient` builds it
(`build_pod_body`), the workers' Indexed Job and the headless Service
(`factory.deploy.kube.training`). `factory deploy render` writes them beside the cluster
manifests, validated; tests/assets/k8s/ holds one of each kind as a golden snapshot.

They are examples, not objects to apply: Dagster creates the real ones per run. So every name
and id is fixed (`EXAMPLE_RUN_ID`, Pipes' random pod suffix as zeros) and the run worker's
`dagster api execute_run` argument, which serializes the run's code origin, is a placeholder:
the snapshot changes only when the placement or dagster-k8s's Job layout does.

It lives in the Dagster layer because it calls dagster-k8s (`factory/` never imports dagster).
"""

from __future__ import annotations

from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job, get_k8s_job_name
from dagster_k8s.pipes import build_pod_body
from kubernetes.client import ApiClient

from factory.deploy import DeployConfig, DeployError
from factory.deploy.config import ASSET_KINDS
from factory.deploy.kube.placement import Placement, run_placement
from factory.deploy.kube.training import training_pods
from factory.experiments.spec import Plan
from factory.train.config import ParallelConfig

EXAMPLE_RUN_ID = "0a1b2c3d-0000-4000-8000-000000000000"
DAGSTER_HOME = "/opt/dagster/dagster_home"  # the Dagster chart's
INSTANCE_CONFIG_MAP = "dagster-instance"  # the chart's ConfigMap of dagster.yaml
PG_SECRET = "dagster-postgresql-secret"  # the chart's Postgres password Secret
# one job and one of its ops per kind (jobs/__init__.py, the asset keys as op names)
EXAMPLE_OPS = {"refine": ("dedup_job", "staged__python_stdlib_exact_deduped"), "tokenize": ("tokenize_job", "tokenizer"),
               "mix": ("mix_job", "mix"), "train": ("train_job", "training_run"),
               "export": ("eval_job", "checkpoint_export"), "eval": ("eval_job", "eval_scores"),
               "synth": ("synth_job", "synthetic__rephrase"), "sweep": ("train_job", "training_run"),
               "build": ("envs_build_job", "envs__builds")}
EXAMPLE_PARALLEL = ParallelConfig(nnodes=2, nproc_per_node=8)
IMAGE_PYTHON = "/opt/venv/bin/python"  # deploy/Dockerfile's venv (the example is built outside the image)


def _dict(model) -> dict:
    return ApiClient().sanitize_for_serialization(model)


def container_context(profile: DeployConfig, where: Placement) -> K8sContainerContext:
    """What the launcher's `get_container_context_for_run` gives a run of `where`'s kind, with the
    chart's launcher settings (namespace, service account, pull policy) and no run tags."""
    k8s = profile.kubernetes
    base = K8sContainerContext(namespace=k8s.namespace, service_account_name=k8s.service_account,
                               image_pull_policy=k8s.image_pull_policy)
    return K8sContainerContext(run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(where.k8s_config())).merge(base)


def dagster_job(profile: DeployConfig, where: Placement, *, job: str, op: str | None, run_id: str = EXAMPLE_RUN_ID) -> dict:
    """The run Job (`op` None) or the step Job of `op`, as dagster-k8s builds it."""
    context = container_context(profile, where)
    config = DagsterK8sJobConfig(job_image=profile.kubernetes.image, dagster_home=DAGSTER_HOME,
                                 instance_config_map=INSTANCE_CONFIG_MAP, postgres_password_secret=PG_SECRET,
                                 image_pull_policy=profile.kubernetes.image_pull_policy)
    labels = {"dagster/job": job, "dagster/run-id": run_id}
    env = [{"name": "DAGSTER_RUN_JOB_NAME", "value": job}]
    if op is None:  # K8sRunLauncher._launch_k8s_job_with_args
        name, component, args = f"dagster-run-{run_id}", "run_worker", ["dagster", "api", "execute_run", "<ExecuteRunArgs>"]
    else:  # K8sStepHandler.launch_step
        name, component = f"dagster-step-{get_k8s_job_name(run_id, op)}", "step_worker"
        args = ["dagster", "api", "execute_step", "<ExecuteStepArgs>"]
        labels["dagster/op"] = op
        env.append({"name": "DAGSTER_RUN_STEP_KEY", "value": op})
    body = _dict(construct_dagster_k8s_job(job_config=config, args=args, job_name=name, pod_name=name,
                                           component=component, user_defined_k8s_config=context.run_k8s_config,
                                           labels=labels, env_vars=env))
    body["metadata"]["namespace"] = context.namespace
    return body


def example_plan(profile: DeployConfig, parallel: ParallelConfig = EXAMPLE_PARALLEL) -> Plan:
    """The smoke experiment on `parallel` (default 2 nodes x 8 GPUs), planned without a lake."""
    from configs.experiments.smoke import smoke

    experiment = smoke().derive(parallel=parallel, global_batch=16 * parallel.world_size,
                                loader_shards=parallel.world_size)
    return Plan(experiment=experiment, model=experiment.model.model_copy(update={"vocab_size": 512}),
                mix_version="mix/default@v1", tokenizer="tokenizer/default@example", seq_len=256,
                steps=experiment.steps, tokens_per_step=256 * experiment.global_batch, grad_accum=1,
                parameters=1_840_000, config_hash="example")


def training_manifests(profile: DeployConfig, plan: Plan, *, run: str, run_id: str = EXAMPLE_RUN_ID,
                       kind: str = "train") -> dict[str, dict]:
    """Rank 0's pod (as PipesK8sClient builds it; its Pipes context is a placeholder) and, for
    several nodes, the workers' Indexed Job and the headless Service."""
    from resources.pipes_reporter import SPEC

    home = profile.kubernetes.home_path

    pods = training_pods(plan, profile, run=run, run_id=run_id, home=home, reporter=SPEC,
                         env={"FACTORY_HOME": home}, kind=kind, python=IMAGE_PYTHON)
    pipes_env = {"DAGSTER_PIPES_CONTEXT": "<set by PipesK8sClient>", "DAGSTER_PIPES_MESSAGES": "<set by PipesK8sClient>"}
    pod = _dict(build_pod_body(pod_name=f"dagster-{run_id[:18]}-training-run-0000000000", image=None, command=None,
                               env_vars=pipes_env, base_pod_meta=pods.pod_meta, base_pod_spec=pods.pod_spec))
    pod = {"apiVersion": "v1", "kind": "Pod", **pod}
    pod["metadata"]["namespace"] = pods.namespace
    out = {"train-rank0-pod.yaml": pod}
    if pods.workers:
        out |= {"train-workers-job.yaml": pods.workers, "train-rendezvous-service.yaml": pods.service}
    return out


def example_manifests(profile: DeployConfig) -> dict[str, dict]:
    """File name -> object: a run Job and a step Job per asset kind, and one training run's pods."""
    if profile.kubernetes is None:
        raise DeployError(f"deploy profile {profile.name}: no `kubernetes` section, so no pods to render")
    nproc = EXAMPLE_PARALLEL.nproc_per_node
    out = {}
    for i, kind in enumerate(ASSET_KINDS):  # one run id per kind: the run Jobs' names differ
        job, op = EXAMPLE_OPS[kind]
        where, run_id = run_placement(profile, kind, nproc_per_node=nproc), f"{EXAMPLE_RUN_ID[:-12]}{i + 1:012d}"
        out[f"run-job-{kind}.yaml"] = dagster_job(profile, where, job=job, op=None, run_id=run_id)
        out[f"step-job-{kind}.yaml"] = dagster_job(profile, where, job=job, op=op, run_id=run_id)
    return out | training_manifests(profile, example_plan(profile), run="smoke-5e1f0c27")


__all__ = ["EXAMPLE_RUN_ID", "dagster_job", "example_manifests", "training_manifests"]
