"""The run-queue collector (resources/run_queue_metrics.py) over a real ephemeral Dagster instance,
on CPU: queued and running runs counted by `factory/kind` and `dagster/priority` (untagged runs as
`none` / `0`), finished runs left out, the oldest queued run's age from its record, and the zeros
an empty queue reports (so an alert never sees the series vanish). Served next to the
multiprocess series through the exporter's registry."""

from __future__ import annotations

import time

from dagster import DagsterInstance, DagsterRunStatus
from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.storage.dagster_run import DagsterRun
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

from resources.run_queue_metrics import RunQueueCollector


# a queued run must name where its code lives; the collector never looks at it
ORIGIN = RemoteJobOrigin(RemoteRepositoryOrigin(InProcessCodeLocationOrigin(LoadableTargetOrigin(python_file="x.py")),
                                                "repo"), "demo_job")


def add(instance, run_id, status, tags):
    instance.add_run(DagsterRun(job_name="demo_job", run_id=run_id, status=status, tags=tags, remote_job_origin=ORIGIN))


def test_queue_by_kind_and_priority_and_the_oldest_age(metrics_on, scrape):
    instance = DagsterInstance.ephemeral()
    empty = scrape(metrics_on, [RunQueueCollector(instance)])
    assert empty[("factory_dagster_queue_length", ())] == 0
    assert empty[("factory_dagster_oldest_queued_run_age_seconds", ())] == 0

    train = {"factory/kind": "training", "dagster/priority": "0"}
    add(instance, "q1", DagsterRunStatus.QUEUED, train)
    add(instance, "q2", DagsterRunStatus.QUEUED, train)
    add(instance, "q3", DagsterRunStatus.QUEUED, {"factory/kind": "eval", "dagster/priority": "10"})
    add(instance, "r1", DagsterRunStatus.STARTED, train)
    add(instance, "u1", DagsterRunStatus.QUEUED, {})
    add(instance, "done", DagsterRunStatus.SUCCESS, train)
    later = time.time() + 100
    got = scrape(metrics_on, [RunQueueCollector(instance, clock=lambda: later)])

    def runs(status, kind, priority):
        return got.get(("factory_dagster_runs", (("kind", kind), ("priority", priority), ("status", status))))

    assert runs("queued", "training", "0") == 2
    assert runs("queued", "eval", "10") == 1
    assert runs("queued", "none", "0") == 1
    assert runs("running", "training", "0") == 1
    assert got[("factory_dagster_queue_length", ())] == 4
    assert 100 <= got[("factory_dagster_oldest_queued_run_age_seconds", ())] < 160
