"""The alert rules (deploy/prometheus/rules.yml) under Prometheus's own tool, on CPU: `promtool
check rules` parses them, and `promtool test rules` runs deploy/prometheus/rules_test.yml, where
each alert (stalled run, non-finite step, replica mismatch, growing queue) fires on a series that
should trip it, at the expected time with the expected labels and text, and stays silent on a
healthy one. The reference scrape config parses too (`promtool check config`). Skipped without
promtool (Debian's `prometheus` package ships it: `make system`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PROM = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=PROM, capture_output=True, text=True, timeout=60)


def test_rules_parse():
    out = promtool("check", "rules", "rules.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 4 rules found" in out.stdout


def test_rules_unit_tests_pass():
    out = promtool("test", "rules", "rules_test.yml")
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_wrong_expectation_fails(tmp_path):
    """The unit tests can fail: the stalled-run alert expected at 5 min (it fires at 12) is reported."""
    case = "      - eval_time: 5m\n        alertname: FactoryTrainingStalled\n        exp_alerts: "
    good = (PROM / "rules_test.yml").read_text()
    bad = good.replace(case + "[]", case + "[{exp_labels: {run: stuck}}]", 1)
    assert bad != good
    (tmp_path / "rules_test.yml").write_text(bad)
    shutil.copy(PROM / "rules.yml", tmp_path / "rules.yml")
    out = subprocess.run(["promtool", "test", "rules", "rules_test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0 and "FactoryTrainingStalled" in out.stdout + out.stderr


def test_reference_scrape_config_parses():
    out = promtool("check", "config", "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr
