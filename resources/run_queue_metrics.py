"""The Dagster run queue as Prometheus gauges, polled from the instance at every scrape.

    python -m resources.run_queue_metrics --port 9464 --dagster-home $DAGSTER_HOME

Series (all gauges, computed when Prometheus scrapes, so they are never stale):
- `factory_dagster_runs{status, kind, priority}`: queued and running runs by `factory/kind` and
  `dagster/priority` tag (`none` / `0` when a run has no tag, as the queue itself treats them);
- `factory_dagster_queue_length`: every queued run, always present (0 when none), so an alert on a
  growing queue never sees a missing series;
- `factory_dagster_oldest_queued_run_age_seconds`: how long the oldest queued run has waited (0 when
  none), from its run record's creation time.

Design: a custom collector (prometheus_client's `Collector` protocol, `collect()` yielding metric
families) over one `DagsterInstance`, served by the factory's exporter next to the multiprocess
series (`factory.health.exporter`), so one target has everything. It lives in the Dagster layer
because reading the instance needs Dagster, which `factory/` never imports. One `get_run_records`
query per scrape over the non-terminal statuses: cheap at any queue length a scheduler can hold.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from prometheus_client.core import GaugeMetricFamily

KIND_TAG, PRIORITY_TAG = "factory/kind", "dagster/priority"
QUEUED = (DagsterRunStatus.QUEUED,)
RUNNING = (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING)


class RunQueueCollector:
    """Queued and running runs of `instance`, by kind and priority (module docstring)."""

    def __init__(self, instance: DagsterInstance, clock=time.time):
        self.instance, self.clock = instance, clock

    def describe(self):
        return []  # no collect() at registration: the instance is read at scrape time only

    def collect(self):
        records = self.instance.get_run_records(filters=RunsFilter(statuses=[*QUEUED, *RUNNING]))
        counts: Counter[tuple[str, str, str]] = Counter()
        oldest = None
        for record in records:
            run = record.dagster_run
            status = "queued" if run.status in QUEUED else "running"
            counts[(status, run.tags.get(KIND_TAG, "none"), run.tags.get(PRIORITY_TAG, "0"))] += 1
            if status == "queued":
                created = record.create_timestamp.timestamp()
                oldest = created if oldest is None else min(oldest, created)
        runs = GaugeMetricFamily("factory_dagster_runs", "Queued and running Dagster runs by kind and priority.",
                                 labels=["status", "kind", "priority"])
        for labels, n in sorted(counts.items()):
            runs.add_metric(list(labels), n)
        yield runs
        yield GaugeMetricFamily("factory_dagster_queue_length", "Queued Dagster runs.",
                                value=sum(n for (status, _, _), n in counts.items() if status == "queued"))
        yield GaugeMetricFamily("factory_dagster_oldest_queued_run_age_seconds",
                                "Seconds the oldest queued run has waited (0 when none is queued).",
                                value=max(0.0, self.clock() - oldest) if oldest is not None else 0.0)


def main(argv: list[str] | None = None) -> int:
    from factory.health.exporter import add_arguments, run_forever

    parser = add_arguments(argparse.ArgumentParser(prog="python -m resources.run_queue_metrics",
                                                   description=__doc__.split("\n")[0]))
    parser.add_argument("--dagster-home", required=True, help="the instance directory (DAGSTER_HOME)")
    args = parser.parse_args(argv)
    instance = DagsterInstance.from_config(args.dagster_home)
    return run_forever(args, collectors=[RunQueueCollector(instance)])


if __name__ == "__main__":
    sys.exit(main())
