"""Factory-health metrics in the rendered Kubernetes objects (`factory.deploy.kube.monitoring`).

Covers: every factory pod the placement builds (run and step Jobs of every asset kind, training
rank 0 and the workers' Job) has the exporter as a native sidecar (an init container with
`restartPolicy: Always`, port `metrics`), FACTORY_METRICS and PROMETHEUS_MULTIPROC_DIR on the
shared emptyDir, the scrape annotations and the PodMonitor's label, and still validates strictly at
Kubernetes 1.33; the sidecar's command, run here as written (only the address, port and directory
swapped for loopback ones), serves what a process with the main container's environment wrote, and
stops with 0 on SIGTERM; the profile's `metrics: False` leaves none of it (no sidecar, env,
annotations, or 05-monitoring group); the PrometheusRule's groups are deploy/prometheus/rules.yml's
and the dashboard ConfigMap's JSON is deploy/grafana/dashboards/'s, also as `factory deploy render`
writes them; the run-queue exporter mounts the chart's instance ConfigMap and Postgres Secret
where the chart's pods do, and its command serves the queue of a real (sqlite) instance; the
PodMonitors select pods that carry their port; a misspelt PodMonitor field is refused.

CPU only, offline: servers bind 127.0.0.1 and are stopped by PID; no cluster.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from factory.deploy import DeployError, load_profile
from factory.deploy.config import ASSET_KINDS
from factory.deploy.kube import monitoring
from factory.deploy.kube.cluster import cluster_manifests
from factory.deploy.kube.helm import DAGSTER_HOME, PG_SECRET, helm_values
from factory.deploy.kube.render import render_files
from factory.deploy.kube.validate import validate
from resources.k8s_manifests import example_manifests

ROOT = Path(__file__).resolve().parents[2]
FACTORY = Path(sys.executable).parent / "factory"  # the console script, as on the image's PATH


@pytest.fixture(scope="module")
def profile():
    return load_profile("kubernetes")


@pytest.fixture(scope="module")
def manifests(profile):
    return example_manifests(profile)


@pytest.fixture(scope="module")
def group(profile):
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in cluster_manifests(profile)["05-monitoring"]}


def pod_template(obj: dict) -> tuple[dict, dict]:
    """(metadata, spec) of the pod an object creates."""
    if obj["kind"] == "Pod":
        return obj["metadata"], obj["spec"]
    return obj["spec"]["template"]["metadata"], obj["spec"]["template"]["spec"]


def factory_pods(manifests: dict) -> dict[str, tuple[dict, dict]]:
    return {name: pod_template(o) for name, o in manifests.items() if o["kind"] in ("Job", "Pod")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loopback(command: list[str], port: int, directory: Path, **more: str) -> list[str]:
    """`command` with --host/--port/--dir (and `more`) swapped for local values, nothing else."""
    swap = {"--host": "127.0.0.1", "--port": str(port), "--dir": str(directory), **more}
    return [swap.get(command[i - 1], a) if i else a for i, a in enumerate(command)]


def serve(command: list[str], env: dict | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})
    line = proc.stdout.readline()
    if "metrics on http://127.0.0.1" not in line:
        proc.kill()
        raise AssertionError(f"{command[:4]} did not start: {line}{proc.stdout.read()}")
    return proc


def test_every_factory_pod_runs_the_exporter_as_a_native_sidecar(profile, manifests):
    pods = factory_pods(manifests)
    assert len(pods) == 2 * len(ASSET_KINDS) + 2  # a run and a step Job per kind, rank 0, the workers' Job
    validate(list(manifests.values()), "1.33")
    for name, (meta, spec) in pods.items():
        [sidecar] = spec["initContainers"]
        assert sidecar["restartPolicy"] == "Always", name  # native: the Job completes when the main container exits
        assert sidecar["command"] == monitoring.exporter_command() and sidecar["image"] == profile.kubernetes.image
        assert sidecar["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
        assert sidecar["resources"]["requests"] == {"cpu": "50m", "memory": "64Mi"}
        main = spec["containers"][0]
        env = {e["name"]: e.get("value") for e in main["env"]}
        assert env["FACTORY_METRICS"] == "1" and env["PROMETHEUS_MULTIPROC_DIR"] == "/metrics/prom", name
        volume = {"name": "factory-metrics", "emptyDir": {}}
        assert volume in spec["volumes"], name
        for container in (main, sidecar):  # one directory: written by the factory, read by the exporter
            assert {"name": "factory-metrics", "mountPath": "/metrics"} in container["volumeMounts"], name
        assert env["PROMETHEUS_MULTIPROC_DIR"] == sidecar["command"][sidecar["command"].index("--dir") + 1]
        assert meta["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/port": "9464",
                                       "prometheus.io/path": "/metrics"}, name
        assert meta["labels"]["app.kubernetes.io/part-of"] == "model-factory", name
        assert meta["labels"].get("app.kubernetes.io/name", "dagster") == "dagster"  # dagster-k8s's own stay


@pytest.mark.loopback
def test_the_sidecars_command_serves_what_the_main_container_writes(manifests, tmp_path):
    _, spec = pod_template(manifests["run-job-eval.yaml"])
    command = spec["initContainers"][0]["command"]
    assert command[0] == "factory" and FACTORY.exists()
    port, prom = free_port(), tmp_path / "prom"
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"] if e["name"] in ("FACTORY_METRICS",
                                                                                          "PROMETHEUS_MULTIPROC_DIR")}
    writer = "from factory.health import metrics\nmetrics.sandbox_execution('passed', 0.0, 0.01)\n"
    subprocess.run([sys.executable, "-c", writer], env={**os.environ, **env, "PROMETHEUS_MULTIPROC_DIR": str(prom)},
                   check=True, timeout=120)
    proc = serve([str(FACTORY), *loopback(command, port, prom)[1:]])
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'factory_sandbox_executions_total{outcome="passed"} 1.0' in body
    finally:
        proc.send_signal(signal.SIGTERM)  # what the kubelet sends a sidecar once the main container ended
        assert proc.wait(timeout=30) == 0


def test_metrics_off_leaves_no_sidecar_env_annotation_or_monitoring_group(profile):
    off = profile.derive(**{"kubernetes.metrics": False})
    manifests = example_manifests(off)
    validate(list(manifests.values()), "1.33")
    for name, (meta, spec) in factory_pods(manifests).items():
        assert "initContainers" not in spec and "annotations" not in meta, name
        names = {e["name"] for c in spec["containers"] for e in c["env"]}
        assert not names & {"FACTORY_METRICS", "PROMETHEUS_MULTIPROC_DIR"}, name
        assert all("emptyDir" not in v for v in spec.get("volumes", [])), name
    assert "05-monitoring" not in cluster_manifests(off)
    assert "05-monitoring.yaml" not in render_files(off)


def test_the_prometheus_rule_is_rules_yml_and_the_dashboard_is_the_checked_in_json(profile, group):
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.yml").read_text())
    assert group["PrometheusRule/factory-health"]["spec"]["groups"] == rules["groups"]
    dashboards = group["ConfigMap/factory-grafana-dashboards"]
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = {p.name: json.loads(p.read_text()) for p in (ROOT / "deploy" / "grafana" / "dashboards").glob("*.json")}
    assert files and {k: json.loads(v) for k, v in dashboards["data"].items()} == files
    # and as the render writes them (the YAML dump keeps the rule expressions and the JSON intact)
    written = {f"{d['kind']}/{d['metadata']['name']}": d
               for d in yaml.safe_load_all(render_files(profile)["05-monitoring.yaml"])}
    assert written["PrometheusRule/factory-health"]["spec"]["groups"] == rules["groups"]
    assert {k: json.loads(v) for k, v in written["ConfigMap/factory-grafana-dashboards"]["data"].items()} == files


def test_the_run_queue_exporter_reads_the_charts_instance(profile, group):
    deployment = group[f"Deployment/{monitoring.QUEUE_EXPORTER}"]
    values = helm_values(profile)
    launcher = values["runLauncher"]["config"]["customRunLauncher"]["config"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    spec = deployment["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert spec["nodeSelector"] == values["dagsterDaemon"]["nodeSelector"]  # beside the daemon
    assert {"name": "dagster-instance", "configMap": {"name": launcher["instance_config_map"]}} in spec["volumes"]
    assert {"name": "dagster-instance", "mountPath": f"{DAGSTER_HOME}/dagster.yaml",
            "subPath": "dagster.yaml"} in container["volumeMounts"]
    env = {e["name"]: e for e in container["env"]}
    assert env["DAGSTER_HOME"]["value"] == values["global"]["dagsterHome"] == DAGSTER_HOME
    assert env["DAGSTER_PG_PASSWORD"]["valueFrom"] == {"secretKeyRef": {"name": PG_SECRET, "key": "postgresql-password"}}
    command = container["command"]
    assert command[command.index("--dagster-home") + 1] == DAGSTER_HOME
    assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9464"


@pytest.mark.loopback
def test_the_run_queue_exporters_command_serves_a_real_instance(group, tmp_path):
    container = group[f"Deployment/{monitoring.QUEUE_EXPORTER}"]["spec"]["template"]["spec"]["containers"][0]
    home = tmp_path / "dagster_home"  # an empty dagster.yaml: Dagster's sqlite storage in this directory
    home.mkdir()
    (home / "dagster.yaml").write_text("{}\n")
    port, command = free_port(), container["command"]
    assert command[:3] == ["python", "-m", "resources.run_queue_metrics"]
    proc = serve([sys.executable, *loopback(command, port, tmp_path / "prom", **{"--dagster-home": str(home)})[1:]],
                 env={"DAGSTER_HOME": str(home)})
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
        assert "factory_dagster_queue_length 0.0" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_the_pod_monitors_select_pods_that_carry_their_port(manifests, group, profile):
    factory = group["PodMonitor/factory-health"]["spec"]
    assert factory["selector"] == {"matchLabels": {"app.kubernetes.io/part-of": "model-factory"}}
    [endpoint] = factory["podMetricsEndpoints"]
    exporter = pod_template(group[f"Deployment/{monitoring.QUEUE_EXPORTER}"])
    for name, (meta, spec) in {**factory_pods(manifests), "queue exporter": exporter}.items():
        assert factory["selector"]["matchLabels"].items() <= meta["labels"].items(), name
        ports = [p["name"] for c in spec.get("initContainers", []) + spec["containers"] for p in c.get("ports", [])]
        assert ports.count(endpoint["port"]) == 1, name
    vllm = group["PodMonitor/factory-vllm"]["spec"]
    deployment = next(o for o in cluster_manifests(profile)["04-serving"] if o["kind"] == "Deployment")
    assert vllm["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert vllm["podMetricsEndpoints"][0]["port"] in [p["name"] for p in
                                                      deployment["spec"]["template"]["spec"]["containers"][0]["ports"]]
    labelled = load_profile("kubernetes").derive(**{"kubernetes.monitoring_labels": {"release": "kube-prometheus"}})
    for obj in cluster_manifests(labelled)["05-monitoring"]:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):  # the Operator's ruleSelector/podMonitorSelector
            assert obj["metadata"]["labels"]["release"] == "kube-prometheus"


def test_a_misspelt_pod_monitor_or_rule_is_refused(group):
    monitor = json.loads(json.dumps(group["PodMonitor/factory-health"]))
    monitor["spec"]["podMetricsEndpoints"][0]["intervall"] = "15s"
    with pytest.raises(DeployError, match=r"PodMonitor/factory-health is invalid.*'intervall' was unexpected"):
        validate([monitor], "1.33")
    rule = json.loads(json.dumps(group["PrometheusRule/factory-health"]))
    rule["spec"]["groups"][0]["rules"][0]["for"] = "2 minutes"
    with pytest.raises(DeployError, match=r"PrometheusRule/factory-health is invalid.*2 minutes"):
        validate([rule], "1.33")
