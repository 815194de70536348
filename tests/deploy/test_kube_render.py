"""`factory deploy render` and the cluster objects it writes (`factory.deploy.kube.render`,
`cluster`, `validate`): the kubernetes profile renders into tmp_path through the CLI, and every
object in every file (cluster groups and the run launcher's per-kind examples) validates strictly
against the profile's Kubernetes version, with every resource quantity parsed by the Kubernetes
client; the PriorityClasses keep evals > training > sweep > synthetic backfill (backfill never
preempts); the HPA scales the vLLM Deployment on vLLM's own queue metric; the Role covers what the
run launcher and Pipes touch; Secrets are empty templates; Kueue objects appear only when the
profile names a queue. A profile without a `kubernetes` section, an invalid quantity or a misspelt
field fails naming the profile or the object, and nothing is written (an earlier output stays as it
was). `factory deploy check`'s kubernetes probe fails naming the namespace without credentials and
passes against a loopback stand-in that answers the pod list. Unit tier, CPU, offline: no cluster,
no kubectl."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes.utils import parse_quantity

from factory.cli import main
from factory.deploy import DeployError, load_profile
from factory.deploy.kube.cluster import VLLM, WAITING_METRIC, cluster_manifests
from factory.deploy.kube.render import example_objects, render_files, write_render
from factory.deploy.kube.validate import quantities, validate


@pytest.fixture(scope="module")
def profile():
    return load_profile("kubernetes")


@pytest.fixture(scope="module")
def rendered(profile, tmp_path_factory):
    out = tmp_path_factory.mktemp("render") / "k8s"
    assert main(["deploy", "render", "--deploy", "kubernetes", "--out", str(out)]) == 0
    return out


def _objects(out: Path) -> dict[str, dict]:
    found = {}
    for path in sorted(out.rglob("*.yaml")):
        if path.name in ("values.yaml", "kustomization.yaml"):
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return found


def test_render_writes_values_groups_examples_and_the_apply_order(rendered, profile):
    names = {p.relative_to(rendered).as_posix() for p in rendered.rglob("*") if p.is_file()}
    groups = [f"{g}.yaml" for g in cluster_manifests(profile)]
    examples = {f"examples/{k}" for k in example_objects(profile)}
    assert names == {"values.yaml", "kustomization.yaml", "README.md", *groups, *examples}
    assert yaml.safe_load((rendered / "kustomization.yaml").read_text())["resources"] == groups
    readme = (rendered / "README.md").read_text()
    assert [line.split()[-1] for line in readme.splitlines() if line.startswith("kubectl apply -f")] == groups
    assert "--version 1.13.27" in readme


def test_every_object_is_valid_strict_and_its_quantities_parse(rendered, profile):
    objects = _objects(rendered)
    assert len(objects) >= 15
    version = profile.kubernetes.cluster_version
    for name, obj in objects.items():
        if not obj["apiVersion"].startswith(("kueue.", "monitoring.coreos.com/")):  # CRDs: validate.py's schemas
            assert kubernetes_validate.validate(obj, version, strict=True) == version, name
        for where, value in quantities(obj):
            parse_quantity(value)
    vllm = objects[f"Deployment/{VLLM}"]
    paths = dict(quantities(vllm))
    assert paths["spec.template.spec.containers[0].resources.requests.nvidia.com/gpu"] == "1"


def test_priority_classes_keep_the_order_and_backfill_never_preempts(rendered):
    classes = {o["metadata"]["name"]: o for o in _objects(rendered).values() if o["kind"] == "PriorityClass"}
    value = {name: o["value"] for name, o in classes.items()}
    assert value["factory-eval"] > value["factory-training"] > value["factory-sweep"] > value["factory-backfill"]
    assert classes["factory-backfill"]["preemptionPolicy"] == "Never"
    assert classes["factory-eval"]["preemptionPolicy"] == "PreemptLowerPriority"


def test_vllm_deployment_service_and_hpa(rendered, profile):
    objects, serving = _objects(rendered), profile.kubernetes.serving
    pod = objects[f"Deployment/{VLLM}"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    args = container["args"]
    k8s = profile.kubernetes  # the export the export pods wrote to the home volume, mounted read-only
    assert args[args.index("--model") + 1] == f"{k8s.home_path}/artifacts/exports/{serving.export_dir}"
    assert container["volumeMounts"] == [{"name": "home", "mountPath": k8s.home_path, "readOnly": True}]
    names = args[args.index("--served-model-name") + 1:args.index("--host")]
    assert names == [serving.export, serving.alias]  # the export id first: the OpenAI engine checks it
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["resources"]["limits"][profile.kubernetes.gpu_resource] == str(serving.gpu)
    assert pod["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
    assert pod["spec"]["priorityClassName"] == "factory-eval"
    service = objects[f"Service/{VLLM}"]["spec"]
    assert service["ports"][0]["port"] == serving.port and service["selector"] == pod["metadata"]["labels"]
    if profile.inference.kind == "openai":  # the runs' endpoint is this Service
        assert profile.inference.endpoint.startswith(f"http://{VLLM}.factory.svc:{serving.port}/")
    hpa = objects[f"HorizontalPodAutoscaler/{VLLM}"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": VLLM}
    (metric,) = hpa["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == WAITING_METRIC == "vllm:num_requests_waiting"
    assert parse_quantity(metric["pods"]["target"]["averageValue"]) == serving.target_waiting_requests
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (serving.min_replicas, serving.max_replicas)
    rules = yaml.safe_load(objects["ConfigMap/prometheus-adapter-factory-rules"]["data"]["rules.yaml"])
    assert rules[0]["seriesQuery"].startswith(WAITING_METRIC + "{") and rules[0]["name"]["as"] == WAITING_METRIC


def test_role_covers_the_launcher_and_pipes_and_secrets_are_empty(rendered, profile):
    objects = _objects(rendered)
    rules = objects["Role/factory-runs"]["rules"]
    granted = {(r, v) for rule in rules for r in rule["resources"] for v in rule["verbs"]}
    for need in [("jobs", "create"), ("jobs", "delete"), ("pods", "list"), ("pods/log", "get"), ("services", "create")]:
        assert need in granted, need
    binding = objects["RoleBinding/factory-runs"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "factory", "namespace": "factory"}]
    secrets = [o for o in objects.values() if o["kind"] == "Secret"]
    assert {s["metadata"]["name"] for s in secrets} == {"factory-secrets", "dagster-postgresql-secret"}
    assert all(v == "" for s in secrets for v in s["stringData"].values())
    assert set(objects["Secret/factory-secrets"]["stringData"]) == {
        "FACTORY_S3_ACCESS_KEY", "FACTORY_S3_SECRET_KEY", "FACTORY_DAGSTER_PG_PASSWORD"}


def test_an_endpoint_that_is_not_the_service_is_refused(profile):
    wrong = profile.derive(**{"inference.kind": "openai", "inference.endpoint": "http://llm.factory.svc:8000/v1"})
    with pytest.raises(DeployError, match=r"inference.endpoint 'http://llm.factory.svc:8000/v1': .*http://vllm.factory.svc:8000/v1"):
        render_files(wrong)


def test_kueue_objects_only_with_a_queue(profile):
    assert not any(o["apiVersion"].startswith("kueue.") for g in cluster_manifests(profile).values() for o in g)
    queued = profile.derive(**{"kubernetes.kueue_queue": "factory-queue"})
    files = render_files(queued)
    kueue = list(yaml.safe_load_all(files["03-kueue.yaml"]))
    kinds = [o["kind"] for o in kueue]
    assert kinds.count("ResourceFlavor") == 2 and "ClusterQueue" in kinds
    local = next(o for o in kueue if o["kind"] == "LocalQueue")
    assert local["metadata"] == {"name": "factory-queue", "namespace": "factory",
                                 "labels": {"app.kubernetes.io/part-of": "model-factory"}}
    with pytest.raises(DeployError, match=r"LocalQueue/q .*'clusterQueu' was unexpected"):
        validate([{"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                   "metadata": {"name": "q", "namespace": "factory"}, "spec": {"clusterQueu": "x"}}], "1.33")


def test_a_profile_without_kubernetes_fails_by_name_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "k8s"
    assert main(["deploy", "render", "--deploy", "embedded", "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert "profile 'embedded' has no `kubernetes` section" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_invalid_quantity_fails_naming_the_object_and_keeps_the_old_output(profile, tmp_path):
    out = tmp_path / "k8s"
    write_render(profile, out)
    before = {p: p.read_text() for p in out.rglob("*") if p.is_file()}
    bad = profile.derive(**{"kubernetes.serving.cpu": "8 cores"})
    with pytest.raises(DeployError, match=rf"Deployment/{VLLM}: .*requests.cpu = '8 cores' is not a Kubernetes quantity"):
        write_render(bad, out)
    assert {p: p.read_text() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k8s"]  # no temporary directory left behind


def test_an_invalid_kind_row_fails_naming_the_example(profile):
    if not example_objects(profile):
        pytest.skip("resources/k8s_manifests.py (the per-kind examples) is not there")
    bad = profile.derive(**{"kubernetes.kinds.refine.cpu": "8 cores"})
    with pytest.raises(DeployError, match=r"examples/.*refine.*'8 cores' is not a Kubernetes quantity"):
        render_files(bad)


def test_strict_schema_catches_a_misspelt_field_and_an_unknown_version():
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
                  "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
                      "metadata": {"labels": {"a": "b"}},
                      "spec": {"nodeSelecter": {}, "containers": [{"name": "c", "image": "i"}]}}}}
    with pytest.raises(DeployError, match=r"Deployment/x is invalid for Kubernetes 1.33: spec.template.spec: .*nodeSelecter"):
        validate([deployment], "1.33")
    with pytest.raises(DeployError, match=r"Kubernetes version '1.99'"):
        validate([deployment], "1.99")
    with pytest.raises(DeployError, match=r"metadata.name 'Bad_Name'"):
        validate([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "Bad_Name"}}], "1.33")


@pytest.mark.loopback
def test_deploy_check_asks_the_kubernetes_api_for_the_namespaces_pods(profile, tmp_path, monkeypatch):
    """`factory deploy check`'s training probe on launcher kubernetes: no credentials fail naming
    the namespace; a server that answers the pod list (a loopback stand-in for the API server,
    through a kubeconfig as kubectl uses) passes."""
    import http.server
    import json
    import threading

    from factory.deploy.check import probe_kubernetes

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    failed = probe_kubernetes(profile)
    assert not failed.ok and "namespace 'factory'" in failed.detail and "kube-config" in failed.detail

    asked = []

    class PodList(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            asked.append(self.path)
            body = json.dumps({"kind": "PodList", "apiVersion": "v1", "items": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), PodList)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "loopback",
                      "clusters": [{"name": "loopback", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
                      "users": [{"name": "u", "user": {"token": "t"}}],
                      "contexts": [{"name": "loopback", "context": {"cluster": "loopback", "user": "u"}}]}
        (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
        passed = probe_kubernetes(profile)
    finally:
        server.shutdown()
    assert passed.ok, passed.detail
    assert asked and asked[0].startswith("/api/v1/namespaces/factory/pods")


def test_podium_runs_as_one_replica_behind_the_auth_proxy_header(rendered, profile):
    objects = _objects(rendered)
    deployment, service = objects["Deployment/podium"], objects["Service/podium"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["factory", "podium"] and container["command"][-4:] == ["--auth", "header", "--user-header", "X-Forwarded-User"]
    assert {"name": "FACTORY_HOME", "value": profile.kubernetes.home_path} in container["env"]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    off = profile.model_copy(update={"kubernetes": profile.kubernetes.model_copy(update={"podium_user_header": None})})
    assert "06-podium" not in cluster_manifests(off)
