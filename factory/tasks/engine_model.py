"""The task engine's vocabulary: its config, what a consumer asks for, and what an attempt came to.

`EngineConfig` says where the engine runs (a local Ray instance, or a cluster's address), how many
attempts run at once, how long one may run (its lease) and how often it is served again.
`AttemptRequest` is one (task, candidate) a consumer wants scored; `AttemptResult` is the row the
engine writes to `tasks.attempts` for it.

Why a key: at-least-once delivery means a task can run more than once (a worker killed mid-attempt,
a lease that expired) and several consumers can ask for the same (task, candidate). Everything is
keyed by `attempt_key(task_id, candidate)`, so however many times it ran or was asked for, one row
holds its result. The key hashes task id, a NUL and the candidate: plain concatenation would give
("ab", "c") and ("a", "bc") the same key.

This module imports nothing heavy (no Ray, no Iceberg): Ray workers unpickle these records.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Outcomes the engine itself gives (the work's own outcomes, e.g. passed / failed, pass through).
TIMEOUT = "timeout"  # every try ran past its lease and was cancelled
CRASHED = "crashed"  # the worker process died on every try (Ray's retries ran out)
ERROR = "error"  # the work function raised: its bug or a bad request, not retried


def attempt_key(task_id: str, candidate: str) -> str:
    """sha256 (64 hex) of the task id, a NUL and the candidate: the identity of one attempt."""
    return hashlib.sha256(task_id.encode() + b"\0" + candidate.encode()).hexdigest()


def candidate_hash(candidate: str) -> str:
    return hashlib.sha256(candidate.encode()).hexdigest()


class EngineConfig(BaseModel):
    """Where and how the task engine runs attempts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str | None = Field(
        None, description="Ray cluster to join ('ray://host:10001' through Ray Client, 'host:6379', 'auto'); "
        "None starts a local instance on 127.0.0.1 for the engine's lifetime.")
    workers: int = Field(2, gt=0, description="Attempts running at once (count); also the CPUs a local instance gets.")
    lease_s: float = Field(60.0, gt=0, description="Time one try may run from its start in a worker (seconds); "
                           "a try still running then is cancelled and the attempt served again.")
    max_retries: int = Field(2, ge=0, le=10, description="Times an attempt is served again after a killed worker "
                             "or an expired lease (count); it starts at most max_retries + 1 times.")
    priority_order: Literal["higher_first", "lower_first"] = Field(
        "higher_first", description="Which requests start first when more are waiting than workers are free.")
    table: str = Field("tasks.attempts", pattern=r"^[A-Za-z_]\w*\.[A-Za-z_]\w*$",
                       description="Iceberg table (namespace.name) the results are written to.")
    object_store_mb: int = Field(200, ge=80,
                                 description="Object store of a local instance (MiB); Ray's minimum is ~75.")
    attempt_cpus: float = Field(1.0, gt=0, description="CPUs Ray reserves for one try (count, may be fractional).")
    batch_rows: int = Field(256, gt=0, description="Results that, once waiting, are committed at once (rows).")
    flush_s: float = Field(2.0, gt=0, description="Longest a finished result waits for its commit (seconds).")
    tick_s: float = Field(0.05, gt=0,
                          description="How often the dispatcher looks at leases and new requests (seconds).")


class AttemptRequest(BaseModel):
    """One candidate for one task that a consumer wants scored."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str = Field(min_length=1, description="Id of the task (its content hash in tasks.<kind>).")
    candidate: str = Field(description="The candidate: a function body or a unified diff (text).")
    consumer: str = Field("", description="Who asks (e.g. 'eval/repo_tasks', 'rl/run-3'); recorded on the row.")
    priority: int = Field(0, description="Urgency (higher starts first under the default order).")

    @property
    def key(self) -> str:
        return attempt_key(self.task_id, self.candidate)


class AttemptResult(BaseModel):
    """What one attempt came to: the `tasks.attempts` row of its key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    attempt_key: str = Field(description="attempt_key(task_id, candidate).")
    task_id: str
    candidate_hash: str = Field(description="sha256 of the candidate (64 hex).")
    consumers: tuple[str, ...] = Field(description="Consumers that had asked for the key when the row was written.")
    priority: int = Field(description="The most urgent priority the key was asked at.")
    outcome: str = Field(description="The work's outcome (passed, failed, ...), or timeout / crashed / error.")
    reward: float = Field(description="The work's reward; 0.0 for timeout / crashed / error.")
    tries: int = Field(description="Times the attempt started in a worker (count), retries included.")
    duration_s: float = Field(description="Wall time of the last try inside its worker (seconds).")
    worker: str = Field(description="'<node id prefix>/<pid>' of the last try ('' when none started).")
    pid: int | None = Field(None, description="Process id of the worker of the last try.")
    error: str = Field("", description="Why it failed (the exception, the expired lease); '' when the work returned.")
    detail: str = Field("{}", description="JSON of the work's own fields besides outcome and reward.")
    engine_run: str = Field(description="Id of the engine instance that wrote the row.")
    created_at: dt.datetime = Field(description="When the row was built (UTC).")
    cached: bool = Field(False, description="True when the row was already in the table before this request.")

    def row(self) -> dict:
        """The row as `tasks.attempts` stores it."""
        row = self.model_dump(exclude={"cached"})
        row["consumers"] = list(self.consumers)
        return row

    @classmethod
    def from_row(cls, row: dict, *, cached: bool) -> "AttemptResult":
        return cls(**{**row, "consumers": tuple(row["consumers"])}, cached=cached)


def normalize(value) -> tuple[str, float, str]:
    """(outcome, reward, detail JSON) of what a work function returned: a mapping or an object
    (a pydantic model, a dataclass) with `outcome` and `reward`; an enum outcome gives its value."""
    if isinstance(value, BaseModel):
        fields = value.model_dump(mode="json")
    elif isinstance(value, dict):
        fields = dict(value)
    elif hasattr(value, "__dict__"):
        fields = dict(vars(value))
    else:
        raise TypeError(f"work returned {type(value).__name__}: give a mapping or object with outcome and reward")
    if "outcome" not in fields or "reward" not in fields:
        raise TypeError(f"work returned {sorted(fields)}: both 'outcome' and 'reward' are needed")
    outcome, reward = fields.pop("outcome"), float(fields.pop("reward"))
    outcome = getattr(outcome, "value", outcome)
    return str(outcome), reward, json.dumps(fields, sort_keys=True, default=str)
