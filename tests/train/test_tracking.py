"""Experiment tracking (`factory.train.trackers`), throughput arithmetic (`perf`), loss-curve
images (`plot`) and `TrackerResource`.

These run on CPU with no servers and no network: MLflow on a sqlite store under the test's
`tmp_path` (read back with a fresh `MlflowClient`), Neptune in offline mode (its JSON-lines files
read back from disk), Iceberg on the `lake` fixture's sqlite catalog. ~15 s, most of it importing
MLflow and Neptune and creating MLflow's schema once per module.
"""

from __future__ import annotations

import base64
import json
import math
import os
import socket

import pytest
from mlflow import MlflowClient

from factory.train import perf
from factory.train.config import TrackerConfig
from factory.train.plot import PNG_SIGNATURE, loss_curve_png, png_markdown
from factory.train.incidents import record_incident
from factory.train.trackers import (
    IcebergMetrics,
    MLflowTracker,
    MultiTracker,
    NeptuneTracker,
    build_tracker,
    flatten_params,
)

LOSSES = [(1, 4.0), (2, 3.5), (3, 3.2)]


@pytest.fixture(scope="module")
def mlflow_home(tmp_path_factory):
    """One MLflow store for the module: creating its sqlite schema takes ~2 s."""
    return tmp_path_factory.mktemp("home")


def read_client(home) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")


def runs_named(home, run: str):
    client = read_client(home)
    experiment = client.get_experiment_by_name("factory")
    return client.search_runs([experiment.experiment_id], f"tags.`factory.run` = '{run}'")


def test_flatten_params_nests_with_dots_and_stringifies():
    flat = flatten_params({"model": {"d_model": 64, "layers": [1, 2], "tie": True}, "lr": 1e-3,
                           "mix": "code-v1", "none": None, "empty": {}})
    assert flat == {"model.d_model": "64", "model.layers": "[1, 2]", "model.tie": "true", "lr": "0.001",
                    "mix": "code-v1", "none": "null", "empty": "{}"}
    assert flatten_params({"model": TrackerConfig()})["model.backends"] == '["mlflow", "iceberg"]'


def test_mlflow_writes_params_metric_history_and_text_under_home(mlflow_home):
    tracker = MLflowTracker(mlflow_home)
    tracker.start("run-a", {"model": {"d_model": 64}, "lr": 3e-4, "note": "x" * 10_000}, {"experiment": "tiny"})
    for step, loss in LOSSES:
        tracker.log_metrics(step, {"loss": loss})
    tracker.log_text("card.md", "# tiny\n")
    tracker.finish("FINISHED")

    client = read_client(mlflow_home)  # a fresh client on the sqlite file: nothing held in memory
    experiment = client.get_experiment_by_name("factory")
    assert experiment.artifact_location == (mlflow_home / "mlflow" / "artifacts").as_uri()
    (run,) = runs_named(mlflow_home, "run-a")
    assert run.info.status == "FINISHED" and run.info.run_name == "run-a"
    assert run.data.params["model.d_model"] == "64" and run.data.params["lr"] == "0.0003"
    assert 0 < len(run.data.params["note"]) < 10_000  # truncated to MLflow's limit, not rejected
    assert run.data.tags["experiment"] == "tiny"
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss"))
    assert history == LOSSES
    card = mlflow_home / "mlflow" / "artifacts" / run.info.run_id / "artifacts" / "card.md"
    assert card.read_text() == "# tiny\n"


def test_mlflow_resumes_an_unfinished_run_and_not_a_finished_one(mlflow_home):
    first = MLflowTracker(mlflow_home)
    first.start("run-b", {"lr": 1e-3}, {})
    first.log_metrics(1, {"loss": 4.0})
    first.finish("FAILED")

    again = MLflowTracker(mlflow_home)  # a restarted process
    again.start("run-b", {"lr": 1e-3, "resumed": True}, {})
    assert again.run_id == first.run_id
    again.log_metrics(2, {"loss": 3.0})
    again.finish("FINISHED")
    (run,) = runs_named(mlflow_home, "run-b")
    assert run.info.status == "FINISHED" and run.data.params["resumed"] == "true"
    assert [m.step for m in read_client(mlflow_home).get_metric_history(run.info.run_id, "loss")] == [1, 2]

    later = MLflowTracker(mlflow_home)
    later.start("run-b", {"lr": 1e-3}, {})  # FINISHED is a closed record: a new MLflow run
    assert later.run_id != first.run_id
    later.finish("KILLED")
    assert sorted(r.info.status for r in runs_named(mlflow_home, "run-b")) == ["FINISHED", "KILLED"]


