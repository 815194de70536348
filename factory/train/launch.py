"""The command that starts a planned training run on this node: `python -m factory.train` for one
process, `torchrun --standalone` for several on one node, and for `parallel.nnodes > 1` one
torchrun agent per node meeting at a c10d rendezvous (all as `python -m torch.distributed.run`,
so the venv's torch is the one that runs).

The experiment travels as validated JSON, so the processes train exactly what was planned and
the launcher's environment (configs directory, git checkout) does not have to match.

Multi-node. Every node runs the same command except for `--node-rank`; the deploy profile's
`training` section supplies the rendezvous (`rdzv_endpoint`, host:port on node 0; `rdzv_id`,
default the run name, so two runs never join each other's rendezvous) and the node rank comes from
the caller, the profile, or the scheduler (`NODE_RANK`, `JOB_COMPLETION_INDEX`, `SLURM_NODEID`).

Ranks. c10d ignores `--node-rank` when it numbers the nodes: it sorts the agents by (hostname,
agent pid) (torch 2.13 `DynamicRendezvousHandler`), so node rank 1 may become group rank 0. That
does not change what is trained: the data a process reads follows its global RANK (the loader
gives rank r shards r, r+W, ...), never the machine it landed on, so rank r reads the same shards
as rank r of a standalone run and the loss curve is bit-identical (tests/train/test_multinode.py).
The node rank is used for one thing: node 0 hosts the rendezvous store (`is_host`), so a service
name or load-balancer address in `rdzv_endpoint` need not match node 0's hostname.

Failures. `--max-restarts 0`: a dead rank ends the whole run, and the next launch resumes from
the last checkpoint (on any world size that divides the loader's shards) instead of torchrun
restarting workers on a possibly smaller world behind the factory's back. The rendezvous waits
`rdzv_timeout_s` for every node to arrive, then fails instead of hanging a scheduler slot.

Preemption. A SIGTERM to an agent is forwarded to its workers, which checkpoint the step in progress
and exit (`factory.train.preempt`); `--shutdown-timeout` is the profile's `preemption_grace_s`, so
the agent waits that long before it SIGKILLs them. The agent itself then exits 1, not the workers'
75: the launcher learns of the preemption from the `preempted` incident instead.
"""

from __future__ import annotations

import math
import sys

from factory import settings
from factory.deploy.config import TrainingProfile
from factory.experiments.spec import Plan
from factory.experiments.sweep import run_name

RDZV_TIMEOUT_S = 600  # torch's own join timeout; nodes of a cluster job may start minutes apart


def launch_command(plan: Plan, *, home: str, run_id: str = "", run: str | None = None, reporter: str | None = None,
                   training: TrainingProfile | None = None, node_rank: int | None = None,
                   rdzv_timeout_s: int = RDZV_TIMEOUT_S) -> list[str]:
    """The command that starts this node's part of `plan`'s run (`training` and `node_rank`
    matter only for multi-node plans; an explicit `node_rank` beats the profile's and the
    scheduler's)."""
    parallel = plan.experiment.parallel
    train = ["-m", "factory.train", "--experiment-json", plan.experiment.model_dump_json(), "--home", home,
             "--run-id", run_id] + (["--run-name", run] if run else [])
    if reporter:  # launched through Dagster Pipes, which forwards a run's termination as SIGINT
        train += ["--sigint-is-preemption", "--reporter", reporter]
    if parallel.world_size == 1:
        return [sys.executable, *train]
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    # a SIGTERM to the agent is forwarded to the workers; give them the grace to checkpoint before
    # the agent's SIGKILL (torch's default waits 30 s)
    grace = f"--shutdown-timeout={math.ceil((training or TrainingProfile()).preemption_grace_s)}"
    if parallel.nnodes == 1:
        return [*torchrun, "--standalone", f"--nproc-per-node={parallel.nproc_per_node}", grace, *train]
    return [*torchrun, *rendezvous_args(plan, training, node_rank, run=run, timeout_s=rdzv_timeout_s), grace, *train]


def rendezvous_args(plan: Plan, training: TrainingProfile | None, node_rank: int | None, *, run: str | None,
                    timeout_s: int = RDZV_TIMEOUT_S) -> list[str]:
    """torchrun's arguments for this node of a multi-node plan."""
    parallel, name = plan.experiment.parallel, plan.experiment.name
    endpoint = training.rdzv_endpoint if training else None
    if not endpoint:
        raise ValueError(f"experiment {name!r} runs on parallel.nnodes={parallel.nnodes} nodes but the deploy profile "
                         "sets no training.rdzv_endpoint (host:port of the c10d rendezvous on node 0)")
    rank = resolve_node_rank(node_rank, training)
    if not 0 <= rank < parallel.nnodes:
        raise ValueError(f"node rank {rank} is outside experiment {name!r}'s parallel.nnodes={parallel.nnodes}")
    if timeout_s <= 0:
        raise ValueError(f"rdzv_timeout_s must be positive, got {timeout_s}")
    rdzv_id = (training.rdzv_id if training else None) or run or run_name(plan.experiment)
    # is_host: node 0 serves the rendezvous store, whatever name the endpoint gives it; read_timeout
    # lets a node that arrives before node 0 keep trying to reach the store for the whole timeout
    conf = f"is_host={int(rank == 0)},join_timeout={timeout_s},read_timeout={timeout_s}"
    return [f"--nnodes={parallel.nnodes}", f"--node-rank={rank}", f"--nproc-per-node={parallel.nproc_per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}", f"--rdzv-conf={conf}",
            "--max-restarts=0"]


def resolve_node_rank(node_rank: int | None, training: TrainingProfile | None) -> int:
    """This node's rank: the caller's, else the profile's, else the scheduler's, else 0."""
    for rank in (node_rank, training.node_rank if training else None, settings.scheduler_node_rank()):
        if rank is not None:
            return rank
    return 0
