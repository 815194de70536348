"""Training pods on Kubernetes: what `factory.deploy.kube.training` builds and how
`resources.k8s_training.run_training_pods` drives it.

Covers: a worker pod's command, run by a real /bin/sh with the JOB_COMPLETION_INDEX Kubernetes
sets, is torchrun with node rank index + 1 and the rendezvous at rank 0's DNS name (parsed with
torch's own argument parser); rank 0's pod sorts first among the agents as c10d numbers them
(torch's `_NodeDesc` order), so the pod Pipes reads holds global rank 0; single-node runs need no
workers or Service; object names stay DNS labels for long run names; and the asset's flow, with
recording fakes for the CoreV1/BatchV1 APIs and the Pipes client: Service and workers' Job
created before rank 0, deleted after it, also when rank 0 fails or a delete fails.

CPU only, no cluster, no network.
"""

import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
from kubernetes.client.rest import ApiException
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc
from torch.distributed.run import get_args_parser

from factory.deploy import load_profile
from factory.deploy.kube.training import pods_name, training_pods, worker_command
from factory.train.config import ParallelConfig
from resources.k8s_manifests import example_plan
from resources.k8s_training import run_training_pods

PROFILE = load_profile("kubernetes")
RUN, RUN_ID = "smoke_lr-1234abcd", "5f0e2d1c-aaaa-4bbb-8ccc-000000000001"


def pods(nnodes=3, nproc=4, **kw):
    plan = example_plan(PROFILE, ParallelConfig(nnodes=nnodes, nproc_per_node=nproc))
    return training_pods(plan, PROFILE, run=RUN, run_id=RUN_ID, home="/var/factory/home", reporter="r:m", **kw)


