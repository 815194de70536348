"""`tasks.attempts`: the task engine's results, one row per attempt key, written once.

Design: the engine commits finished results in batches, each batch one atomic Iceberg snapshot
with its lineage row (`Lake.commit`). The commit is a read-check-write (`Lake.commit` with a
function of the freshly loaded table): it reads which of the batch's keys the table already holds
and appends only the others, and it lands only if nobody committed since that read, retrying
otherwise. So two engines (two driver processes, two clusters) that ran the same key write it once,
and a re-run of a whole batch writes nothing.

Why look keys up before running as well (`recorded`): a key already in the table has its result;
serving it again would only spend a sandbox run on a row that would then be skipped.

Final rows and failures: a row whose work returned its own verdict (`error` empty: passed, failed,
a candidate's timeout in the sandbox...) is final, one per key, reused forever. A row the engine
wrote because the work never returned (every lease expired, the worker died on every retry, the
work function raised: `error` says which) is kept as history but is not final: the next request
for its key runs it again, and the table then holds the failure rows and one final row. So a
passing fault (a machine under load, a missing environment since rebuilt) is not frozen into the
results.
"""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.expressions import In

from factory.lake import CommitStamp, Lake
from factory.lake.lineage import snapshot_record
from factory.lake.schemas import TASK_ATTEMPTS
from factory.tasks.engine_model import AttemptResult, EngineConfig
from factory.version import config_hash

LOOKUP_CHUNK = 2000  # keys per In(...) filter: one predicate per key is evaluated against every file


def recorded(lake: Lake, table: str, keys: list[str]) -> dict[str, AttemptResult]:
    """The rows of `table` for those of `keys` it holds (none when the table does not exist yet)."""
    if not keys or not lake.has_table(table):
        return {}
    found: dict[str, AttemptResult] = {}
    handle = lake.table(table)
    for i in range(0, len(keys), LOOKUP_CHUNK):
        rows = handle.scan(row_filter=In("attempt_key", keys[i:i + LOOKUP_CHUNK])).to_arrow().to_pylist()
        for row in rows:
            if not row["error"]:  # only final rows answer a request (see the module docstring)
                found.setdefault(row["attempt_key"], AttemptResult.from_row(row, cached=True))
    return found


def commit_results(lake: Lake, config: EngineConfig, results: list[AttemptResult], *,
                   asset_key: str = "tasks/attempts", run_id: str = "") -> tuple[list[str], dict[str, AttemptResult]]:
    """Append the rows of `results` whose keys have no final row in `config.table`, in one snapshot.

    Returns (keys written, {key: the table's row} for keys another writer had recorded first)."""
    by_key = {r.attempt_key: r for r in results}
    written: list[str] = []

    def missing(table) -> pa.Table | None:
        present = _present(table, list(by_key))
        written[:] = [k for k in by_key if k not in present]
        if not written:
            return None
        return pa.Table.from_pylist([by_key[k].row() for k in written], schema=TASK_ATTEMPTS.as_arrow())

    stamp = CommitStamp(asset_key=asset_key, config_hash=config_hash(config), run_id=run_id)
    lake.commit(config.table, missing, stamp, schema=TASK_ATTEMPTS,
                lineage=snapshot_record(config.table, stamp, config.model_dump(mode="json"),
                                        metadata={"batch": len(by_key)}))
    skipped = [k for k in by_key if k not in set(written)]
    return written, recorded(lake, config.table, skipped)


def _present(table, keys: list[str]) -> set[str]:
    present: set[str] = set()
    if table.current_snapshot() is None:
        return present
    for i in range(0, len(keys), LOOKUP_CHUNK):
        scan = table.scan(row_filter=In("attempt_key", keys[i:i + LOOKUP_CHUNK]),
                          selected_fields=("attempt_key", "error"))
        present.update(r["attempt_key"] for r in scan.to_arrow().to_pylist() if not r["error"])
    return present
