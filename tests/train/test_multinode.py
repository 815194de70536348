"""Multi-node training as one torchrun agent per node meeting at a c10d rendezvous, proven on
loopback: two agents on 127.0.0.1 (`--nnodes 2 --nproc-per-node 1`, gloo) share one FACTORY_HOME
(embedded lake, one checkpoint directory), as nodes share storage on a cluster.

- fast (no processes): `launch_command` of a 2-node plan takes the node rank from the caller, the
  deploy profile or the scheduler's `NODE_RANK` / `JOB_COMPLETION_INDEX`, names the run as the
  rendezvous id, parses under torchrun's own parser, and fails naming `training.rdzv_endpoint`
  when the profile has none or the node rank is outside `parallel.nnodes`;
- slow: the two-agent run's per-step loss, final parameters and loader state are bit-identical to
  the standalone `--nproc-per-node 2` run (rank r reads the same shards wherever c10d puts it);
- slow: a 2-node run SIGKILLed (agents and their workers) after its first checkpoint resumes on one
  node in one process and ends with exactly the standalone run's data accounting: every logical
  shard at the same position, the same sequences and tokens per source, the same step count.

Runs on CPU. Each launch takes ~20-40 s on 2 shared cores; the module ~2-3 min.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from torch.distributed.run import get_args_parser

from configs.experiments import smoke_ddp
from factory.deploy.config import TrainingProfile
from factory.deploy.servers import Server, free_port, stop_pid
from factory.experiments import plan_experiment
from factory.experiments.spec import Plan
from factory.lake import Lake
from factory.mix import accounting
from factory.train.checkpoint import checkpoint_dir, checkpoints, latest_valid, load_checkpoint
from factory.train.config import CheckpointConfig, ParallelConfig
from factory.train.launch import launch_command
from factory.train.trackers import METRICS_TABLE

REPO = Path(__file__).resolve().parents[2]
STEPS, EVERY = 6, 2
TWO_NODES, ONE_NODE, ONE_PROCESS = (ParallelConfig(nnodes=2, nproc_per_node=1), ParallelConfig(nproc_per_node=2),
                                    ParallelConfig())
SCHEDULER_VARIABLES = ("NODE_RANK", "JOB_COMPLETION_INDEX", "SLURM_NODEID")


def two_node_plan() -> Plan:
    experiment = smoke_ddp().derive(parallel=TWO_NODES)
    return Plan(experiment=experiment, model=experiment.model.model_copy(update={"vocab_size": 512}),
                mix_version="mix/default@v1", tokenizer="tokenizer/default@x", seq_len=256, steps=120,
                tokens_per_step=4096, grad_accum=1, parameters=1, config_hash="h")


def torchrun_args(command: list[str]):
    assert command[1:3] == ["-m", "torch.distributed.run"]
    try:
        return get_args_parser().parse_args(command[3:])
    except SystemExit as e:  # argparse prints the reason to stderr and exits 2
        raise AssertionError(f"torchrun refused the command (exit {e.code})") from None


@pytest.fixture
def no_scheduler(monkeypatch) -> pytest.MonkeyPatch:
    for name in SCHEDULER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# -- the command lines ------------------------------------------------------------------------------

def test_node_rank_from_the_profile_and_the_run_as_rendezvous_id(no_scheduler):
    profile = TrainingProfile(launcher="multinode", rdzv_endpoint="10.0.0.5:29400", node_rank=1)
    args = torchrun_args(launch_command(two_node_plan(), home="/h", run="mn", training=profile))
    assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("2", 1, "1")
    assert (args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id, args.max_restarts) == ("c10d", "10.0.0.5:29400",
                                                                                         "mn", 0)
    assert args.rdzv_conf == "is_host=0,join_timeout=600,read_timeout=600"
    assert not args.standalone
    assert (args.module, args.training_script) == (True, "factory.train")
    assert args.training_script_args[-2:] == ["--run-name", "mn"]


def test_node_rank_from_the_scheduler_and_explicit_rank_wins(no_scheduler):
    profile = TrainingProfile(launcher="multinode", rdzv_endpoint="node0:29400", rdzv_id="job-7")
    assert torchrun_args(launch_command(two_node_plan(), home="/h", training=profile)).node_rank == 0
    no_scheduler.setenv("JOB_COMPLETION_INDEX", "1")  # a Kubernetes indexed Job
    args = torchrun_args(launch_command(two_node_plan(), home="/h", training=profile))
    assert (args.node_rank, args.rdzv_id, args.rdzv_conf.split(",")[0]) == (1, "job-7", "is_host=0")
    no_scheduler.setenv("NODE_RANK", "0")  # tried before JOB_COMPLETION_INDEX
    assert torchrun_args(launch_command(two_node_plan(), home="/h", training=profile)).node_rank == 0
    args = torchrun_args(launch_command(two_node_plan(), home="/h", training=profile, node_rank=1, rdzv_timeout_s=30))
    assert (args.node_rank, args.rdzv_conf) == (1, "is_host=0,join_timeout=30,read_timeout=30")
    # without a run name or profile id the rendezvous is named after the run, as the trainer names it
    plain = TrainingProfile(launcher="multinode", rdzv_endpoint="node0:29400")
    plan = two_node_plan()
    expected = f"{plan.experiment.name}-{plan.experiment.identity_hash()[:8]}"
    assert torchrun_args(launch_command(plan, home="/h", training=plain)).rdzv_id == expected


def test_multinode_plan_without_an_endpoint_or_with_a_bad_rank_fails(no_scheduler):
    for profile in (None, TrainingProfile()):
        with pytest.raises(ValueError, match=r"parallel.nnodes=2 nodes but the deploy profile sets no "
                                             r"training.rdzv_endpoint"):
            launch_command(two_node_plan(), home="/h", training=profile)
    profile = TrainingProfile(launcher="multinode", rdzv_endpoint="node0:29400")
    with pytest.raises(ValueError, match=r"node rank 2 is outside experiment 'smoke_ddp'.s parallel.nnodes=2"):
        launch_command(two_node_plan(), home="/h", training=profile, node_rank=2)
    no_scheduler.setenv("SLURM_NODEID", "x")
    with pytest.raises(ValueError, match=r"SLURM_NODEID='x' is not a node index"):
        launch_command(two_node_plan(), home="/h", training=profile)


def test_single_node_commands_are_unchanged():
    plan = two_node_plan()
    one = plan.model_copy(update={"experiment": plan.experiment.derive(parallel=ONE_PROCESS)})
    two = plan.model_copy(update={"experiment": plan.experiment.derive(parallel=ONE_NODE)})
    assert launch_command(one, home="/h", run="r")[1:3] == ["-m", "factory.train"]
    assert launch_command(two, home="/h", run="r")[1:5] == ["-m", "torch.distributed.run", "--standalone",
                                                            "--nproc-per-node=2"]


# -- real runs on loopback -------------------------------------------------------------------------

def experiment(parallel: ParallelConfig):
    # 16 sequences per step, as these runs were timed with: the kill must land mid-run
    return smoke_ddp().derive(steps=STEPS, checkpoint=CheckpointConfig(every=EVERY, keep_last=5), parallel=parallel,
                              global_batch=16, micro_batch=8)


def environment(lake: Lake) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FACTORY_FAULTS", "DAGSTER_PIPES_CONTEXT", *SCHEDULER_VARIABLES)}
    # one intra-op thread everywhere: torchrun sets it only for nproc-per-node > 1, and the
    # bit-identical comparison must not depend on thread counts (see training_env in conftest)
    env.update(FACTORY_HOME=str(lake.home), HF_HUB_OFFLINE="1", FACTORY_TRACKER_BACKENDS="iceberg",
               OMP_NUM_THREADS="1")
    return env


def start(lake: Lake, run: str, parallel: ParallelConfig, logs: Path, port: int | None = None) -> list[Server]:
    """Start `run` on 127.0.0.1: one agent per node (node ranks 0..nnodes-1), each in its own session."""
    plan = plan_experiment(lake, experiment(parallel))
    profile = TrainingProfile(launcher="multinode", rdzv_endpoint=f"127.0.0.1:{port}") if port else None
    return [Server(f"{run}-node{rank}", launch_command(plan, home=str(lake.home), run=run, training=profile,
                                                       node_rank=rank, rdzv_timeout_s=120),
                   logs / f"{run}-node{rank}.log", env=environment(lake), cwd=REPO).start()
            for rank in range(parallel.nnodes)]


def finish(nodes: list[Server], timeout: float = 300) -> list[str]:
    """Wait for every node to exit 0; their logs."""
    deadline = time.monotonic() + timeout
    for node in nodes:
        try:
            code = node.process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
        assert code == 0, f"{node.name} exited {code}; log {node.log_path}:\n{node.log_tail(4000)}"
    return [node.log_tail(100_000) for node in nodes]


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc (torchrun starts its workers in their own
    sessions, so killing an agent's process group leaves them running)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


@contextlib.contextmanager
def stopping(nodes_box: list[Server]):
    """Stop every agent and every worker below it, however the test ends."""
    workers: set[int] = set()
    try:
        yield workers
    finally:
        for node in nodes_box:
            workers.update(descendants(node.pid))
            node.stop(grace=5)
        for pid in workers:
            stop_pid(pid, grace=2)


def rows(lake: Lake, table: str, run: str) -> list[dict]:
    return sorted((r for r in lake.table(table).scan().to_arrow().to_pylist() if r["run"] == run),
                  key=lambda r: (r["step"], r.get("name", "")))


def losses(lake: Lake, run: str) -> list[tuple[int, float]]:
    return [(r["step"], r["value"]) for r in rows(lake, METRICS_TABLE, run) if r["name"] == "loss"]


def final(lake: Lake, run: str) -> dict:
    ref = latest_valid(checkpoint_dir(lake.home, run), print)
    assert ref is not None and ref.step == STEPS, f"{run}: latest checkpoint {ref}"
    return load_checkpoint(ref)


@pytest.fixture(scope="module")
def standalone(shared_lake, tmp_path_factory) -> dict:
    """The reference: `smoke_ddp` for 6 steps as one torchrun --standalone with two ranks."""
    nodes: list[Server] = []
    with stopping(nodes):
        nodes += start(shared_lake, "mn_standalone", ONE_NODE, tmp_path_factory.mktemp("logs"))
        finish(nodes)
    return final(shared_lake, "mn_standalone")


@pytest.mark.slow
def test_two_agents_on_loopback_match_the_standalone_run_bit_for_bit(shared_lake, standalone, tmp_path):
    nodes: list[Server] = []
    with stopping(nodes):
        nodes += start(shared_lake, "mn_two", TWO_NODES, tmp_path, port=free_port())
        logs = finish(nodes)
    # (two worlds of 1 would not get here: the trainer refuses a WORLD_SIZE the plan did not ask for)
    assert f"mn_two: {STEPS} steps, final loss" in "".join(logs)
    curve = losses(shared_lake, "mn_two")
    assert [s for s, _ in curve] == list(range(1, STEPS + 1))
    assert curve == losses(shared_lake, "mn_standalone")  # bit for bit: floats compared with ==
    assert [r["step"] for r in checkpoints(shared_lake, "mn_two")] == [2, 4, 6]
    two = final(shared_lake, "mn_two")
    differ = [k for k, v in standalone["model"].items() if not v.equal(two["model"][k])]
    assert differ == [], f"parameters differ from the standalone run: {differ}"
    assert two["loader"]["shards"] == standalone["loader"]["shards"]


@pytest.mark.slow
def test_two_node_run_killed_resumes_on_one_node_with_exact_data_accounting(shared_lake, standalone, tmp_path):
    run = "mn_resume"
    directory = checkpoint_dir(shared_lake.home, run)
    nodes: list[Server] = []
    with stopping(nodes) as workers:
        nodes += start(shared_lake, run, TWO_NODES, tmp_path, port=free_port())
        deadline = time.monotonic() + 240
        while not (directory.exists() and latest_valid(directory, lambda _: None)):
            assert all(n.alive() for n in nodes), "a node exited before the first checkpoint:\n" + nodes[0].log_tail()
            assert time.monotonic() < deadline, "no checkpoint after 240 s:\n" + nodes[0].log_tail()
            time.sleep(0.1)
        for node in nodes:  # SIGKILL, as a lost machine: the agents get no chance to stop their workers
            workers.update(descendants(node.pid))
            os.killpg(node.pid, signal.SIGKILL)
        assert len(workers) >= 2, f"expected a worker below each agent, found {sorted(workers)}"
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        for node in nodes:
            node.process.wait(timeout=30)
    killed_at = latest_valid(directory, print).step
    assert EVERY <= killed_at < STEPS, f"the run was not interrupted (latest checkpoint at step {killed_at})"

    # the same run name on one node, one process: the loader regroups 8 shards from 2 ranks onto 1
    plan = plan_experiment(shared_lake, experiment(ONE_PROCESS))
    resumed = subprocess.run(launch_command(plan, home=str(shared_lake.home), run=run), cwd=REPO,
                             env=environment(shared_lake), capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"(step {killed_at})" in resumed.stderr + resumed.stdout
    assert f"{run}: {STEPS} steps, final loss" in resumed.stderr + resumed.stdout

    state, reference = final(shared_lake, run)["loader"], standalone["loader"]
    assert (state["step"], state["tokens"]) == (reference["step"], reference["tokens"])
    assert state["step"] == STEPS
    # every logical shard stopped exactly where the uninterrupted run's did (cursors, RNG, counts):
    # nothing read twice, nothing skipped
    assert state["shards"] == reference["shards"]
    assert accounting(state) == accounting(reference)
    sequences = sum(c["sequences"] for per in accounting(state)["versions"].values() for c in per.values())
    assert sequences == STEPS * 16
    assert [r["step"] for r in checkpoints(shared_lake, run)][-1] == STEPS
