"""The trainer's health series: what `train()` hands over each step, in three calls.

    health = TrainMetrics.open(run, d, replicas)   # after the replica checker is built
    health.step(step, metrics, seconds)            # after the trainer's `_Meter` computed the step's metrics
    health.close()                                 # when the loop ends, however it ends

Design: the trainer's `_Meter` already computes tokens/s, MFU and loader stall for the trackers;
this only copies those numbers into gauges, counts the step and observes its time, so the metrics
cost a few memory-mapped writes a step (bench/metrics_bench.py measures it against the step). The
replica-hash cost is timed by wrapping the checker's one comparison method (`_compare`, the path
both the parameter and the gradient checks take) on this instance only, so replicas.py stays as it
is; a mismatch is counted on the way out. Incidents are counted where they are written
(`factory.train.incidents.record_incident`), which also sees the ones recorded outside the loop.

Off (`FACTORY_METRICS` unset), `open` returns an inert object whose methods return at once.
"""

from __future__ import annotations

import functools
import math
import time

from factory.health.metrics import series


class TrainMetrics:
    """One run's series on one rank (labels run, rank)."""

    def __init__(self, s, run: str, rank: int):
        self.s, self.labels = s, (run, str(rank))
        self._children = None
        if s is not None:
            labels = self.labels
            self._children = tuple(m.labels(*labels) for m in (
                s.steps, s.step_seconds, s.tokens_per_s, s.mfu, s.loader_stall, s.last_step, s.last_step_time))
            s.running.labels(*labels).set(1)
            s.last_step_time.labels(*labels).set(time.time())  # progress starts now: a run stuck before step 1 stalls too
            # counters an alert takes increase() of exist from the start at 0: a series born at 1 has no increase
            for counter in (s.nonfinite, s.skipped):
                counter.labels(*labels)
            for what in ("parameters", "gradients"):
                s.replica_mismatches.labels(*labels, what)

    @classmethod
    def open(cls, run: str, d, replicas=None) -> TrainMetrics:
        """The series of `run` on rank `d.rank`; times `replicas`' comparisons when given."""
        s = series()
        health = cls(s, run, d.rank)
        if s is not None and replicas is not None:
            replicas._compare = health._timed_compare(replicas._compare)
        return health

    def step(self, step: int, metrics: dict[str, float], seconds: float) -> None:
        """Record step `step` (1-based, completed), `seconds` long, from the `_Meter`'s metrics dict."""
        if self._children is None:
            return
        steps, step_seconds, tps, mfu, stall, last, when = self._children
        steps.inc()
        step_seconds.observe(seconds)
        tps.set(metrics.get("tokens_per_s", 0.0))
        mfu.set(metrics.get("mfu", 0.0))
        stall.set(metrics.get("loader_stall", 0.0))
        last.set(step)
        when.set(time.time())
        if not (math.isfinite(metrics.get("loss", 0.0)) and math.isfinite(metrics.get("grad_norm", 0.0))):
            self.s.nonfinite.labels(*self.labels).inc()
        if metrics.get("skipped"):
            self.s.skipped.labels(*self.labels).inc()

    def close(self) -> None:
        if self.s is not None:
            self.s.running.labels(*self.labels).set(0)

    def _timed_compare(self, compare):
        @functools.wraps(compare)
        def timed(named, what: str, kind: str, step: int):
            t0 = time.perf_counter()
            try:
                return compare(named, what, kind, step)
            except Exception:
                self.s.replica_mismatches.labels(*self.labels, what).inc()
                raise
            finally:
                self.s.replica_seconds.labels(*self.labels, what).observe(time.perf_counter() - t0)

        return timed