def test_multi_tracker_fans_out_and_nan_is_kept_only_in_iceberg(mlflow_home, lake):
    mlflow = MLflowTracker(mlflow_home)
    iceberg = IcebergMetrics(lake, "run-c")
    with MultiTracker([mlflow, iceberg]) as tracker:
        tracker.start("run-c", {"lr": 1e-3}, {})
        tracker.log_metrics(1, {"loss": 4.0, "grad_norm": 1.0})
        tracker.log_metrics(2, {"loss": math.nan, "grad_norm": math.inf})
        tracker.log_metrics(3, {"loss": 3.0, "grad_norm": 0.5})
    # the context manager finished both: MLflow closed, Iceberg flushed
    (run,) = runs_named(mlflow_home, "run-c")
    assert run.info.status == "FINISHED"
    history = read_client(mlflow_home).get_metric_history(run.info.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 4.0), (3, 3.0)]
    rows = lake.table("train.metrics").scan().to_arrow().to_pylist()
    by_key = {(r["step"], r["name"]): r["value"] for r in rows}
    assert len(rows) == 6 and math.isnan(by_key[(2, "loss")]) and by_key[(2, "grad_norm")] == math.inf


def test_failure_inside_the_context_marks_the_run_failed(mlflow_home):
    tracker = MLflowTracker(mlflow_home)
    with pytest.raises(RuntimeError, match="boom"):
        with tracker:
            tracker.start("run-d", {}, {})
            raise RuntimeError("boom")
    assert runs_named(mlflow_home, "run-d")[0].info.status == "FAILED"


def test_iceberg_metrics_buffer_until_one_flush(lake):
    metrics = IcebergMetrics(lake, "run-e")
    metrics.start("run-e", {}, {})
    for step, loss in LOSSES:  # 3 calls x k=2 metrics
        metrics.log_metrics(step, {"loss": loss, "lr": 1e-3 * step})
    assert not lake.has_table("train.metrics")  # nothing committed per step
    metrics.flush()
    metrics.flush()  # an empty buffer commits nothing

    table = lake.table("train.metrics")
    assert len(table.snapshots()) == 1 and len(metrics.commits) == 1 and metrics.commits[0].rows == 6
    assert table.current_snapshot().summary["factory.asset-key"] == "train/metrics"
    rows = table.scan().to_arrow().to_pylist()
    assert sorted((r["step"], r["value"]) for r in rows if r["name"] == "loss") == LOSSES
    assert {r["run"] for r in rows} == {"run-e"} and all(r["created_at"].tzinfo for r in rows)


def test_record_incident_appends_one_row(lake):
    commit = record_incident(lake, "run-f", 17, "nonfinite", {"loss": "nan", "action": "skip"})
    (row,) = lake.table("train.incidents").scan().to_arrow().to_pylist()
    assert commit.rows == 1 and (row["run"], row["step"], row["kind"]) == ("run-f", 17, "nonfinite")
    assert json.loads(row["detail"]) == {"action": "skip", "loss": "nan"}


