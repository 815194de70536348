"""The factory on a Kubernetes cluster: Dagster's official chart runs the webserver, daemon and a
user-code deployment from the factory image; every run is a Job (K8sRunLauncher), placed by its
asset kind on a node pool with the requests and PriorityClass of the kind table below.

    factory deploy render --deploy kubernetes --out build/k8s     # every manifest and values file, validated
    # then follow deploy/README.md (helm install, kubectl apply)

The addresses are in-cluster Service names the manifests create (or that the cluster admin
provides: the Iceberg REST catalog, object storage, Postgres, MLflow). Credentials are never
values here: the pods read them from the `factory-secrets` Secret by the variable names below.
"""

from factory.deploy import DeployConfig
from factory.deploy.config import (
    CatalogProfile,
    DagsterProfile,
    InferenceProfile,
    KubernetesProfile,
    PodShape,
    PostgresConfig,
    PriorityClassSpec,
    S3Config,
    Secret,
    ServingProfile,
    SparkProfile,
    Toleration,
    TrackerProfile,
    TrainingProfile,
)

IMAGE = "ghcr.io/model-factory/factory:0.1.0-gpu"
# The export the vLLM Deployment serves: replace both with yours (`factory export` prints the directory).
SERVED = ServingProfile(export="export/smoke-6adb0d12@10", export_dir="smoke-6adb0d12@10-bb33dd677365")
ENDPOINT = f"http://vllm.factory.svc:{SERVED.port}/v1"
GPU_TAINT = [Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")]

# evals > training > sweep cells > synthetic backfill. Evals preempt anything below them; synthetic
# backfill never preempts: it only fills idle GPUs and is the first to go.
PRIORITIES = [
    PriorityClassSpec(name="factory-eval", value=100000, description="Evals of new checkpoints: preempt long jobs."),
    PriorityClassSpec(name="factory-training", value=50000, description="Training runs (checkpoint on SIGTERM)."),
    PriorityClassSpec(name="factory-sweep", value=20000, description="Sweep cells: behind training."),
    PriorityClassSpec(name="factory-cpu", value=10000,
                      description="CPU-pool work (refine, tokenize, mix, repository builds)."),
    PriorityClassSpec(name="factory-backfill", value=1000, preemption_policy="Never",
                      description="Synthetic-data backfill on idle GPUs: never preempts, preempted first."),
]

# The kind table: where each asset kind runs and what it asks for. A training pod's GPU count and
# the number of pods come from the experiment's parallelism (nproc_per_node, nnodes), not from here.
KINDS = {
    "refine": PodShape(pool="cpu", cpu="8", memory="32Gi", priority_class="factory-cpu"),
    "tokenize": PodShape(pool="cpu", cpu="4", memory="16Gi", priority_class="factory-cpu"),
    "mix": PodShape(pool="cpu", cpu="2", memory="8Gi", priority_class="factory-cpu"),
    # repository environments and task derivation: builds and test suites run in the sandbox
    "build": PodShape(pool="cpu", cpu="8", memory="32Gi", priority_class="factory-cpu", sandboxed=True),
    "train": PodShape(pool="gpu", cpu="8", memory="64Gi", priority_class="factory-training", tolerations=GPU_TAINT),
    "export": PodShape(pool="gpu", cpu="4", memory="32Gi", gpu=1, priority_class="factory-eval", tolerations=GPU_TAINT),
    "eval": PodShape(pool="gpu", cpu="4", memory="32Gi", gpu=1, priority_class="factory-eval", tolerations=GPU_TAINT,
                     sandboxed=True),  # HumanEval checks run in the sandbox
    "synth": PodShape(pool="gpu", cpu="4", memory="32Gi", gpu=1, priority_class="factory-backfill",
                      tolerations=GPU_TAINT, sandboxed=True),  # the sandbox validator runs generated code
    "sweep": PodShape(pool="gpu", cpu="8", memory="64Gi", priority_class="factory-sweep", tolerations=GPU_TAINT),
}


def kubernetes() -> DeployConfig:
    s3 = S3Config(endpoint="http://object-store.factory.svc:8333",
                  access_key_id=Secret(env="FACTORY_S3_ACCESS_KEY"), secret_access_key=Secret(env="FACTORY_S3_SECRET_KEY"))
    return DeployConfig(
        name="kubernetes",
        description="Dagster on Kubernetes (official chart, K8sRunLauncher), runs placed by asset kind on CPU/GPU "
                    "node pools, Iceberg REST + S3, Spark on Kubernetes, training pods through PipesK8sClient, "
                    "a vLLM Deployment for evals and synthetic data, Postgres and MLflow servers",
        catalog=CatalogProfile(kind="rest", uri="http://iceberg-rest.factory.svc:8181", warehouse="s3://warehouse",
                               s3=s3, sigv4=True),
        spark=SparkProfile(master="k8s://https://kubernetes.default.svc", object_store="arrow",
                           conf={"spark.kubernetes.namespace": "factory", "spark.kubernetes.container.image": IMAGE,
                                 "spark.executor.instances": "4", "spark.executor.memory": "8g"}),
        training=TrainingProfile(launcher="kubernetes", preemption_grace_s=90),
        # evals and exports check each new checkpoint on their own pod's GPU, in fp32 (the equivalence
        # check compares at fp32); `kubernetes_served` sends evals and synthetic data to the vLLM Service
        inference=InferenceProfile(kind="vllm", dtype="float32"),
        tracker=TrackerProfile(mlflow_tracking_uri="http://mlflow.factory.svc:5000"),
        dagster=DagsterProfile(storage="postgres", postgres=PostgresConfig(
            host="dagster-postgresql.factory.svc", password=Secret(env="FACTORY_DAGSTER_PG_PASSWORD"))),
        kubernetes=KubernetesProfile(image=IMAGE, priority_classes=PRIORITIES, kinds=KINDS, serving=SERVED),
    )


def kubernetes_served() -> DeployConfig:
    """The cluster with evals and synthetic generation sent to the vLLM Service (elastic, behind its
    HPA) instead of an engine in each pod. The Service serves one export (`SERVED`): an eval of any
    other export is refused, naming what the Service serves."""
    k8s = kubernetes()
    return k8s.derive(name="kubernetes_served", description=k8s.description + "; evals and synthetic data through "
                      "the vLLM Service", inference=InferenceProfile(kind="openai", endpoint=ENDPOINT, dtype="float32"))
