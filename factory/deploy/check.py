"""`factory deploy check`: does every engine the profile names answer, with these credentials?

Validation (pydantic) catches an unknown engine or a malformed field when the profile is loaded;
this module asks the engines themselves, cheaply, before any work starts: the catalog lists its
namespaces, the object store lists the warehouse bucket, a Spark standalone master accepts a TCP
connection, an MLflow server answers /health, Postgres accepts the credentials. Each failure
names the profile field to fix (`catalog.uri`, `catalog.s3.access_key_id`, `spark.master`, ...)
and what the engine said. `make demo` runs it first, so a bad profile costs seconds, not a
half-made demo.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlparse

from factory import settings
from factory.deploy.config import DeployConfig, DeployError

CREDENTIAL_FIELDS = ("catalog.credential", "catalog.token", "catalog.s3.access_key_id")
TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Probe:
    field: str  # the profile field this probe checks
    engine: str
    ok: bool
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


def _why(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) < 400 else text[:400] + " ..."


def _tcp(host: str, port: int) -> str | None:
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT_S):
            return None
    except OSError as e:
        return f"{host}:{port} does not answer ({e.strerror or e})"


def probe_catalog(profile: DeployConfig, home: Path) -> Probe:
    from factory.deploy.profiles import catalog_config
    from factory.lake import Lake, LakeError

    c = profile.catalog
    where = c.uri or "sqlite under FACTORY_HOME/lake"
    try:
        lake = Lake.open(catalog_config(profile), home=home)
        namespaces = lake.catalog.list_namespaces()
    except (DeployError, LakeError) as e:
        # opening the lake already names the field (catalog.uri, catalog.credential, catalog.s3.*)
        field = str(e).split(":")[0]
        what = "rejected the credentials" if field.startswith(CREDENTIAL_FIELDS) else "failed"
        return Probe(field, "catalog", False, f"{where} {what}: {e}")
    except Exception as exc:  # noqa: BLE001 - every failure is reported with the field to fix
        return Probe("catalog.uri", "catalog", False, f"{where} does not answer: {_why(exc)}")
    return Probe("catalog", "catalog", True, f"{c.kind} catalog at {where}: {len(namespaces)} namespaces")


def probe_object_store(profile: DeployConfig) -> Probe | None:
    s3 = profile.catalog.s3
    if s3 is None or not (profile.catalog.warehouse or "").startswith("s3"):
        return None
    from pyarrow import fs

    from factory.data.objectstore import ArrowS3
    from factory.lake.catalog import object_store_unreachable

    bucket = urlparse(profile.catalog.warehouse).netloc
    try:
        store = ArrowS3.of(s3).filesystem(timeout_s=TIMEOUT_S, attempts=1)
    except DeployError as e:
        return Probe(str(e).split(":")[0], "object store", False, str(e))
    try:
        info = store.get_file_info(fs.FileSelector(bucket, recursive=False, allow_not_found=True))
    except OSError as exc:
        if object_store_unreachable(exc):
            return Probe("catalog.s3.endpoint", "object store", False,
                         f"{s3.endpoint or 'S3'} does not answer: {_why(exc)}")
        return Probe("catalog.s3.access_key_id", "object store", False,
                     f"{s3.endpoint or 'S3'} rejected the keys: {_why(exc)}")
    return Probe("catalog.s3", "object store", True, f"s3://{bucket} at {s3.endpoint or 'AWS'}: {len(info)} entries")


def probe_spark(profile: DeployConfig) -> Probe:
    return probe_spark_master(profile.spark.master)


def probe_spark_master(master: str) -> Probe:
    if master.startswith("spark://"):
        for hostport in master[len("spark://"):].split(","):
            host, port = hostport.rsplit(":", 1)
            if (error := _tcp(host, int(port))) is not None:
                return Probe("spark.master", "spark", False, f"Spark master {master}: {error}")
        return Probe("spark.master", "spark", True, f"standalone master {master} accepts connections")
    if master.startswith("k8s://"):
        url = urlparse(master[len("k8s://"):])
        if (error := _tcp(url.hostname or "", url.port or 443)) is not None:
            return Probe("spark.master", "spark", False, f"Kubernetes API {master}: {error}")
    return Probe("spark.master", "spark", True, f"{master} (started by the driver)")


def probe_tracker(profile: DeployConfig) -> Probe | None:
    uri = profile.tracker.mlflow_tracking_uri
    if "mlflow" not in profile.tracker.backends or not uri or not uri.startswith("http"):
        return None
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=TIMEOUT_S) as response:
            response.read()
    except (urllib.error.URLError, OSError) as exc:
        return Probe("tracker.mlflow_tracking_uri", "mlflow", False, f"{uri} does not answer: {_why(exc)}")
    return Probe("tracker.mlflow_tracking_uri", "mlflow", True, f"MLflow server {uri} answers")


def probe_dagster(profile: DeployConfig) -> Probe:
    if profile.dagster.storage != "postgres":
        return Probe("dagster.storage", "dagster", True, "sqlite under DAGSTER_HOME")
    from factory.deploy.instance import check_postgres

    pg = profile.dagster.postgres
    try:
        check_postgres(pg)
    except DeployError as e:
        return Probe(str(e).split(":")[0], "dagster", False, str(e))
    return Probe("dagster.postgres", "dagster", True, f"Postgres {pg.user}@{pg.host}:{pg.port}/{pg.db} accepts the credentials")


def probe_training(profile: DeployConfig) -> Probe:
    t = profile.training
    if t.launcher == "kubernetes":
        return probe_kubernetes(profile)
    if t.launcher == "multinode":
        return Probe("training.rdzv_endpoint", "training", True, f"one torchrun agent per node, c10d rendezvous at "
                     f"{t.rdzv_endpoint} (node 0 opens it when a run starts)")
    return Probe("training.launcher", "training", True, "torchrun on this node")


def probe_kubernetes(profile: DeployConfig) -> Probe:
    """The cluster's API (in-cluster credentials in a pod, else the kubeconfig) lists pods in the
    profile's namespace: what the run launcher and the training pods' PipesK8sClient need."""
    namespace = profile.kubernetes.namespace
    try:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config(config_file=settings.kubeconfig())  # None: ~/.kube/config
        client.CoreV1Api().list_namespaced_pod(namespace, limit=1, _request_timeout=5)
    except Exception as exc:  # noqa: BLE001 - any failure is the probe's answer, named
        return Probe("kubernetes.namespace", "kubernetes", False, f"the Kubernetes API does not list pods in namespace "
                     f"{namespace!r}: {_why(exc)}")
    return Probe("kubernetes.namespace", "kubernetes", True, f"the Kubernetes API lists pods in namespace {namespace!r}")


def check_profile(profile: DeployConfig, home: Path) -> list[Probe]:
    """Every probe of `profile`, cheapest first; none raises."""
    probes = [probe_spark(profile), probe_object_store(profile), probe_catalog(profile, home),
              probe_training(profile), probe_tracker(profile), probe_dagster(profile)]
    return [p for p in probes if p is not None]


def require_profile(profile: DeployConfig, home: Path) -> list[Probe]:
    """`check_profile`, raising one DeployError that lists every failing field."""
    probes = check_profile(profile, home)
    failed = [p for p in probes if not p.ok]
    if failed:
        raise DeployError(f"deploy profile {profile.name}: " + "; ".join(f"{p.field}: {p.detail}" for p in failed))
    return probes
