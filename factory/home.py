"""Where the factory keeps its state on disk.

`FACTORY_HOME` (default: `.factory` in the checkout) holds the Iceberg catalog and warehouse, the
Dagster instance, MLflow's store and content-addressed artifacts. It is resolved when a function
asks for it, never at import time, so `definitions.py` loads with no environment set and a test
can point everything at a `tmp_path`.
"""

from __future__ import annotations

import os
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent


def factory_home(explicit: str | os.PathLike | None = None) -> Path:
    """The factory's state directory: `explicit`, else `$FACTORY_HOME`, else `<checkout>/.factory`."""
    from factory import settings

    raw = explicit or settings.home() or CHECKOUT / ".factory"
    return Path(raw).expanduser().resolve()


def lake_dir(home: Path) -> Path:
    return home / "lake"


def artifacts_dir(home: Path) -> Path:
    return home / "artifacts"


def run_dir(home: Path, run: str) -> Path:
    """Everything of one training run: `checkpoints/` and its `card.md`."""
    return artifacts_dir(home) / "runs" / run


def dagster_home(home: Path) -> Path:
    return home / "dagster"


def uri_to_path(uri: str) -> Path:
    """The local path of a `file://` URI (percent-decoded: `Path.as_uri()` encodes `@` and spaces),
    or `uri` itself when it is a plain path."""
    from urllib.parse import unquote, urlparse

    return Path(unquote(urlparse(uri).path)) if uri.startswith("file://") else Path(uri)
