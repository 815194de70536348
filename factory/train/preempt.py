"""Preemption: a SIGTERM (Kubernetes' notice of preemption or eviction) costs at most one step.

On SIGTERM the trainer finishes the step it is in, checkpoints that step, records a `preempted`
incident in `train.incidents` and exits with `PREEMPTED_EXIT` (75, EX_TEMPFAIL: "try again
later"), so whatever launched it can tell a preemption from a crash and retry; the retry resumes
from that checkpoint and continues bit-identically (the checkpoint holds model, optimizer, RNG,
loader and guard state, as every checkpoint does).

Design.
- The handler only records that a signal came (and when, and how many): nothing is interrupted,
  no exception is raised from inside a step, a collective or a file write. The loop asks
  `Preemption.agreed()` once after each step.
- Ranks agree on the stop step with one all-reduce (MAX) of a one-element flag per step: each
  rank may get the signal at a different step, or only one pod of several may be preempted, and
  every rank must checkpoint the same step or the checkpoint's gathered loader state would not
  be one step's. The cost is one tiny collective per step (bench/preempt_bench.py measures it).
- A second SIGTERM (kubelet and torchrun may both send one, or an impatient operator) lands in
  the same handler and only bumps the count: the checkpoint write is never interrupted. The
  write itself is atomic (`factory.train.checkpoint`: temp file, fsync, rename, manifest last),
  so a SIGKILL at the end of the grace period leaves the previous checkpoint valid.
- Time from the signal to the durable checkpoint is measured and recorded against the grace
  (`TrainingProfile.preemption_grace_s`, handed to `train()`; nothing here reads the
  environment). A step plus a save longer than the grace is reported (`within_grace: false`),
  since the next preemption would then lose that step: shorten `checkpoint`'s cost or raise the
  grace.

Under torchrun: SIGTERM to the agent is forwarded to every worker (`--signals-to-handle`); the
agent then waits `--shutdown-timeout` before SIGKILL (the launch passes the grace, not torch's
30 s default) and exits 1 itself, whatever the workers' codes. So the distinct exit code
survives for one process, and for torchrun the preemption is reported through the lake: the
`training_run` asset reads the `preempted` incident of its Dagster run id (`preemption_of`).

Under Dagster: a run worker that is itself stopped (terminated, or its pod evicted) forwards that
to its Pipes child as SIGINT, not SIGTERM (`PipesSubprocessClient(forward_termination=True)`), and
waits 90 s (`resources/__init__.py`; Dagster's default is 20 s); the launch passes
`--sigint-is-preemption` so that SIGINT checkpoints too (`sigint_as_sigterm`). By hand, Ctrl-C stays a plain KeyboardInterrupt.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import torch
import torch.distributed as dist

from factory.train.distributed import Dist

PREEMPTED_EXIT = 75  # os.EX_TEMPFAIL: the run stopped cleanly at a checkpoint; run it again to continue
INCIDENT = "preempted"


class Preempted(Exception):
    """Raised by the trainer after the preemption checkpoint is durable and the incident recorded."""

    def __init__(self, step: int, checkpoint_id: str, seconds: float, grace_s: float):
        super().__init__(f"preempted at step {step}: checkpoint {checkpoint_id} written {seconds:.2f} s after "
                         f"SIGTERM (grace {grace_s:g} s); a relaunch resumes from it")
        self.step, self.checkpoint_id, self.seconds, self.grace_s = step, checkpoint_id, seconds, grace_s


class Preemption:
    """The SIGTERM flag of one training process and the ranks' agreement on it.

    Installed on construction (main thread only: Python delivers signals there), restored by
    `close()`. `record(step, kind, detail)` writes an incident (`factory.train.incidents`)."""

    def __init__(self, d: Dist, grace_s: float, record, warn, *, run_id: str = ""):
        if grace_s <= 0:
            raise ValueError(f"preemption grace must be positive seconds, got {grace_s}")
        self.d, self.grace_s, self.record, self.warn, self.run_id = d, grace_s, record, warn, run_id
        self.signalled_at: float | None = None  # wall clock (comparable across the ranks of one node)
        self.signals = 0
        self._stopping_at: float | None = None  # when the ranks agreed to stop: the step was over
        self._flag = torch.zeros(1, dtype=torch.int32, device=d.device)
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        # only bookkeeping: the step, a collective or a checkpoint write in progress goes on
        self.signals += 1
        if self.signalled_at is None:
            self.signalled_at = time.time()

    def agreed(self) -> bool:
        """Stop after this step? True on every rank as soon as any rank got a SIGTERM."""
        stop = self.signalled_at is not None
        if self.d.active:
            self._flag.fill_(int(stop))
            dist.all_reduce(self._flag, op=dist.ReduceOp.MAX)
            stop = bool(self._flag.item())  # the loop already syncs for the loss and the grad norm
        if stop and self._stopping_at is None:
            self._stopping_at = time.time()
        return stop

    def stopped(self, step: int, checkpoint_id: str) -> Preempted:
        """After the stop step's checkpoint is durable: record the incident (rank 0), warn, and
        return the exception the trainer raises. Every rank calls it (one gather)."""
        durable = time.time()
        times = self.d.all_gather_objects((self.signalled_at, self.signals))
        signalled = [t for t, _ in times if t is not None]
        seconds = round(durable - min(signalled), 3) if signalled else 0.0
        save = round(durable - (self._stopping_at or durable), 3)  # the checkpoint alone, without the step's rest
        detail = {"signal": "SIGTERM", "step": step, "checkpoint": checkpoint_id, "seconds_to_checkpoint": seconds,
                  "save_s": save, "grace_s": self.grace_s, "within_grace": seconds <= self.grace_s,
                  "run_id": self.run_id, "signals": sum(n for _, n in times),
                  "ranks_signalled": [r for r, (t, _) in enumerate(times) if t is not None]}
        if self.d.main:
            self.record(step, INCIDENT, detail)
        exc = Preempted(step, checkpoint_id, seconds, self.grace_s)
        self.warn(str(exc) + ("" if detail["within_grace"] else " -- LONGER than the grace: raise it or save faster"))
        return exc

    def close(self) -> None:
        """Put back the handler that was there before (a library call leaves no trace)."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None


def sigint_as_sigterm() -> None:
    """Treat SIGINT as SIGTERM in this process (a preemption once `Preemption` is installed, the
    default termination before and after): for the trainer under Dagster Pipes, see above."""
    signal.signal(signal.SIGINT, lambda signum, frame: os.kill(os.getpid(), signal.SIGTERM))


def preemption_of(lake, run: str, run_id: str) -> dict | None:
    """The `preempted` incident that Dagster run `run_id` of `run` recorded (its detail, with
    `step`), or None: how a launcher learns of a preemption whatever exit code reached it."""
    import json

    from pyiceberg.expressions import And, EqualTo

    from factory.train.incidents import INCIDENTS_TABLE

    if not run_id or not lake.has_table(INCIDENTS_TABLE):
        return None
    rows = lake.table(INCIDENTS_TABLE).scan(row_filter=And(EqualTo("run", run), EqualTo("kind", INCIDENT))).to_arrow()
    found = [json.loads(d) for d in rows.column("detail").to_pylist()]
    found = [d for d in found if d.get("run_id") == run_id]
    return max(found, key=lambda d: d["step"]) if found else None