def test_a_worker_computes_its_node_rank_from_the_completion_index(tmp_path):
    p = pods(nnodes=3)
    command = p.workers["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["/bin/sh", "-c"] and command[3] == sys.executable
    fake_python = tmp_path / "python"  # prints the argv the pod's python would get
    fake_python.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake_python.chmod(0o755)
    for index in (0, 1):  # nnodes - 1 = 2 completions
        out = subprocess.run([*command[:3], str(fake_python), *command[4:]], capture_output=True, text=True,
                             env={**os.environ, "JOB_COMPLETION_INDEX": str(index)}, check=True, timeout=30)
        argv = json.loads(out.stdout)
        assert argv[:2] == ["-m", "torch.distributed.run"]
        args = get_args_parser().parse_args(argv[2:])
        assert args.node_rank == index + 1 and args.nnodes == "3" and args.nproc_per_node == "4"
        assert args.rdzv_endpoint == p.rdzv_endpoint and "is_host=0" in args.rdzv_conf
        assert args.module and args.training_script == "factory.train"
    rank0 = get_args_parser().parse_args(p.command[3:])
    assert rank0.node_rank == 0 and "is_host=1" in rank0.rdzv_conf and rank0.rdzv_endpoint == p.rdzv_endpoint


def test_rank_0s_pod_sorts_first_where_c10d_numbers_the_agents():
    p = pods(nnodes=101)
    domain = f"{p.name}.{p.namespace}.svc.cluster.local"
    rank0 = _NodeDesc(f"{p.pod_spec['hostname']}.{domain}", 99999, 0)
    # an Indexed Job's pod i has hostname <job name>-<i>
    workers = [_NodeDesc(f"{p.workers['metadata']['name']}-{i}.{domain}", 1, 0) for i in range(100)]
    assert sorted([*workers, rank0])[0] == rank0
    assert p.rdzv_endpoint == f"{p.pod_spec['hostname']}.{p.name}.{p.namespace}.svc:29400"


def test_a_single_node_run_is_one_pod():
    p = pods(nnodes=1, nproc=8)
    assert p.workers is None and p.service is None and "hostname" not in p.pod_spec
    assert "--standalone" in p.command and "--nproc-per-node=8" in p.command
    assert p.pod_spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    one = pods(nnodes=1, nproc=1)
    assert one.command[1:3] == ["-m", "factory.train"]  # one process: no torchrun at all
    assert one.pod_spec["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "1"


def test_object_names_stay_dns_labels():
    name = pods_name("A_Very_Long_Experiment_Name_" * 4 + "-deadbeef", RUN_ID)
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(f"{name}-w-99") <= 63
    assert pods_name(RUN, RUN_ID) == "smoke-lr-1234abcd-5f0e2d1c"


def test_worker_command_drops_the_baked_rank():
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--node-rank=1", "-m", "x"]
    assert "--node-rank=1" not in worker_command(command) and worker_command(command)[-3:] == ["--nnodes=2", "-m", "x"]


# --- the asset's flow ---------------------------------------------------------------------------


class Recorder:
    def __init__(self, calls, fail_delete=False):
        self.calls, self.fail_delete = calls, fail_delete

    def create_namespaced_service(self, namespace, body):
        self.calls.append(("create service", body["metadata"]["name"]))

    def create_namespaced_job(self, namespace, body):
        self.calls.append(("create job", body["metadata"]["name"]))

    def delete_namespaced_job(self, name, namespace, propagation_policy=None):
        self.calls.append(("delete job", name, propagation_policy))
        if self.fail_delete:
            raise ApiException(status=503, reason="Service Unavailable")

    def delete_namespaced_service(self, name, namespace):
        self.calls.append(("delete service", name))


class FakePipes:
    def __init__(self, calls, error=None):
        self.calls, self.error = calls, error

    def run(self, **kwargs):
        self.calls.append(("pipes run", kwargs["base_pod_spec"]["hostname"], kwargs["namespace"]))
        self.kwargs = kwargs
        if self.error:
            raise self.error
        return "completed"


def context():
    messages = []
    return SimpleNamespace(run_id=RUN_ID, log=SimpleNamespace(info=messages.append, warning=messages.append),
                           messages=messages)


def flow(calls, *, error=None, fail_delete=False):
    api = Recorder(calls, fail_delete)
    pipes = FakePipes(calls, error)
    plan = example_plan(PROFILE, ParallelConfig(nnodes=2, nproc_per_node=8))
    ctx = context()
    out = run_training_pods(ctx, plan, PROFILE, run=RUN, home="/h", reporter="r:m", env={"FACTORY_HOME": "/h"},
                            pipes=pipes, core_api=api, batch_api=api)
    return out, pipes, ctx


def test_the_workers_and_service_exist_exactly_while_rank_0_runs():
    calls = []
    (completed, p), pipes, ctx = flow(calls)
    name = p.name
    assert completed == "completed"
    assert calls == [("create service", name), ("create job", f"{name}-w"), ("pipes run", f"{name}-0", "factory"),
                     ("delete job", f"{name}-w", "Background"), ("delete service", name)]
    rank0 = pipes.kwargs["base_pod_spec"]["containers"][0]  # in the spec: Pipes refuses them beside a sidecar
    assert rank0["command"] == p.command and rank0["image"] == PROFILE.kubernetes.image
    assert "image" not in pipes.kwargs and "command" not in pipes.kwargs
    assert pipes.kwargs["ignore_containers"] == {"metrics"}  # the metrics sidecar never fails rank 0
    assert pipes.kwargs["base_pod_meta"]["labels"]["factory.dev/training-role"] == "rank0"
    assert f"meeting at {p.rdzv_endpoint}" in ctx.messages[0]


def test_a_failed_rank_0_still_removes_the_workers():
    calls = []
    with pytest.raises(RuntimeError, match="rank 0 died"):
        flow(calls, error=RuntimeError("rank 0 died"))
    assert [c[0] for c in calls] == ["create service", "create job", "pipes run", "delete job", "delete service"]


def test_a_failed_delete_never_hides_the_runs_own_error():
    calls = []
    with pytest.raises(RuntimeError, match="rank 0 died"):
        flow(calls, error=RuntimeError("rank 0 died"), fail_delete=True)
    assert [c[0] for c in calls][-2:] == ["delete job", "delete service"]  # the Service still goes
