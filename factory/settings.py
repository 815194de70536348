"""The one place the factory reads its settings from the environment.

Every environment variable the factory honours is named here, read when a function asks (never at
import time, so `definitions.py` loads with no environment set and a test can change a variable
between two calls), and documented in one table. Other modules call these functions instead of
`os.environ`; a test enforces it. Variables owned by other programs (torchrun's `RANK` /
`WORLD_SIZE`, a scheduler's node index, Neptune's own names) are read here too when the factory
needs them, so one grep finds everything a deployment can set.

| variable | meaning |
|---|---|
| `FACTORY_HOME` | state directory (default `.factory` in the checkout) |
| `FACTORY_DEPLOY` | deployment profile: a name in `configs/deploy`, or a `.yaml`/`.json` file (default `embedded`) |
| `FACTORY_DEPLOY_JSON` | a resolved profile as JSON: how the factory hands its profile to processes it starts |
| `FACTORY_EXPERIMENTS_DIR` | where the experiment sensor reads experiment files |
| `FACTORY_CODE_VERSION` | code version to stamp instead of the git SHA (images without `.git`) |
| `FACTORY_FAULTS` | JSON fault injections for tests (`{"kill_at_step": 5}`; keys in `factory.faults`) |
| `FACTORY_TRACKER_BACKENDS`, `FACTORY_MLFLOW_TRACKING_URI` | a training process's tracker overrides |
| `NEPTUNE_PROJECT`, `NEPTUNE_MODE`, `NEPTUNE_API_TOKEN` | Neptune's own settings |
| `FACTORY_METRICS` | `1`: export factory-health metrics to Prometheus (`factory.health`); unset or `0`: off |
| `PROMETHEUS_MULTIPROC_DIR` | prometheus_client's multiprocess directory (default `FACTORY_HOME/metrics/prom` when metrics are on) |
| `DAGSTER_HOME` | Dagster's instance (Dagster reads it; the run-queue exporter `make ui` starts polls it) |
| `FACTORY_REGISTRY` | package index the environment builder resolves against (a `file://…/simple` mirror, or a URL); unset: pip's configured index |
| `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`, `RAY_USAGE_STATS_ENABLED` | Ray's own switches, set by the task engine while a local instance starts (loopback only, no usage reports) |
| `KUBECONFIG` | the kubeconfig `factory deploy check` reaches a cluster's API with (outside a pod) |
| `RANK`, `WORLD_SIZE`, `LOCAL_RANK` | set by torchrun for each training process |
| `NODE_RANK`, `JOB_COMPLETION_INDEX`, `SLURM_NODEID` | a multi-node scheduler's index of this node |
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping

HOME = "FACTORY_HOME"
DEPLOY = "FACTORY_DEPLOY"
DEPLOY_JSON = "FACTORY_DEPLOY_JSON"
EXPERIMENTS_DIR = "FACTORY_EXPERIMENTS_DIR"
CODE_VERSION = "FACTORY_CODE_VERSION"
FAULTS = "FACTORY_FAULTS"
TRACKER_BACKENDS = "FACTORY_TRACKER_BACKENDS"
MLFLOW_URI = "FACTORY_MLFLOW_TRACKING_URI"
NEPTUNE_PROJECT = "NEPTUNE_PROJECT"
NEPTUNE_MODE = "NEPTUNE_MODE"
NEPTUNE_TOKEN = "NEPTUNE_API_TOKEN"
METRICS = "FACTORY_METRICS"
PROMETHEUS_DIR = "PROMETHEUS_MULTIPROC_DIR"
KUBECONFIG = "KUBECONFIG"
REGISTRY = "FACTORY_REGISTRY"
# the variables cluster schedulers set to say which node this is, in the order they are tried
NODE_RANK_VARIABLES = ("NODE_RANK", "JOB_COMPLETION_INDEX", "SLURM_NODEID")


def get(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable `name`, or None when it is unset or empty."""
    value = (os.environ if environ is None else environ).get(name)
    return value or None


def environment() -> dict[str, str]:
    """A copy of this process's environment, for a child process that should inherit it."""
    return dict(os.environ)


@contextlib.contextmanager
def temporarily(name: str, value: str):
    """Set `name` for this process and its children within the block, then restore it (Ray reads its
    own switches from the environment of the processes it spawns: factory.tasks.engine_ray)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def export(values: Mapping[str, str]) -> None:
    """Set variables for the processes this one starts from now on (a CLI's `--deploy` is handed
    down this way to jobs/queue_runs.py and the runs it queues)."""
    os.environ.update(values)


def home() -> str | None:
    return get(HOME)


def deploy_name() -> str | None:
    return get(DEPLOY)


def deploy_json() -> str | None:
    return get(DEPLOY_JSON)


def experiments_dir() -> str | None:
    return get(EXPERIMENTS_DIR)


def metrics_on() -> bool:
    """Whether factory-health metrics are on (`factory.health.enabled` is the one caller)."""
    return (get(METRICS) or "0").lower() not in ("0", "off", "false", "no")


def prometheus_dir() -> str | None:
    return get(PROMETHEUS_DIR)


def registry() -> str | None:
    """The package index repository builds resolve against, or None for pip's configured one."""
    return get(REGISTRY) or None


def kubeconfig() -> str | None:
    return get(KUBECONFIG)


def code_version_override() -> str | None:
    return get(CODE_VERSION)


def faults():
    """The fault injections a test asked for (`factory.faults.Faults`); inert when none are set.
    Only entry points call this and hand the result down (see `factory.faults`)."""
    from pydantic import ValidationError

    from factory.faults import NO_FAULTS, Faults
    from factory.overrides import validation_message

    raw = get(FAULTS)
    if raw is None:
        return NO_FAULTS
    try:
        return Faults.model_validate(json.loads(raw))
    except json.JSONDecodeError as e:
        raise ValueError(f"{FAULTS} is not JSON ({e}): {raw!r}") from None
    except ValidationError as e:
        raise ValueError(f"{FAULTS}={raw}: {validation_message(e)}") from None


def secret(name: str) -> str | None:
    """A credential from the variable `name` (profiles name the variable, never the value)."""
    return get(name)


def distributed() -> tuple[int, int, int]:
    """(rank, world size, local rank) as torchrun set them; (0, 1, 0) without torchrun."""
    return int(get("RANK") or 0), int(get("WORLD_SIZE") or 1), int(get("LOCAL_RANK") or 0)


def scheduler_node_rank() -> int | None:
    """This node's index as a cluster scheduler set it (Kubernetes indexed jobs, Slurm), if any."""
    for name in NODE_RANK_VARIABLES:
        if (value := get(name)) is not None:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"{name}={value!r} is not a node index") from None
    return None
