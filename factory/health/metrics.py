"""The factory-health series, and the one-line hooks the rest of the factory calls.

Design: every series is declared once in `_Series` (name, help, labels, type), created lazily by
`series()` the first time a hook runs in a process where metrics are on, and written through
prometheus_client's multiprocess value class (memory-mapped files in `metrics_dir()`). Off, a hook
costs one dictionary lookup. The hooks take plain values (seconds, counts, an outcome string) so
the modules they sit in (sandbox pool, lake commit, inference engine, incidents) import nothing of
Prometheus and stay testable without it.

Gauges use `multiprocess_mode="mostrecent"`: a rank's tokens/s is one value per (run, rank), the
newest write wins, and it survives the process (a finished run's `running` gauge reads 0, not
nothing). Counters and histograms are summed over processes, which is what `rate()` wants.

Why prometheus_client's module global is patched in `_multiprocess_values`: the library picks its
value class when it is first imported, from `PROMETHEUS_MULTIPROC_DIR`. vLLM, MLflow or Dagster may
import it before the factory turned metrics on, and every series would then be in-process only and
invisible to the exporter; swapping the class before our series are built makes them mmap-backed
whichever import came first.
"""

from __future__ import annotations

import threading

from factory import settings
from factory.health import enabled, metrics_dir

TRAIN = ("run", "rank")
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
FAST_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)
WAIT_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0)
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

_LOCK = threading.Lock()
_STATE: dict[str, _Series | None] = {}


class _Series:
    """Every metric object of the factory (the Dagster run queue's gauges live with its collector)."""

    def __init__(self):
        from prometheus_client import Counter, Gauge, Histogram

        def gauge(name, doc, labels=TRAIN):
            return Gauge(name, doc, labels, registry=None, multiprocess_mode="mostrecent")

        # trainer, per run and rank (factory.health.train)
        self.steps = Counter("factory_train_steps", "Optimizer steps taken (skipped ones included).", TRAIN, registry=None)
        self.step_seconds = Histogram("factory_train_step_seconds", "Wall time of one training step.", TRAIN,
                                      buckets=STEP_BUCKETS, registry=None)
        self.tokens_per_s = gauge("factory_train_tokens_per_second", "Tokens per second of the last step.")
        self.mfu = gauge("factory_train_mfu", "Model FLOPs utilization of the last step (0 off rank 0).")
        self.loader_stall = gauge("factory_train_loader_stall_ratio", "Share of the last step spent waiting on data.")
        self.last_step = gauge("factory_train_last_step", "The last step completed.")
        self.last_step_time = gauge("factory_train_last_step_timestamp_seconds", "Unix time the last step completed.")
        self.running = gauge("factory_train_running", "1 while the training loop runs, 0 once it ended.")
        self.nonfinite = Counter("factory_train_nonfinite_steps", "Steps whose loss or gradient norm was not finite.",
                                 TRAIN, registry=None)
        self.skipped = Counter("factory_train_skipped_steps", "Steps the guards skipped (no update).", TRAIN,
                               registry=None)
        self.replica_seconds = Histogram("factory_train_replica_check_seconds",
                                         "Time of one cross-replica hash comparison.", (*TRAIN, "what"),
                                         buckets=FAST_BUCKETS, registry=None)
        self.replica_mismatches = Counter("factory_train_replica_mismatches", "Replica hash comparisons that differed.",
                                          (*TRAIN, "what"), registry=None)
        self.incidents = Counter("factory_train_incidents", "Rows written to train.incidents, by kind.",
                                 ("run", "kind"), registry=None)
        # sandbox pool (factory.sandbox.pool)
        self.executions = Counter("factory_sandbox_executions", "Sandboxed programs run, by outcome.", ("outcome",),
                                  registry=None)
        self.queue_wait = Histogram("factory_sandbox_queue_wait_seconds", "Time a program waited for a pool slot.",
                                    buckets=WAIT_BUCKETS, registry=None)
        self.exec_seconds = Histogram("factory_sandbox_execution_seconds", "Wall time of one sandboxed program.",
                                      buckets=LATENCY_BUCKETS, registry=None)
        # inference engines (factory.infer.engine)
        self.infer_calls = Counter("factory_infer_requests", "Batched engine calls.", ("engine", "op"), registry=None)
        self.infer_sequences = Counter("factory_infer_sequences", "Sequences generated or scored.", ("engine", "op"),
                                       registry=None)
        self.infer_tokens = Counter("factory_infer_tokens", "Tokens generated (generate) or scored (logprobs).",
                                    ("engine", "op"), registry=None)
        self.infer_latency = Histogram("factory_infer_latency_seconds", "Wall time of one batched engine call.",
                                       ("engine", "op"), buckets=LATENCY_BUCKETS, registry=None)
        # Iceberg commits (factory.lake.commit)
        self.commits = Counter("factory_lake_commits", "Snapshots committed.", ("namespace",), registry=None)
        self.commit_seconds = Histogram("factory_lake_commit_seconds", "Time from first attempt to a committed snapshot.",
                                        ("namespace",), buckets=LATENCY_BUCKETS, registry=None)
        self.conflicts = Counter("factory_lake_commit_conflicts", "Commits that lost to a concurrent writer.",
                                 ("namespace",), registry=None)
        self.retries = Counter("factory_lake_commit_retries", "Commit attempts retried after a conflict.",
                               ("namespace",), registry=None)
        self.gave_up = Counter("factory_lake_commit_failures", "Commits given up after conflicts for RETRY_FOR_S.",
                               ("namespace",), registry=None)


