"""`mlflow`: an MLflow run per factory run, on a sqlite store under `$FACTORY_HOME/mlflow` by
default (an MLflow server at scale).

It uses `MlflowClient` with explicit run ids, never the fluent global "active run", so several
runs in one process do not collide. Non-finite values are dropped: MLflow stores NaN but clamps
+-Inf to +-1.8e308, which wrecks every plot's axis (`train.metrics` keeps them, see `iceberg`).
`mlflow` itself (~2 s to import) is imported only when this backend is built.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

from factory import settings
from factory.train.config import TrackerConfig
from factory.train.trackers.base import Tracker, check_status, chunks, finite, flatten_params

log = logging.getLogger(__name__)

RUN_TAG = "factory.run"  # MLflow tag naming the factory run; how a restarted run finds its MLflow run


def build(config: TrackerConfig, *, home: Path, env: Mapping[str, str], experiment: str, **_) -> "MLflowTracker":
    """The backend as `build_tracker` makes it: `FACTORY_MLFLOW_TRACKING_URI` names a server."""
    return MLflowTracker(home, env.get(settings.MLFLOW_URI) or None, experiment=experiment)


class MLflowTracker(Tracker):
    """An MLflow run per factory run, through `MlflowClient` (no global active run).

    The embedded default is `sqlite:///<home>/mlflow/mlflow.db` with artifacts in
    `<home>/mlflow/artifacts`, set on the experiment when it is created (otherwise MLflow would put
    them in `./mlruns` of whatever the working directory is). Against an MLflow server
    (`tracking_uri="http://..."`) the server decides where artifacts go unless
    `artifact_location` says otherwise.

    Resuming: `start` looks for a run of the experiment tagged `factory.run=<run>` whose status
    is not FINISHED (RUNNING after a kill, FAILED, KILLED) and reopens the latest one, so a
    restarted training run continues one metric history. A FINISHED run is a closed record: a
    new launch under the same name gets a new MLflow run (same tag). Params already logged with
    the same value are skipped; MLflow forbids changing one, so a changed value is kept as logged
    and a warning names it.
    """

    def __init__(self, home: Path, tracking_uri: str | None = None, *, experiment: str = "factory",
                 artifact_location: str | None = None):
        from mlflow import MlflowClient  # ~2 s import: only when this backend is chosen

        mlflow_dir = Path(home) / "mlflow"
        if tracking_uri is None:
            mlflow_dir.mkdir(parents=True, exist_ok=True)
            tracking_uri = f"sqlite:///{mlflow_dir / 'mlflow.db'}"
        if artifact_location is None and not tracking_uri.startswith(("http://", "https://", "databricks")):
            artifact_location = (mlflow_dir / "artifacts").as_uri()
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.artifact_location = artifact_location
        self.run_id: str | None = None

    def _experiment_id(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        return self.client.create_experiment(self.experiment, artifact_location=self.artifact_location)

    def _resumable(self, experiment_id: str, run: str) -> str | None:
        # tag values are quoted SQL-style in MLflow's search grammar
        quoted = run.replace("'", "\\'")
        runs = self.client.search_runs(
            [experiment_id], f"tags.`{RUN_TAG}` = '{quoted}' and attributes.status != 'FINISHED'",
            order_by=["attributes.start_time DESC"], max_results=1,
        )
        return runs[0].info.run_id if runs else None

    def start(self, run: str, params: dict, tags: dict) -> None:
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        experiment_id = self._experiment_id()
        run_tags = {**{str(k): str(v) for k, v in tags.items()}, RUN_TAG: run}
        self.run_id = self._resumable(experiment_id, run)
        if self.run_id is None:
            self.run_id = self.client.create_run(experiment_id, run_name=run, tags=run_tags).info.run_id
            logged: dict[str, str] = {}
        else:
            self.client.update_run(self.run_id, status="RUNNING")
            for key, value in run_tags.items():
                self.client.set_tag(self.run_id, key, value)
            logged = self.client.get_run(self.run_id).data.params
        fresh = []
        for key, value in flatten_params(params).items():
            value = value[:MAX_PARAM_VAL_LENGTH]  # MLflow's limit (6000 in 3.x, 500 before 2.x)
            if key not in logged:
                fresh.append(Param(key, value))
            elif logged[key] != value:
                log.warning("mlflow run %s: param %s was %r, now %r; MLflow keeps the first value",
                            run, key, logged[key], value)
        for batch in chunks(fresh, MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=batch)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH

        now = int(time.time() * 1000)
        rows = [Metric(name, value, now, int(step)) for name, value in finite(metrics).items()]
        for batch in chunks(rows, MAX_METRICS_PER_BATCH):
            self.client.log_batch(self._run(), metrics=batch)

    def log_text(self, name: str, text: str) -> None:
        self.client.log_text(self._run(), text, name)

    def log_artifact(self, path: str) -> None:
        if Path(path).is_dir():
            self.client.log_artifacts(self._run(), str(path), Path(path).name)
        else:
            self.client.log_artifact(self._run(), str(path))

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self._run(), check_status(status))

    def _run(self) -> str:
        if self.run_id is None:
            raise RuntimeError("MLflowTracker: call start() first")
        return self.run_id
