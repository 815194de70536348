"""`neptune`: a Neptune run, offline by default: JSON-lines operation logs under
`$FACTORY_HOME/neptune`, uploadable later with `neptune sync` (the hosted service closed; a
self-hosted server works in `async` mode).

Non-finite values are dropped: Neptune refuses them (warns and skips). `neptune` itself (~3 s to
import) is imported only when a run starts.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from factory import settings
from factory.train.config import TrackerConfig
from factory.train.trackers.base import Tracker, check_status, finite, plain


def build(config: TrackerConfig, *, home: Path, env: Mapping[str, str], **_) -> "NeptuneTracker":
    """The backend as `build_tracker` makes it, configured by Neptune's own variables
    (`NEPTUNE_PROJECT`, `NEPTUNE_MODE`, `NEPTUNE_API_TOKEN`, so its CLI agrees)."""
    return NeptuneTracker(home, env.get(settings.NEPTUNE_PROJECT) or config.neptune_project,
                          env.get(settings.NEPTUNE_MODE) or "offline",
                          api_token=env.get(settings.NEPTUNE_TOKEN) or None)


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
        self.neptune_run["parameters"] = stringify_unsupported({k: plain(v) for k, v in params.items()})

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in finite(metrics).items():
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
        self.neptune_run["factory/status"] = check_status(status)
        if status != "FINISHED":
            self.neptune_run["sys/failed"] = True
        self.neptune_run.stop()