def series_names() -> set[str]:
    """The sample names this module exports (`_total`, `_bucket`, `_sum`, `_count` included), for the
    dashboards' and rules' test; built on throwaway in-process objects, no file is written."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    if _STATE.get("series") is not None:
        objects = _STATE["series"]
    else:
        from prometheus_client import values

        saved, values.ValueClass = values.ValueClass, values.MutexValue
        try:
            objects = _Series()
        finally:
            values.ValueClass = saved
    return {family.name + suffix for metric in vars(objects).values() for family in metric.describe()
            for suffix in suffixes[family.type]}


def series() -> _Series | None:
    """This process's series when metrics are on (created on first call), else None."""
    try:
        return _STATE["series"]
    except KeyError:
        pass
    with _LOCK:
        if "series" not in _STATE:
            _STATE["series"] = _open() if enabled() else None
        return _STATE["series"]


def reset() -> None:
    """Forget the decision and the series (tests switching metrics on and off in one process)."""
    from prometheus_client import values

    with _LOCK:
        _STATE.clear()
        values.ValueClass = values.get_value_class()


def _open() -> _Series:
    path = metrics_dir()
    path.mkdir(parents=True, exist_ok=True)
    settings.export({settings.PROMETHEUS_DIR: str(path)})  # prometheus_client and our children read it there
    _multiprocess_values()
    return _Series()


def _multiprocess_values() -> None:
    from prometheus_client import values

    if values.ValueClass is values.MutexValue:  # imported before the directory was set (module docstring)
        values.ValueClass = values.MultiProcessValue()


# -- hooks: one call each where the work happens ----------------------------------------------
def namespace_of(table: str) -> str:
    return table.split(".", 1)[0]


def incident(run: str, kind: str) -> None:
    if s := series():
        s.incidents.labels(run, kind).inc()


def sandbox_execution(outcome: str, waited: float, seconds: float) -> None:
    if s := series():
        s.executions.labels(outcome).inc()
        s.queue_wait.observe(waited)
        s.exec_seconds.observe(seconds)


def inference(engine: str, op: str, seconds: float, sequences: int, tokens: int) -> None:
    if s := series():
        s.infer_calls.labels(engine, op).inc()
        s.infer_sequences.labels(engine, op).inc(sequences)
        s.infer_tokens.labels(engine, op).inc(tokens)
        s.infer_latency.labels(engine, op).observe(seconds)


def commit_conflict(table: str, *, gave_up: bool) -> None:
    if s := series():
        ns = namespace_of(table)
        s.conflicts.labels(ns).inc()
        (s.gave_up if gave_up else s.retries).labels(ns).inc()


def committed(table: str, seconds: float) -> None:
    if s := series():
        ns = namespace_of(table)
        s.commits.labels(ns).inc()
        s.commit_seconds.labels(ns).observe(seconds)
