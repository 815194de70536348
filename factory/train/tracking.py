"""Experiment tracking: one `Tracker` interface, several backends, fanned out by `MultiTracker`.

Backends (chosen by `TrackerConfig.backends`, or `FACTORY_TRACKER_BACKENDS` from the tracker
resource):

- `mlflow` — `MLflowTracker`, a sqlite store under `$FACTORY_HOME/mlflow` by default (an MLflow
  server at scale). It uses `MlflowClient` with explicit run ids, never the fluent global "active
  run", so several runs in one process do not collide.
- `neptune` — `NeptuneTracker`, offline by default: JSON-lines operation logs under
  `$FACTORY_HOME/neptune`, uploadable later with `neptune sync` (the hosted service closed; a
  self-hosted server works in `async` mode).
- `iceberg` — `IcebergMetrics`, rows in `train.metrics` so loss curves join with lineage in SQL.
  Rows are buffered and committed by `flush()` in ONE append: a snapshot per step would bury the
  table in metadata.

Non-finite values (NaN, ±Inf) are dropped by the MLflow and Neptune backends and kept by Iceberg.
Neptune refuses them (warns and skips); MLflow stores NaN but clamps ±Inf to ±1.8e308, which wrecks
every plot's axis. A double column holds NaN and Inf faithfully, so `train.metrics` is the record of
what the run really saw (with `train.incidents` saying what the guards did about it).

Nothing here reads the environment at import time; `build_tracker` reads it when asked (the one
place the trainer's tracking environment is interpreted; `resources/tracker.py` writes it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import pyarrow as pa

from factory.lake import CommitStamp, Lake, TableCommit
from factory.lake.schemas import TRAIN_INCIDENTS, TRAIN_METRICS
from factory.train.config import TrackerConfig
from factory import settings

log = logging.getLogger(__name__)

STATUSES = ("FINISHED", "FAILED", "KILLED")
RUN_TAG = "factory.run"  # MLflow tag naming the factory run; how a restarted run finds its MLflow run
METRICS_TABLE = "train.metrics"
INCIDENTS_TABLE = "train.incidents"

# The environment of a training process; written by resources/tracker.py, read by build_tracker.
ENV_BACKENDS = settings.TRACKER_BACKENDS  # comma-separated, overrides TrackerConfig.backends
ENV_MLFLOW_URI = settings.MLFLOW_URI
ENV_NEPTUNE_PROJECT = settings.NEPTUNE_PROJECT  # Neptune's own names, so its CLI (`neptune sync`) agrees
ENV_NEPTUNE_MODE = settings.NEPTUNE_MODE
ENV_NEPTUNE_TOKEN = settings.NEPTUNE_TOKEN


class Tracker:
    """Where a run's parameters, metrics, texts and files go. Subclasses implement what they store;
    the rest is a no-op. Usable as a context manager: `finish` gets FINISHED, KILLED (Ctrl-C /
    SystemExit) or FAILED (any other exception)."""

    def start(self, run: str, params: dict, tags: dict) -> None:
        raise NotImplementedError

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def log_text(self, name: str, text: str) -> None:
        """Store `text` as a file called `name` (e.g. the experiment's Markdown card)."""

    def log_artifact(self, path: str) -> None:
        """Store the file or directory at `path`."""

    def flush(self) -> None:
        """Make everything logged so far durable."""

    def finish(self, status: str = "FINISHED") -> None:
        raise NotImplementedError

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish("FINISHED")
        else:
            self.finish("KILLED" if issubclass(exc_type, (KeyboardInterrupt, SystemExit)) else "FAILED")


def _check_status(status: str) -> str:
    if status not in STATUSES:
        raise ValueError(f"tracker status {status!r} is not one of {STATUSES}")
    return status


def _plain(value: Any) -> Any:
    """Pydantic models (configs) as JSON-able dicts; everything else unchanged."""
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested params as `model.d_model`-style keys with string values (JSON for non-strings, so
    `True` reads `true`, `None` reads `null` and lists keep their brackets)."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        value = _plain(value)
        if isinstance(value, Mapping) and value:
            flat.update(flatten_params(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value, default=str)
    return flat


def _finite(metrics: Mapping[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if math.isfinite(v)}


def _chunks(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


# -- MLflow --------------------------------------------------------------------------------------
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
        for batch in _chunks(fresh, MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=batch)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH

        now = int(time.time() * 1000)
        rows = [Metric(name, value, now, int(step)) for name, value in _finite(metrics).items()]
        for batch in _chunks(rows, MAX_METRICS_PER_BATCH):
            self.client.log_batch(self._run(), metrics=batch)

    def log_text(self, name: str, text: str) -> None:
        self.client.log_text(self._run(), text, name)

    def log_artifact(self, path: str) -> None:
        if Path(path).is_dir():
            self.client.log_artifacts(self._run(), str(path), Path(path).name)
        else:
            self.client.log_artifact(self._run(), str(path))

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self._run(), _check_status(status))

    def _run(self) -> str:
        if self.run_id is None:
            raise RuntimeError("MLflowTracker: call start() first")
        return self.run_id


# -- Neptune -------------------------------------------------------------------------------------
@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    """Set environment variables for the duration of a block, then restore them."""
    before = {k: settings.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


class NeptuneTracker(Tracker):
    """A Neptune run, offline by default, with its files under `<home>/neptune`.

    neptune 1.14 has no data-directory argument: it reads `NEPTUNE_DATA_DIRECTORY` (default
    `.neptune` relative to the working directory) once, when `init_run` builds the run's operation
    processor. The variable is set (absolute) only around that call and restored afterwards, so the
    process's cwd and environment stay as they were. Offline runs land in
    `<home>/neptune/offline/run__<id>__<pid>__<key>/data-1.log` (JSON lines); `neptune sync
    --path <home>/neptune` uploads them to a server. The factory run name is the `custom_run_id`,
    so a synced restart continues the same server-side run.

    Captured stdout/stderr, hardware metrics, source files and git info are off: the trainer logs
    what it means to, and the code version is a tag. `log_artifact` in offline mode records the
    file's path (Neptune reads it at sync time), while `log_text` stores a copy.
    """

    def __init__(self, home: Path, project: str, mode: str = "offline", *, api_token: str | None = None):
        self.data_dir = (Path(home) / "neptune").resolve()
        self.project = project
        self.mode = mode
        self.api_token = api_token
        self.neptune_run: Any = None

    def start(self, run: str, params: dict, tags: dict) -> None:
        import neptune  # ~3 s import: only when this backend is chosen
        from neptune.utils import stringify_unsupported

        self.data_dir.mkdir(parents=True, exist_ok=True)
        with _env(NEPTUNE_DATA_DIRECTORY=str(self.data_dir)):
            self.neptune_run = neptune.init_run(
                project=self.project, mode=self.mode, api_token=self.api_token, name=run,
                custom_run_id=run[:128], capture_stdout=False, capture_stderr=False,
                capture_hardware_metrics=False, source_files=[], git_ref=False,
            )
        self.neptune_run["factory/run"] = run
        self.neptune_run["factory/tags"] = {str(k): str(v) for k, v in tags.items()}
        self.neptune_run["parameters"] = stringify_unsupported({k: _plain(v) for k, v in params.items()})

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in _finite(metrics).items():
            self.neptune_run[f"train/{name}"].append(value, step=step)

    def log_text(self, name: str, text: str) -> None:
        from neptune.types import File

        stem, _, ext = name.rpartition(".")
        self.neptune_run[f"texts/{stem or ext}"].upload(File.from_content(text, extension=ext if stem else "txt"))

    def log_artifact(self, path: str) -> None:
        field = f"artifacts/{Path(path).name.replace('.', '_')}"
        if Path(path).is_dir():
            self.neptune_run[field].upload_files(str(Path(path) / "**"))
        else:
            self.neptune_run[field].upload(str(path))

    def flush(self) -> None:
        self.neptune_run.wait()

    def finish(self, status: str = "FINISHED") -> None:
        self.neptune_run["factory/status"] = _check_status(status)
        if status != "FINISHED":
            self.neptune_run["sys/failed"] = True
        self.neptune_run.stop()


# -- Iceberg -------------------------------------------------------------------------------------
def _stamp(table: str, lake: Lake | None = None, upstream: Sequence[str] = (), **fields: str) -> CommitStamp:
    """The stamp of a `train.*` commit: the table snapshots behind the run's `upstream` versions
    (its mix version and tokenizer, or its newest checkpoint) when a lake can resolve them."""
    ids = [u for u in upstream if u]
    snapshots = lake.lineage.upstream_snapshots(ids) if lake is not None and ids else {}
    return CommitStamp(**{"asset_key": table.replace(".", "/"), "config_hash": "", **fields}, upstream=snapshots)


def _run_upstream(lake: Lake, run: str) -> list[str]:
    """The versions a run's state comes from, by its newest checkpoint row: that checkpoint, then
    what it was trained from (mix version, tokenizer); [] before the run's first checkpoint."""
    newest = lake.lineage.records(kind="checkpoint", name=f"run/{run}")[-1:]
    return [newest[0].version_id, *newest[0].upstream] if newest else []


class IcebergMetrics(Tracker):
    """Metric rows for `train.metrics`, buffered in memory and committed by `flush()` as one append.

    The trainer flushes when it checkpoints (and `finish` flushes, whatever the status, so a failed
    run keeps its curve up to the failure). `max_rows` is a safety net for runs that never
    checkpoint: a full buffer flushes itself. Non-finite values are kept (see the module docstring).
    """

    def __init__(self, lake: Lake, run: str, *, stamp: CommitStamp | None = None, max_rows: int = 100_000):
        self.lake = lake
        self.run = run
        self.given_stamp = stamp
        self.stamp = stamp or _stamp(METRICS_TABLE)
        self.max_rows = max_rows
        self.rows: list[dict] = []
        self.commits: list[TableCommit] = []

    def start(self, run: str, params: dict, tags: dict) -> None:
        self.run = run
        if self.given_stamp is None:  # the trainer's params are its plan: the mix version and tokenizer it reads
            self.stamp = _stamp(METRICS_TABLE, self.lake, [tags.get("mix") or params.get("mix_version", ""),
                                                           params.get("tokenizer", "")],
                                config_hash=str(params.get("config_hash", "")), run_id=str(tags.get("run_id", "")))

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        now = datetime.now(timezone.utc)
        self.rows += [{"run": self.run, "step": int(step), "name": name, "value": float(value), "created_at": now}
                      for name, value in metrics.items()]
        if len(self.rows) >= self.max_rows:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        data = pa.Table.from_pylist(self.rows, schema=TRAIN_METRICS.as_arrow())
        self.commits.append(self.lake.commit(METRICS_TABLE, data, self.stamp, schema=TRAIN_METRICS))
        self.rows = []

    def finish(self, status: str = "FINISHED") -> None:
        _check_status(status)
        self.flush()


def record_incident(lake: Lake, run: str, step: int, kind: str, detail: dict,
                    *, stamp: CommitStamp | None = None) -> TableCommit:
    """Append one row to `train.incidents` (replica_mismatch, nonfinite, spike, rollback, ...);
    `detail` is stored as sorted-key JSON."""
    row = {"run": run, "step": int(step), "kind": kind, "detail": json.dumps(detail, sort_keys=True, default=str),
           "created_at": datetime.now(timezone.utc)}
    data = pa.Table.from_pylist([row], schema=TRAIN_INCIDENTS.as_arrow())
    stamp = stamp or _stamp(INCIDENTS_TABLE, lake, _run_upstream(lake, run))
    return lake.commit(INCIDENTS_TABLE, data, stamp, schema=TRAIN_INCIDENTS)


# -- fan-out -------------------------------------------------------------------------------------
class MultiTracker(Tracker):
    """Sends every call to each tracker in order. `flush` and `finish` reach every tracker even
    when one fails (a broken MLflow store must not lose the Iceberg rows), then raise the first
    error. `due(step)` says whether `step` is one the config wants logged (`log_every`)."""

    def __init__(self, trackers: Sequence[Tracker], *, log_every: int = 1):
        self.trackers = list(trackers)
        self.log_every = log_every

    def due(self, step: int) -> bool:
        return step % self.log_every == 0

    def start(self, run: str, params: dict, tags: dict) -> None:
        for tracker in self.trackers:
            tracker.start(run, params, tags)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for tracker in self.trackers:
            tracker.log_metrics(step, metrics)

    def log_text(self, name: str, text: str) -> None:
        for tracker in self.trackers:
            tracker.log_text(name, text)

    def log_artifact(self, path: str) -> None:
        for tracker in self.trackers:
            tracker.log_artifact(path)

    def flush(self) -> None:
        self._each(lambda t: t.flush())

    def finish(self, status: str = "FINISHED") -> None:
        _check_status(status)
        self._each(lambda t: t.finish(status))

    def _each(self, call) -> None:
        errors = []
        for tracker in self.trackers:
            try:
                call(tracker)
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the others ran
                log.error("%s failed: %s", type(tracker).__name__, exc)
                errors.append(exc)
        if errors:
            raise errors[0]


def build_tracker(config: TrackerConfig, lake: Lake | None, home: Path, run: str, *,
                  experiment: str = "factory", environ: Mapping[str, str] | None = None) -> MultiTracker:
    """The trackers `config` asks for, with the training environment's overrides (`environ`,
    default `os.environ` at call time): `FACTORY_TRACKER_BACKENDS` replaces the backend list,
    `FACTORY_MLFLOW_TRACKING_URI` points MLflow at a server, `NEPTUNE_PROJECT` / `NEPTUNE_MODE` /
    `NEPTUNE_API_TOKEN` configure Neptune. Call `start` on the result to open the runs."""
    env = settings.environment() if environ is None else environ
    backends = [b.strip() for b in env.get(ENV_BACKENDS, "").split(",") if b.strip()] or list(config.backends)
    trackers: list[Tracker] = []
    for backend in backends:
        if backend == "mlflow":
            trackers.append(MLflowTracker(home, env.get(ENV_MLFLOW_URI) or None, experiment=experiment))
        elif backend == "neptune":
            trackers.append(NeptuneTracker(home, env.get(ENV_NEPTUNE_PROJECT) or config.neptune_project,
                                           env.get(ENV_NEPTUNE_MODE) or "offline",
                                           api_token=env.get(ENV_NEPTUNE_TOKEN) or None))
        elif backend == "iceberg":
            if lake is None:
                raise ValueError("tracker backend 'iceberg' needs a lake")
            trackers.append(IcebergMetrics(lake, run))
        else:
            raise ValueError(f"unknown tracker backend {backend!r} (expected mlflow, neptune or iceberg)")
    return MultiTracker(trackers, log_every=config.log_every)
