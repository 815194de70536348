"""Dashboards and alert rules as code, on CPU, no servers: the checked-in Grafana JSON is exactly
what factory/health/dashboards.py builds; every series a panel or an alert rule names is one the
factory exports (factory.health.metrics plus the run-queue collector); panels sit on the grid
without overlapping; the provisioning files point at the dashboards' directory and datasource uid.
(Prometheus itself parses every panel query in tests/integration/test_prometheus.py; promtool
checks and unit-tests the rules in test_rules.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from dagster import DagsterInstance

from factory.health import dashboards
from factory.health.metrics import series_names
from resources.run_queue_metrics import RunQueueCollector

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\b(factory_[a-z0-9_]+)\b")


def exported() -> set[str]:
    queue = {s.name for f in RunQueueCollector(DagsterInstance.ephemeral()).collect() for s in f.samples}
    queue |= {f.name for f in RunQueueCollector(DagsterInstance.ephemeral()).collect()}  # empty families too
    return series_names() | queue


def test_checked_in_dashboards_are_what_the_code_builds():
    for name, text in dashboards.rendered().items():
        path = ROOT / "deploy" / "grafana" / "dashboards" / name
        assert path.read_text() == text, f"{path} is stale: run python -m factory.health.dashboards"
    assert dashboards.main(["--check"]) == 0


def test_every_panel_query_names_exported_series():
    board, known = dashboards.factory_health(), exported()
    exprs = dashboards.expressions(board)
    assert len(exprs) >= 20
    named = {n for e in exprs for n in NAME.findall(e)}
    assert named - known == set()
    # every subsystem is on the board
    for prefix in ("factory_train_", "factory_sandbox_", "factory_infer_", "factory_lake_", "factory_dagster_"):
        assert any(n.startswith(prefix) for n in named), prefix


def test_panels_do_not_overlap_and_have_units():
    cells = set()
    for panel in dashboards.factory_health()["panels"]:
        g = panel["gridPos"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & area, panel["title"]
        cells |= area
        if panel["type"] == "timeseries":
            assert panel["fieldConfig"]["defaults"]["unit"] and panel["targets"], panel["title"]


def test_alert_rules_name_exported_series():
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.yml").read_text())
    alerts = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    assert set(alerts) == {"FactoryTrainingStalled", "FactoryNonFiniteStep", "FactoryReplicaMismatch",
                           "FactoryRunQueueGrowing"}
    assert {n for e in alerts.values() for n in NAME.findall(e)} - exported() == set()


def test_provisioning_points_at_the_dashboards_and_the_datasource():
    prov = ROOT / "deploy" / "grafana" / "provisioning"
    sources = yaml.safe_load((prov / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert [s["uid"] for s in sources] == [dashboards.DATASOURCE["uid"]]
    providers = yaml.safe_load((prov / "dashboards" / "factory.yaml").read_text())["providers"]
    assert providers[0]["type"] == "file" and providers[0]["options"]["path"]
    board = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "factory-health.json").read_text())
    assert {p["datasource"]["uid"] for p in board["panels"] if "datasource" in p} == {"factory-prometheus"}
