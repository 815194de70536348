"""The command that starts a planned training run: `python -m factory.train` for one process,
`torchrun --standalone` (as `python -m torch.distributed.run`) for several on one node.

The experiment travels as validated JSON, so the processes train exactly what was planned and
the launcher's environment (configs directory, git checkout) does not have to match.
"""

from __future__ import annotations

import sys

from factory.experiments.spec import Plan


def launch_command(plan: Plan, *, home: str, run_id: str = "", run: str | None = None,
                   reporter: str | None = None) -> list[str]:
    parallel = plan.experiment.parallel
    train = ["-m", "factory.train", "--experiment-json", plan.experiment.model_dump_json(), "--home", home,
             "--run-id", run_id] + (["--run-name", run] if run else []) + (["--reporter", reporter] if reporter else [])
    if parallel.world_size == 1:
        return [sys.executable, *train]
    if parallel.nnodes > 1:
        raise ValueError("multi-node runs are launched by the cluster (one torchrun per node with --rdzv-endpoint); "
                         "launch_command starts single-node runs")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={parallel.nproc_per_node}", *train]
