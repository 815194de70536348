"""The factory's pods on Kubernetes, built offline with dagster-k8s's own functions and validated.

Covers: every asset declares its kind in its op tags; the run Job `FactoryK8sRunLauncher` really
creates (its `launch_run`, with a recording BatchV1 API and a throwaway kubeconfig: no cluster),
the step Jobs `k8s_job_executor` would create, and a 2-node training run's pods (rank 0 as
`PipesK8sClient` builds it, the workers' Indexed Job, the headless Service), for every asset kind:
each object passes `kubernetes-validate --strict` at the profile's cluster version
(`factory.deploy.kube.validate`), every quantity parses, and the placement (pool, tolerations,
GPUs, PriorityClass, grace period, Kueue label) is the kind table's; the metrics sidecar survives a
run's own `dagster-k8s/config` init containers and volumes (test_kube_monitoring.py covers the rest
of the metrics wiring). Golden snapshots under
tests/assets/k8s/ (one run Job per kind, and the training pods) show any change in review;
regenerate them with `FACTORY_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/deploy/test_kube_manifests.py`.

CPU only, no network, no cluster.
"""

import json
import os
from pathlib import Path

import pytest
import yaml
from kubernetes.client import ApiClient
from kubernetes.utils import parse_quantity

from factory.deploy import load_profile
from factory.deploy.config import ASSET_KINDS
from factory.deploy.kube.placement import GRACE_MARGIN_S, KIND_TAG, KUEUE_LABEL, SANDBOX_SECURITY
from factory.deploy.kube.validate import quantities, validate
from resources.k8s_manifests import EXAMPLE_PARALLEL, example_manifests, example_plan

GOLDEN = Path(__file__).resolve().parents[1] / "assets" / "k8s"
UPDATE = os.environ.get("FACTORY_UPDATE_GOLDEN") == "1"


@pytest.fixture(scope="module")
def profile():
    return load_profile("kubernetes")


@pytest.fixture(scope="module")
def manifests(profile):
    return example_manifests(profile)


def pod_spec(obj: dict) -> dict:
    return obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]


def test_every_asset_declares_its_kind():
    import definitions

    graph = definitions.defs.resolve_asset_graph()
    kinds = {k.to_user_string(): graph.get(k).assets_def.op.tags.get("factory/kind") for k in graph.get_all_asset_keys()}
    assert set(kinds.values()) <= set(KIND_TAG.values()), kinds
    assert [k for k, v in kinds.items() if v is None] == []
    # the values the run queue's limits and the sensors count stay as they were
    assert kinds["training_run"] == "training" and kinds["eval_scores"] == "eval"
    assert kinds["checkpoint_export"] == "export" and kinds["tokenizer"] == "tokenize" and kinds["mix"] == "mix"


def test_every_manifest_validates_strictly_at_the_cluster_version(profile, manifests):
    assert {f"run-job-{k}.yaml" for k in ASSET_KINDS} | {f"step-job-{k}.yaml" for k in ASSET_KINDS} <= set(manifests)
    assert {"train-rank0-pod.yaml", "train-workers-job.yaml", "train-rendezvous-service.yaml"} <= set(manifests)
    validate(list(manifests.values()), profile.kubernetes.cluster_version)
    found = [(where, value) for obj in manifests.values() for where, value in quantities(obj)]
    assert len(found) > 50
    for where, value in found:
        assert parse_quantity(value) > 0, where


