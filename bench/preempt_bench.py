"""Preemption cost: how long from SIGTERM to a durable checkpoint, against the step time, and what
the per-step agreement between ranks costs (`factory.train.preempt`).

For each model a real `python -m factory.train` (the command the `training_run` asset launches)
trains with a checkpoint every 2 steps; after its first checkpoint is durable the bench sends
SIGTERM `--signals` times, at a random point of a step each time (one process per signal), and
reads the trainer's own measurement back from the `preempted` incident: `seconds_to_checkpoint`,
from the signal to the checkpoint's files fsynced and its `train.checkpoints` row committed. That
latency is the rest of the step in progress (0 to 1 step) plus one save, so the baseline it is
measured against is the step time of the same run (`tokens_per_step / tokens_per_s` of its
`train.metrics` rows, median), and the printed ratio is latency / step (median and worst).
`save s` is the save alone (from the ranks' agreement to stop to durable) and save/step its ratio:
the worst case a grace must cover is one step plus one save. Also printed: the grace
(`TrainingProfile.preemption_grace_s`, 60 s by default) it must fit in.

Models: `smoke` (configs/experiments) and `smoke x10`, the same recipe at d_model 384 and 6 layers
(about 11x the parameters), and the smoke model on 2 gloo ranks under torchrun (the signal to
rank 1 only, so the stop travels through the agreement).

Agreement: `Preemption.agreed()` (one all-reduce MAX of an int32 flag) timed over `--calls` calls
on 2 gloo ranks on loopback, as a share of the 2-rank smoke step (the ratio against its baseline).

Needs a lake with tokenizer and mix `default` (`--home`, e.g. a `make demo` home); without one it
builds a small one in a temp directory with the tests' builder (tests/conftest.py: standard-library
text, 512-token BPE), about 30 s. On CPU with `--threads 1` (default) runs about 3-5 minutes.

    .venv/bin/python bench/preempt_bench.py [--home DIR] [--signals 3] [--calls 2000] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from configs.experiments import smoke  # noqa: E402
from factory.deploy.session import children, environ  # noqa: E402
from factory.experiments import plan_experiment  # noqa: E402
from factory.lake import Lake  # noqa: E402
from factory.train.checkpoint import checkpoint_dir, validate  # noqa: E402
from factory.train.config import CheckpointConfig, ParallelConfig  # noqa: E402
from factory.train.incidents import INCIDENTS_TABLE  # noqa: E402
from factory.train.launch import launch_command  # noqa: E402
from factory.train.trackers import METRICS_TABLE  # noqa: E402

EVERY, STEPS = 2, 8


def variants() -> dict:
    base = smoke().derive(steps=STEPS, checkpoint=CheckpointConfig(every=EVERY, keep_last=2),
                          tracker={"backends": ["iceberg"]})
    big = base.model.model_copy(update={"d_model": 384, "n_layers": 6, "n_heads": 12, "n_kv_heads": 2})
    return {"smoke": base, "smoke x10": base.derive(model=big),
            "smoke, 2 ranks": base.derive(parallel=ParallelConfig(nproc_per_node=2))}


def build_lake(root: Path) -> Lake:
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import Corpus, _build_training_lake  # the tests' small lake: real text, 512-token BPE

    return _build_training_lake(root / "home", Corpus())


def preempt_once(lake: Lake, experiment, run: str, threads: int) -> dict:
    """Train `run` until its first checkpoint, SIGTERM it at a random point of a step, wait; the
    incident's detail plus the run's median step time."""
    plan = plan_experiment(lake, experiment.derive(name=run))
    env = {k: v for k, v in os.environ.items() if k not in ("FACTORY_FAULTS", "DAGSTER_PIPES_CONTEXT")}
    env.update(FACTORY_HOME=str(lake.home), OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(launch_command(plan, home=str(lake.home), run=run), cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = checkpoint_dir(lake.home, run) / f"step-{EVERY:08d}.pt"
    while not (first.with_suffix(".json").exists() and validate(first) is None):
        if proc.poll() is not None:
            raise SystemExit(f"{run}: trainer exited {proc.returncode} early:\n{proc.stderr.read()[-2000:]}")
        time.sleep(0.02)
    while (step := step_seconds(lake, run, plan.tokens_per_step)) is None:  # metrics land just after the save
        time.sleep(0.02)
    time.sleep(random.uniform(0, step))  # anywhere in a step
    target = proc.pid
    if experiment.parallel.world_size > 1:  # rank 1's worker only: the others learn through the agreement
        target = next(p for p in children(proc.pid) if environ(p).get("RANK") == "1")
    os.kill(target, signal.SIGTERM)
    _, err = proc.communicate(timeout=600)
    rows = [r for r in lake.table(INCIDENTS_TABLE).scan().to_arrow().to_pylist()
            if r["run"] == run and r["kind"] == "preempted"]
    if not rows:
        raise SystemExit(f"{run}: no preempted incident (exit {proc.returncode}):\n{err[-2000:]}")
    return json.loads(rows[0]["detail"]) | {"step_s": step_seconds(lake, run, plan.tokens_per_step),
                                            "parameters": plan.parameters}


def step_seconds(lake: Lake, run: str, tokens_per_step: int) -> float | None:
    rows = [r["value"] for r in lake.table(METRICS_TABLE).scan().to_arrow().to_pylist()
            if r["run"] == run and r["name"] == "tokens_per_s"] if lake.has_table(METRICS_TABLE) else []
    return tokens_per_step / statistics.median(rows) if rows else None


def _agreement_worker(rank: int, port: int, calls: int, out) -> None:
    import torch.distributed as dist

    from factory.train.distributed import Dist
    from factory.train.preempt import Preemption

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    p = Preemption(Dist(rank, 2, rank, torch.device("cpu")), 60, record=None, warn=print)
    for _ in range(50):
        p.agreed()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        p.agreed()
    elapsed = time.perf_counter() - t0
    p.close()
    dist.destroy_process_group()
    if rank == 0:
        out.put(elapsed / calls)


def agreement_cost(calls: int) -> float:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_agreement_worker, args=(r, port, calls, out)) for r in range(2)]
    for p in procs:
        p.start()
    value = out.get(timeout=300)
    for p in procs:
        p.join()
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", help="FACTORY_HOME with tokenizer and mix `default` (default: a temp one)")
    parser.add_argument("--signals", type=int, default=3, help="preemptions per model")
    parser.add_argument("--calls", type=int, default=2000, help="agreement calls timed")
    parser.add_argument("--threads", type=int, default=1, help="OMP threads of each trainer process")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="preempt-bench-") as tmp:
        lake = Lake.open(home=args.home) if args.home else build_lake(Path(tmp))
        stamp = time.strftime("%H%M%S")
        print(f"{'model':16} {'params':>9} {'step s':>8} {'signal->ckpt s':>15} {'ratio':>6} {'max ratio':>9} "
              f"{'save s':>7} {'save/step':>9} grace")
        results = {}
        for label, experiment in variants().items():
            name = f"preempt-bench-{stamp}-{label.replace(' ', '').replace(',', '-')}"
            got = [preempt_once(lake, experiment, f"{name}-{i}", args.threads) for i in range(args.signals)]
            step = statistics.median(g["step_s"] for g in got)
            latency = [g["seconds_to_checkpoint"] for g in got]
            save = statistics.median(g["save_s"] for g in got)
            results[label] = step
            print(f"{label:16} {got[0]['parameters'] / 1e6:8.2f}M {step:8.3f} {statistics.median(latency):15.3f} "
                  f"{statistics.median(latency) / step:6.2f} {max(latency) / step:9.2f} {save:7.3f} {save / step:9.2f} "
                  f"{got[0]['grace_s']:g} s"
                  f"  (stopped at steps {[g['step'] for g in got]}, all within grace: "
                  f"{all(g['within_grace'] for g in got)})")
        per_call = agreement_cost(args.calls)
        ddp_step = results["smoke, 2 ranks"]
        print(f"agreement (all-reduce MAX of one int32, 2 gloo ranks): {per_call * 1e6:.1f} us per step = "
              f"{100 * per_call / ddp_step:.3f} % of the 2-rank smoke step ({ddp_step:.3f} s)")


if __name__ == "__main__":
    main()

