"""The factory-health Grafana dashboard as code: panels of PromQL over the series factory.health exports.

    python -m factory.health.dashboards            # rewrite deploy/grafana/dashboards/*.json
    python -m factory.health.dashboards --check    # exit 1 if the checked-in JSON is stale

Design: plain dicts in Grafana's dashboard JSON model (schemaVersion 39), one row per subsystem —
training, sandbox pool, inference, Iceberg commits, run queue — each panel a title, a unit and a
few PromQL targets. The JSON under deploy/grafana/dashboards/ is generated from here and checked
in, so a reviewer sees a panel change as a diff; tests/health/test_dashboards.py asserts the files
equal what this builds and that every series a query names is one the factory exports. The
datasource is the one deploy/grafana/provisioning/datasources/prometheus.yaml provisions (uid
`factory-prometheus`).

Why not grafana-foundation-sdk: the dashboards are a few dozen panels of one kind (time series of
PromQL); its builders would add a dependency to express the same dicts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DATASOURCE = {"type": "prometheus", "uid": "factory-prometheus"}
OUT = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards"
WIDTH, HEIGHT = 8, 8  # three panels a row on Grafana's 24-column grid


def q95(metric: str, by: str = "") -> str:
    """The 95th percentile of a histogram over 5 minutes, per `by` labels."""
    return f"histogram_quantile(0.95, sum by ({by + ', ' if by else ''}le) (rate({metric}_bucket[5m])))"


# (row title, [(panel title, unit, [(PromQL, legend)])])
ROWS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]]]]]] = [
    ("Training", [
        ("Step time (p50 / p95)", "s", [
            ("histogram_quantile(0.5, sum by (run, le) (rate(factory_train_step_seconds_bucket[5m])))", "{{run}} p50"),
            (q95("factory_train_step_seconds", "run"), "{{run}} p95")]),
        ("Tokens per second", "short", [("sum by (run) (factory_train_tokens_per_second)", "{{run}}")]),
        ("MFU", "percentunit", [("max by (run) (factory_train_mfu)", "{{run}}")]),
        ("Loader stall (share of the step)", "percentunit",
         [("max by (run, rank) (factory_train_loader_stall_ratio)", "{{run}} rank {{rank}}")]),
        ("Steps per minute", "short", [("max by (run) (rate(factory_train_steps_total[5m])) * 60", "{{run}}")]),
        ("Seconds since the last step (running runs)", "s",
         [("time() - max by (run) (factory_train_last_step_timestamp_seconds"
           " and on (run, rank) factory_train_running == 1)", "{{run}}")]),
        ("Replica-hash cost (share of step time)", "percentunit",
         [("sum by (run) (rate(factory_train_replica_check_seconds_sum[5m]))"
           " / sum by (run) (rate(factory_train_step_seconds_sum[5m]))", "{{run}}")]),
        ("Incidents (1 h)", "short", [("sum by (run, kind) (increase(factory_train_incidents_total[1h]))",
                                       "{{run}} {{kind}}")]),
        ("Non-finite and skipped steps (1 h)", "short", [
            ("max by (run) (increase(factory_train_nonfinite_steps_total[1h]))", "{{run}} non-finite"),
            ("max by (run) (increase(factory_train_skipped_steps_total[1h]))", "{{run}} skipped")]),
    ]),
    ("Sandbox pool", [
        ("Executions per second by outcome", "ops",
         [("sum by (outcome) (rate(factory_sandbox_executions_total[5m]))", "{{outcome}}")]),
        ("Queue wait (p95)", "s", [(q95("factory_sandbox_queue_wait_seconds"), "p95")]),
        ("Execution time (p95)", "s", [(q95("factory_sandbox_execution_seconds"), "p95")]),
    ]),
    ("Inference", [
        ("Tokens per second", "short",
         [("sum by (engine, op) (rate(factory_infer_tokens_total[5m]))", "{{engine}} {{op}}")]),
        ("Batch latency (p95)", "s", [(q95("factory_infer_latency_seconds", "engine, op"), "{{engine}} {{op}}")]),
        ("Sequences per second", "short",
         [("sum by (engine, op) (rate(factory_infer_sequences_total[5m]))", "{{engine}} {{op}}")]),
    ]),
    ("Iceberg commits", [
        ("Commits per second", "ops", [("sum by (namespace) (rate(factory_lake_commits_total[5m]))", "{{namespace}}")]),
        ("Commit latency (p95)", "s", [(q95("factory_lake_commit_seconds", "namespace"), "{{namespace}}")]),
        ("Conflicts, retries and give-ups per minute", "short", [
            ("sum by (namespace) (rate(factory_lake_commit_conflicts_total[5m])) * 60", "{{namespace}} conflicts"),
            ("sum by (namespace) (rate(factory_lake_commit_retries_total[5m])) * 60", "{{namespace}} retries"),
            ("sum by (namespace) (rate(factory_lake_commit_failures_total[5m])) * 60", "{{namespace}} gave up")]),
    ]),
    ("Run queue", [
        ("Queued and running runs by kind and priority", "short",
         [("sum by (status, kind, priority) (factory_dagster_runs)", "{{status}} {{kind}} p{{priority}}")]),
        ("Queue length", "short", [("factory_dagster_queue_length", "queued")]),
        ("Oldest queued run", "s", [("factory_dagster_oldest_queued_run_age_seconds", "age")]),
    ]),
]


def factory_health() -> dict:
    """The dashboard JSON (uid `factory-health`)."""
    panels, y, pid = [], 0, 1
    for title, row in ROWS:
        panels.append({"type": "row", "title": title, "id": pid, "collapsed": False,
                       "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []})
        pid, y = pid + 1, y + 1
        for i, (name, unit, targets) in enumerate(row):
            panels.append({
                "type": "timeseries", "title": name, "id": pid, "datasource": DATASOURCE,
                "gridPos": {"x": (i % 3) * WIDTH, "y": y + (i // 3) * HEIGHT, "w": WIDTH, "h": HEIGHT},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
                "targets": [{"refId": chr(ord("A") + k), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
                            for k, (expr, legend) in enumerate(targets)],
            })
            pid += 1
        y += -(-len(row) // 3) * HEIGHT
    return {"uid": "factory-health", "title": "Factory health", "tags": ["factory"], "timezone": "utc",
            "schemaVersion": 39, "version": 1, "editable": True, "refresh": "30s",
            "time": {"from": "now-6h", "to": "now"}, "panels": panels,
            "templating": {"list": []}, "annotations": {"list": []}}


DASHBOARDS = {"factory-health.json": factory_health}


def rendered() -> dict[str, str]:
    """file name -> the JSON text it must hold."""
    return {name: json.dumps(build(), indent=2, sort_keys=True) + "\n" for name, build in DASHBOARDS.items()}


def expressions(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m factory.health.dashboards", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the checked-in files instead of writing")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    stale = []
    for name, text in rendered().items():
        path = args.out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"stale (run python -m factory.health.dashboards): {', '.join(stale)}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