@pytest.mark.parametrize("kind", ASSET_KINDS)
def test_run_and_step_jobs_are_placed_by_the_kind_table(profile, manifests, kind):
    k8s, shape = profile.kubernetes, profile.kubernetes.kinds[kind]
    for name in (f"run-job-{kind}.yaml", f"step-job-{kind}.yaml"):
        spec = pod_spec(manifests[name])
        assert spec["nodeSelector"] == {k8s.pool_label: shape.pool}, name
        assert spec["priorityClassName"] == shape.priority_class
        assert spec.get("tolerations", []) == [t.model_dump(exclude_none=True) for t in shape.tolerations]
        assert spec["serviceAccountName"] == k8s.service_account
        container = spec["containers"][0]
        assert container["image"] == k8s.image
        assert {"secretRef": {"name": k8s.env_secret}} in container["envFrom"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["FACTORY_DEPLOY"] == "kubernetes"
        assert env["FACTORY_DEPLOY_JSON"] == profile.model_dump_json()  # the pod runs on this very profile
        requests = container["resources"]["requests"]
        if kind in ("train", "sweep"):  # the run pod only watches the torchrun pods (launcher kubernetes)
            assert k8s.gpu_resource not in requests and requests["cpu"] == "1"
            assert spec["terminationGracePeriodSeconds"] == profile.training.preemption_grace_s + GRACE_MARGIN_S
        else:
            assert requests["cpu"] == shape.cpu and requests["memory"] == shape.memory
            assert requests.get(k8s.gpu_resource) == (str(shape.gpu) if shape.gpu else None)
            assert "terminationGracePeriodSeconds" not in spec
        assert manifests[name]["metadata"]["labels"]["factory.dev/kind"] == kind
        # FACTORY_HOME (checkpoints) is the shared claim, so a retried pod elsewhere resumes from it
        assert env["FACTORY_HOME"] == k8s.home_path
        assert {"name": "factory-home", "mountPath": k8s.home_path} in container["volumeMounts"]
        assert {"name": "factory-home", "persistentVolumeClaim": {"claimName": k8s.home_claim}} in spec["volumes"]
        # code evals and synthetic validators run bubblewrap as the image's uid: only their pods get
        # the seccomp profile and unmasked /proc (in a user namespace) it needs
        assert shape.sandboxed == (kind in ("eval", "synth", "build"))
        assert container.get("securityContext") == (SANDBOX_SECURITY if shape.sandboxed else None), name
        assert spec.get("hostUsers") == (False if shape.sandboxed else None), name


def test_training_pods_get_the_experiments_gpus_and_meet_at_rank_0(profile, manifests):
    rank0, workers, service = (manifests[f"train-{n}.yaml"] for n in ("rank0-pod", "workers-job", "rendezvous-service"))
    gpu = profile.kubernetes.gpu_resource
    for obj in (rank0, workers):
        spec = pod_spec(obj)
        resources = spec["containers"][0]["resources"]
        assert resources["requests"][gpu] == resources["limits"][gpu] == str(EXAMPLE_PARALLEL.nproc_per_node)
        assert spec["priorityClassName"] == "factory-training" and spec["nodeSelector"] == {"factory.dev/pool": "gpu"}
        assert spec["terminationGracePeriodSeconds"] == 120 and spec["subdomain"] == service["metadata"]["name"]
    assert workers["spec"]["completionMode"] == "Indexed"
    assert workers["spec"]["completions"] == workers["spec"]["parallelism"] == EXAMPLE_PARALLEL.nnodes - 1
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    selector = service["spec"]["selector"]
    assert selector.items() <= rank0["metadata"]["labels"].items()
    assert selector.items() <= workers["spec"]["template"]["metadata"]["labels"].items()
    endpoint = f"{pod_spec(rank0)['hostname']}.{service['metadata']['name']}.factory.svc:29400"
    assert f"--rdzv-endpoint={endpoint}" in rank0["spec"]["containers"][0]["command"]
    assert f"--rdzv-endpoint={endpoint}" in pod_spec(workers)["containers"][0]["command"]
    command = rank0["spec"]["containers"][0]["command"]
    assert command[command.index("--experiment-json") + 1] == example_plan(profile).experiment.model_dump_json()
    names = [e["name"] for e in rank0["spec"]["containers"][0]["env"]]
    assert {"DAGSTER_PIPES_CONTEXT", "DAGSTER_PIPES_MESSAGES", "FACTORY_DEPLOY_JSON", "FACTORY_HOME"} <= set(names)
    assert len(names) == len(set(names))  # one value per variable
    for obj in (rank0, workers):  # every node reads and writes the one checkpoint directory
        assert [v for v in pod_spec(obj)["volumes"] if "emptyDir" not in v] == [
            {"name": "factory-home", "persistentVolumeClaim": {"claimName": profile.kubernetes.home_claim}}]


def test_without_a_home_claim_pods_keep_their_own_disk(profile):
    local = example_manifests(profile.derive(**{"kubernetes.home_claim": None}))
    validate(list(local.values()), profile.kubernetes.cluster_version)
    pods = [pod_spec(o) for o in local.values() if o["kind"] != "Service"]
    assert all("persistentVolumeClaim" not in v for spec in pods for v in spec.get("volumes", []))


def test_a_kueue_queue_labels_every_job_and_pod(profile):
    queued = profile.derive(**{"kubernetes.kueue_queue": "factory-gpu"})
    manifests = example_manifests(queued)
    validate(list(manifests.values()), queued.kubernetes.cluster_version)
    for name, obj in manifests.items():
        if obj["kind"] in ("Job", "Pod"):
            assert obj["metadata"]["labels"][KUEUE_LABEL] == "factory-gpu", name
    assert KUEUE_LABEL not in example_manifests(profile)["run-job-mix.yaml"]["metadata"]["labels"]


def _redacted(node):
    """The profile's and the experiment's JSON as placeholders (both asserted elsewhere): the
    snapshots change with the placement, not with every edit of an unrelated config field."""
    if isinstance(node, dict):
        if node.get("name") == "FACTORY_DEPLOY_JSON" and "value" in node:
            return {**node, "value": "<the profile as JSON>"}
        return {k: _redacted(v) for k, v in node.items()}
    if isinstance(node, list):
        return [("<the experiment as JSON>" if i and node[i - 1] == "--experiment-json" else _redacted(v))
                for i, v in enumerate(node)]
    return node


def _golden_files(manifests: dict) -> dict[str, str]:
    class NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True

    def dump(*objs):
        return yaml.dump_all([_redacted(o) for o in objs], Dumper=NoAliases, sort_keys=True, width=120)

    files = {f"{kind}.yaml": dump(manifests[f"run-job-{kind}.yaml"]) for kind in ASSET_KINDS}
    files["train-pods.yaml"] = dump(*(manifests[f"train-{n}.yaml"] for n in ("rank0-pod", "workers-job",
                                                                          "rendezvous-service")))
    return files


def test_golden_snapshots_match(manifests):
    files = _golden_files(manifests)
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (GOLDEN / name).write_text(text)
    changed = [n for n, text in files.items() if not (GOLDEN / n).exists() or (GOLDEN / n).read_text() != text]
    assert changed == [], f"manifests changed: {changed}; review, then FACTORY_UPDATE_GOLDEN=1 to accept"
    assert _golden_files(example_manifests(load_profile("kubernetes"))) == files  # stable: no random names


# --- the launcher's own path: launch_run builds and submits the run Job -----------------------------------------


class RecordingBatchApi:
    def __init__(self):
        self.created = []

    def create_namespaced_job(self, namespace, body, **_):
        self.created.append((namespace, ApiClient().sanitize_for_serialization(body)))


@pytest.fixture
def launcher(tmp_path):
    from dagster._core.test_utils import instance_for_test

    from resources.k8s_launcher import FactoryK8sRunLauncher

    kubeconfig = tmp_path / "kubeconfig"  # K8sRunLauncher loads one in its constructor; nothing dials it
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "t", "user": {"token": "unused"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}]}))
    batch = RecordingBatchApi()
    with instance_for_test() as instance:
        launcher = FactoryK8sRunLauncher(
            deploy_profile="kubernetes", service_account_name="factory", instance_config_map="dagster-instance",
            dagster_home="/opt/dagster/dagster_home", job_image="ghcr.io/model-factory/factory:0.1.0-gpu",
            load_incluster_config=False, kubeconfig_file=str(kubeconfig), job_namespace="factory",
            k8s_client_batch_api=batch, k8s_client_core_api=object())
        launcher.register_instance(instance)
        yield launcher, instance, batch