def test_neptune_offline_writes_under_home_without_network(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("Neptune offline mode must not open a connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.delenv("NEPTUNE_DATA_DIRECTORY", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)

    tracker = NeptuneTracker(tmp_path, project="factory/offline")
    tracker.start("run-g", {"model": {"d_model": 64, "layers": [1, 2]}}, {"experiment": "tiny"})
    assert "NEPTUNE_DATA_DIRECTORY" not in os.environ and os.getcwd() == str(cwd)
    for step, loss in LOSSES:
        tracker.log_metrics(step, {"loss": loss, "grad_norm": math.nan})
    tracker.log_text("card.md", "# tiny card\n")
    tracker.flush()
    tracker.finish("FINISHED")

    assert not (cwd / ".neptune").exists()
    (log,) = (tmp_path / "neptune" / "offline").glob("run__*/data-*.log")
    ops = [json.loads(line)["obj"] for line in log.read_text().splitlines()]
    logged = [(v["step"], v["value"]) for op in ops if op["path"] == ["train", "loss"] for v in op["values"]]
    assert logged == LOSSES
    assert not [op for op in ops if op["path"] == ["train", "grad_norm"]]  # NaN skipped
    assert {"type": "AssignInt", "path": ["parameters", "model", "d_model"], "value": 64} in ops
    assert any(p.read_text() == "# tiny card\n" for p in log.parent.glob("upload_path/*.md"))


def test_build_tracker_follows_config_and_environment(mlflow_home, tmp_path, lake):
    default = build_tracker(TrackerConfig(log_every=5), lake, mlflow_home, "run-h", environ={})
    assert [type(t) for t in default.trackers] == [MLflowTracker, IcebergMetrics]
    assert default.due(10) and not default.due(11)
    env = {"FACTORY_TRACKER_BACKENDS": "iceberg,neptune", "NEPTUNE_PROJECT": "lab/x", "NEPTUNE_MODE": "debug"}
    chosen = build_tracker(TrackerConfig(), lake, tmp_path, "run-h", environ=env)
    assert [type(t) for t in chosen.trackers] == [IcebergMetrics, NeptuneTracker]
    assert (chosen.trackers[1].project, chosen.trackers[1].mode) == ("lab/x", "debug")
    with pytest.raises(ValueError, match="unknown tracker backend 'wandb'"):
        build_tracker(TrackerConfig(), lake, tmp_path, "run-h", environ={"FACTORY_TRACKER_BACKENDS": "wandb"})


def test_matmul_peak_is_measured_once_and_mfu_divides(monkeypatch):
    peak = perf.measure_matmul_peak(size=256, repeats=4)
    with monkeypatch.context() as m:  # cached, not re-measured: no new matrices, no matmul timed
        m.setattr(perf.torch, "randn", lambda *a, **k: pytest.fail("measure_matmul_peak measured again"))
        assert perf.measure_matmul_peak(size=256, repeats=4) == peak
    assert peak > 1e8
    assert perf.mfu(tokens_per_s=1_000, flops_per_token=6e6, peak=1.2e10) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        perf.mfu(1.0, 1.0, 0.0)


def test_loss_curve_png_and_markdown():
    png = loss_curve_png([(3, 3.2), (1, 4.0), (2, math.nan)], "tiny")
    assert png.startswith(PNG_SIGNATURE) and len(png) < 100_000
    assert loss_curve_png([], "empty").startswith(PNG_SIGNATURE)
    markdown = png_markdown(png)
    assert markdown.startswith("![loss curve](data:image/png;base64,") and markdown.endswith(")")
    assert base64.b64decode(markdown.split(",", 1)[1][:-1]) == png


def test_tracker_resource_env_with_no_environment_set(monkeypatch):
    for name in ("FACTORY_TRACKER_BACKENDS", "FACTORY_MLFLOW_TRACKING_URI", "NEPTUNE_API_TOKEN",
                 "NEPTUNE_PROJECT", "NEPTUNE_MODE", "TEST_NEPTUNE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    from dagster import EnvVar, build_resources

    from resources.tracker import TrackerResource

    assert TrackerResource().env() == {"FACTORY_TRACKER_BACKENDS": "mlflow,iceberg"}
    monkeypatch.setenv("TEST_NEPTUNE_TOKEN", "t0k3n")
    resource = TrackerResource(backends=["mlflow", "neptune"], neptune_api_token=EnvVar("TEST_NEPTUNE_TOKEN"))
    with build_resources({"tracker": resource}) as resources:
        assert resources.tracker.env() == {
            "FACTORY_TRACKER_BACKENDS": "mlflow,neptune", "NEPTUNE_PROJECT": "factory/offline",
            "NEPTUNE_MODE": "offline", "NEPTUNE_API_TOKEN": "t0k3n",
        }
    with pytest.raises(Exception, match="unknown tracker backends"):
        TrackerResource(backends=["wandb"])
