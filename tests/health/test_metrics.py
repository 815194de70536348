"""The factory-health series and their hooks, on CPU, in process and in child processes.

- off (no FACTORY_METRICS): no series, no files, hooks return;
- on: the trainer hook (steps, step time, gauges, the replica check timed, a mismatch counted), the
  sandbox pool (a real bubblewrap batch: outcomes by outcome, queue wait), an engine subclass
  (instrumented without a line of its own; vLLM, transformers and the OpenAI client are too), and a
  lake commit that loses one race (conflict, retry, commit) all land in the multiprocess directory and read back through the exporter's registry;
- two processes write the same counter and the exporter sums them, also when prometheus_client
  was imported before the directory was set;
- `factory metrics serve` answers /metrics over HTTP on loopback and stops on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from types import SimpleNamespace

import pyarrow as pa
import pytest
from pyiceberg.exceptions import CommitFailedException

from factory.health import child_env, metrics
from factory.health.train import TrainMetrics


def test_off_by_default_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("FACTORY_METRICS", raising=False)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "prom"))
    metrics.reset()
    try:
        assert metrics.series() is None
        health = TrainMetrics.open("r", SimpleNamespace(rank=0))
        health.step(1, {"loss": 1.0}, 0.1)
        metrics.sandbox_execution("passed", 0.0, 0.1)
        assert not (tmp_path / "prom").exists()
    finally:
        metrics.reset()


def test_trainer_hook_records_steps_gauges_and_replica_checks(metrics_on, scrape):
    class Checker:
        def _compare(self, named, what, kind, step):
            if step == 2:
                raise RuntimeError("differ")

    checker = Checker()
    health = TrainMetrics.open("run-a", SimpleNamespace(rank=1), checker)
    for step in (1, 2, 3):
        health.step(step, {"loss": float("nan") if step == 2 else 2.0, "grad_norm": 1.0, "tokens_per_s": 1000.0 * step,
                           "mfu": 0.25, "loader_stall": 0.1, "skipped": float(step == 2)}, 0.05)
    checker._compare([], "parameters", "replica_mismatch", 1)
    with pytest.raises(RuntimeError):
        checker._compare([], "parameters", "replica_mismatch", 2)
    health.close()
    got, labels = scrape(metrics_on), (("rank", "1"), ("run", "run-a"))
    assert got[("factory_train_steps_total", labels)] == 3
    assert got[("factory_train_step_seconds_count", labels)] == 3
    assert got[("factory_train_tokens_per_second", labels)] == 3000.0
    assert got[("factory_train_last_step", labels)] == 3
    assert got[("factory_train_running", labels)] == 0
    assert got[("factory_train_nonfinite_steps_total", labels)] == 1
    assert got[("factory_train_skipped_steps_total", labels)] == 1
    assert abs(got[("factory_train_last_step_timestamp_seconds", labels)] - time.time()) < 60
    what = tuple(sorted(labels + (("what", "parameters"),)))
    assert got[("factory_train_replica_check_seconds_count", what)] == 2
    assert got[("factory_train_replica_mismatches_total", what)] == 1


def test_sandbox_batch_counts_outcomes_and_queue_wait(metrics_on, scrape):
    from factory.sandbox import Sandbox, SandboxConfig

    box = Sandbox(SandboxConfig(workers=1))
    results = box.map(["print(1)", "raise SystemExit(3)", "print(2)"])
    got = scrape(metrics_on)
    assert [r.outcome.value for r in results] == ["passed", "failed", "passed"]
    # the constructor's own probe goes through `execute` directly, not the pool: only the batch counts
    assert got[("factory_sandbox_executions_total", (("outcome", "passed"),))] == 2
    assert got[("factory_sandbox_executions_total", (("outcome", "failed"),))] == 1
    assert got[("factory_sandbox_queue_wait_seconds_count", ())] == 3
    assert got[("factory_sandbox_queue_wait_seconds_sum", ())] > 0  # one worker: the 2nd and 3rd waited


def test_every_engine_subclass_is_measured(metrics_on, scrape):
    from factory.infer.engine import Engine, Sample

    class Echo(Engine):  # no instrumentation of its own, as a new engine would be written
        name = "echo"

        def __init__(self):
            pass

        def generate(self, prompts, sampling):
            return [[Sample(token_ids=[1, 2, 3], text="x", finish_reason="length")] for _ in prompts]

        def logprobs(self, sequences):
            return [[0.0] * (len(s) - 1) for s in sequences]

        def top_logprobs(self, sequences, k):
            return self.logprobs(sequences)  # nested: counted once, as top_logprobs

    engine = Echo()
    engine.generate([[1], [2]], None)
    engine.logprobs([[1, 2, 3, 4]])
    engine.top_logprobs([[1, 2]], 1)
    got = scrape(metrics_on)
    assert got[("factory_infer_tokens_total", (("engine", "echo"), ("op", "generate")))] == 6
    assert got[("factory_infer_sequences_total", (("engine", "echo"), ("op", "generate")))] == 2
    assert got[("factory_infer_tokens_total", (("engine", "echo"), ("op", "logprobs")))] == 3
    assert got[("factory_infer_requests_total", (("engine", "echo"), ("op", "logprobs")))] == 1
    assert got[("factory_infer_latency_seconds_count", (("engine", "echo"), ("op", "top_logprobs")))] == 1


def test_the_factory_engines_are_wrapped_where_they_are_defined():
    from factory.infer.engine import TransformersEngine
    from factory.infer.openai_engine import OpenAIEngine
    from factory.infer.vllm_engine import VLLMEngine

    for cls in (TransformersEngine, VLLMEngine, OpenAIEngine):
        assert all(getattr(cls, op)._health_wrapped for op in ("generate", "logprobs", "top_logprobs")), cls


def test_a_commit_that_loses_a_race_counts_conflict_retry_and_commit(metrics_on, scrape, lake):
    from factory.lake.commit import CommitStamp, commit_with_retry

    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    schema = Schema(NestedField(1, "x", LongType(), required=False))
    lake.commit("scratch.rows", pa.table({"x": [1]}), CommitStamp(asset_key="t", config_hash="c"), schema=schema)
    lost = []

    def load_table():
        if not lost:
            lost.append(1)
            raise CommitFailedException("another writer won")
        return lake.table("scratch.rows")

    commit_with_retry(load_table, "scratch.rows", pa.table({"x": [2]}), CommitStamp(asset_key="t", config_hash="c"))
    got, ns = scrape(metrics_on), (("namespace", "scratch"),)
    assert got[("factory_lake_commits_total", ns)] == 2
    assert got[("factory_lake_commit_conflicts_total", ns)] == 1
    assert got[("factory_lake_commit_retries_total", ns)] == 1
    assert got[("factory_lake_commit_seconds_count", ns)] == 2


CHILD = """
import prometheus_client  # imported before the factory turns metrics on: the value class must still be mmap'd
from factory.health import metrics
metrics.sandbox_execution("passed", 0.0, 0.01)
"""


def test_processes_write_one_directory_and_the_exporter_sums_them(metrics_on, scrape):
    env = {**os.environ, **child_env()}
    for _ in range(2):
        subprocess.run([sys.executable, "-c", CHILD], env=env, check=True, timeout=120)
    metrics.sandbox_execution("passed", 0.0, 0.01)
    assert scrape(metrics_on)[("factory_sandbox_executions_total", (("outcome", "passed"),))] == 3


@pytest.mark.loopback
def test_factory_metrics_serve_answers_on_loopback(metrics_on, tmp_path):
    metrics.committed("train.metrics", 0.02)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "factory.cli", "metrics", "serve", "--port", str(port),
                             "--dir", str(metrics_on)], stdout=subprocess.PIPE, text=True)
    try:
        assert "metrics on http://127.0.0.1" in proc.stdout.readline()
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'factory_lake_commits_total{namespace="train"} 1.0' in body
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