def _launch(launcher, instance, batch, job_name: str, tags: dict | None = None, run_config: dict | None = None):
    import definitions
    from dagster._core.definitions.reconstruct import ReconstructableJob, ReconstructableRepository
    from dagster._core.launcher import LaunchRunContext
    from dagster._core.test_utils import create_run_for_test

    job = definitions.defs.get_repository_def().get_job(job_name)
    origin = ReconstructableJob(ReconstructableRepository.for_module("definitions", "defs"), job_name).get_python_origin()
    run = create_run_for_test(instance, job_name=job_name, job_snapshot=job.get_job_snapshot(), job_code_origin=origin,
                              tags={**job.tags, **(tags or {})}, run_config=run_config or {})
    launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    namespace, body = batch.created[-1]
    assert namespace == "factory"
    return body


def test_the_launcher_places_a_run_by_its_ops_kinds(launcher, profile):
    launcher, instance, batch = launcher
    body = _launch(launcher, instance, batch, "demo_job")  # ingest + refine + tokenizer: no job tag, the ops decide
    validate([body], profile.kubernetes.cluster_version)
    spec = pod_spec(body)
    assert spec["priorityClassName"] == "factory-cpu" and spec["nodeSelector"] == {"factory.dev/pool": "cpu"}
    assert spec["containers"][0]["resources"]["requests"] == {"cpu": "8", "memory": "32Gi"}  # refine's row
    eval_body = _launch(launcher, instance, batch, "eval_job")
    assert pod_spec(eval_body)["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert pod_spec(eval_body)["priorityClassName"] == "factory-eval"


def test_the_launcher_places_sweep_cells_and_lets_a_runs_own_config_win(launcher, profile):
    launcher, instance, batch = launcher
    cell = _launch(launcher, instance, batch, "train_job", tags={"factory/sweep": "tiny"})
    assert pod_spec(cell)["priorityClassName"] == "factory-sweep"
    assert pod_spec(cell)["terminationGracePeriodSeconds"] == profile.training.preemption_grace_s + GRACE_MARGIN_S
    override = '{"pod_spec_config": {"priorityClassName": "factory-eval"}}'
    body = _launch(launcher, instance, batch, "train_job", tags={"dagster-k8s/config": override})
    assert pod_spec(body)["priorityClassName"] == "factory-eval"  # the run's tag beats the kind table
    assert pod_spec(body)["nodeSelector"] == {"factory.dev/pool": "gpu"}  # the rest is still the kind's
    validate([cell, body], profile.kubernetes.cluster_version)


def test_a_training_run_in_its_own_pod_gets_the_experiments_gpus(launcher):
    from configs.experiments.smoke import smoke_ddp

    launcher, instance, batch = launcher
    launcher.__dict__["profile"] = load_profile("kubernetes").derive(**{"training.launcher": "local"})
    config = {"ops": {"training_run": {"config": {"experiment_json": smoke_ddp().model_dump_json()}}}}
    body = _launch(launcher, instance, batch, "train_job", run_config=config)
    assert pod_spec(body)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"  # nproc_per_node


# --- the step handler's own path: launch_step builds and submits the step Job -----------------------------------


def _launch_step(kubeconfig: str, job_name: str, step: str) -> dict:
    import definitions
    from dagster._core.definitions.reconstruct import ReconstructableJob, ReconstructableRepository
    from dagster._core.execution.api import create_execution_plan
    from dagster._core.execution.context.system import PlanData, PlanOrchestrationContext
    from dagster._core.execution.context_creation_job import create_context_free_log_manager
    from dagster._core.execution.retries import RetryMode
    from dagster._core.executor.step_delegating import StepHandlerContext
    from dagster._core.test_utils import create_run_for_test, instance_for_test
    from dagster._grpc.types import ExecuteStepArgs
    from dagster_k8s.container_context import K8sContainerContext

    from resources.k8s_launcher import FactoryK8sStepHandler

    config = {"deploy_profile": "kubernetes", "service_account_name": "factory", "instance_config_map": "dagster-instance",
              "job_image": "ghcr.io/model-factory/factory:0.1.0-gpu", "load_incluster_config": False,
              "kubeconfig_file": kubeconfig, "job_namespace": "factory"}
    batch = RecordingBatchApi()
    launcher = {"module": "resources.k8s_launcher", "class": "FactoryK8sRunLauncher", "config": config}
    with instance_for_test(overrides={"run_launcher": launcher}) as instance:
        job = definitions.defs.get_repository_def().get_job(job_name)
        recon = ReconstructableJob(ReconstructableRepository.for_module("definitions", "defs"), job_name)
        run = create_run_for_test(instance, job_name=job_name, job_snapshot=job.get_job_snapshot(),
                                  job_code_origin=recon.get_python_origin())
        plan = create_execution_plan(recon)
        handler = FactoryK8sStepHandler(image=config["job_image"], container_context=K8sContainerContext(namespace="factory"),
                                        load_incluster_config=False, kubeconfig_file=kubeconfig, k8s_client_batch_api=batch)
        orchestration = PlanOrchestrationContext(
            plan_data=PlanData(job=recon, dagster_run=run, instance=instance, execution_plan=plan, raise_on_error=True,
                               retry_mode=RetryMode.DISABLED),
            log_manager=create_context_free_log_manager(instance, run), executor=None, output_capture=None)
        args = ExecuteStepArgs(recon.get_python_origin(), run.run_id, [step], print_serialized_events=False)
        list(handler.launch_step(StepHandlerContext(instance=instance, plan_context=orchestration, steps=plan.steps,
                                                    execute_step_args=args, dagster_run=run)))
    namespace, body = batch.created[-1]
    assert namespace == "factory" and body["metadata"]["labels"]["app.kubernetes.io/component"] == "step_worker"
    return body


def test_the_step_handler_places_each_step_by_its_ops_kind(launcher, profile, tmp_path):
    kubeconfig = launcher[0].kubeconfig_file
    eval_step = _launch_step(kubeconfig, "eval_job", "eval_scores")
    tokenizer_step = _launch_step(kubeconfig, "tokenize_job", "tokenizer")
    validate([eval_step, tokenizer_step], profile.kubernetes.cluster_version)
    assert pod_spec(eval_step)["priorityClassName"] == "factory-eval"
    assert pod_spec(eval_step)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod_spec(tokenizer_step)["nodeSelector"] == {"factory.dev/pool": "cpu"}
    assert pod_spec(tokenizer_step)["containers"][0]["resources"]["requests"] == {"cpu": "4", "memory": "16Gi"}


def test_the_helm_values_configure_this_launcher():
    from dagster._config import process_config

    from resources.k8s_launcher import FactoryK8sRunLauncher

    values = yaml.safe_load((Path(__file__).resolve().parents[2] / "deploy" / "helm" / "values.yaml").read_text())
    custom = values["runLauncher"]["config"]["customRunLauncher"]
    assert (custom["module"], custom["class"]) == (FactoryK8sRunLauncher.__module__, FactoryK8sRunLauncher.__name__)
    assert process_config(FactoryK8sRunLauncher.config_type(), custom["config"]).success
    assert process_config(FactoryK8sRunLauncher.config_type(), {**custom["config"], "deploy_profile": "kubernetes"}).success


def test_the_metrics_sidecar_survives_a_runs_own_init_containers_and_volumes(launcher, profile):
    """dagster-k8s deep-merges `pod_spec_config` lists: a run tag's init containers and volumes are
    added to the kind's (the metrics sidecar and its emptyDir), not swapped for them."""
    launcher, instance, batch = launcher
    own = {"pod_spec_config": {
        "initContainers": [{"name": "fetch", "image": "busybox:1.36", "command": ["true"]}],
        "volumes": [{"name": "scratch", "emptyDir": {}}]},
        "container_config": {"volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}}
    body = _launch(launcher, instance, batch, "eval_job", tags={"dagster-k8s/config": json.dumps(own)})
    validate([body], profile.kubernetes.cluster_version)
    spec = pod_spec(body)
    assert [c["name"] for c in spec["initContainers"]] == ["metrics", "fetch"]
    assert spec["initContainers"][0]["restartPolicy"] == "Always"
    assert {v["name"] for v in spec["volumes"]} == {"factory-home", "factory-metrics", "scratch"}
    assert {m["name"] for m in spec["containers"][0]["volumeMounts"]} == {"factory-home", "factory-metrics", "scratch"}
    assert body["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9464"
