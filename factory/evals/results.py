"""`evals.results` and `evals.samples`: where scores live, and the table a researcher reads.

One eval is one (checkpoint, suite) pair, `eval/<run>@<step>/<suite>`. Writing it replaces that
eval's rows (an overwrite filtered on `eval_id`), so re-evaluating a checkpoint never doubles its
scores. Samples are committed first, results second (stamped with the lineage row it owes), the
lineage row last: each only refers to what already exists, and the scores — what dashboards and the sensor's users read — appear only
once everything behind them is in place.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
from pyiceberg.expressions import EqualTo

from factory.lake import CommitStamp, Lake, LineageRecord
from factory.lake.schemas import EVAL_RESULTS, EVAL_SAMPLES
from factory.version import canonical_json, env_lock_hash

RESULTS_TABLE = "evals.results"
SAMPLES_TABLE = "evals.samples"
MAX_COMPLETION_CHARS = 2000


def eval_id_of(checkpoint_id: str, suite: str) -> str:
    return f"eval/{checkpoint_id.removeprefix('ckpt/')}/{suite}"


def write_results(lake: Lake, *, eval_id: str, rows: list[dict], samples: list[dict], upstream: list[str],
                  config: dict, config_hash: str, run_id: str = "", asset_key: str = "eval_scores",
                  partition: str = "") -> int | None:
    """Commit one eval's samples, results and lineage row; returns the results snapshot id."""
    stamp = CommitStamp(asset_key=asset_key, config_hash=config_hash, run_id=run_id, partition=partition,
                        upstream=lake.lineage.upstream_snapshots(upstream))
    mine = EqualTo("eval_id", eval_id)
    for s in samples:
        if s.get("completion") and len(s["completion"]) > MAX_COMPLETION_CHARS:
            s["completion"] = s["completion"][:MAX_COMPLETION_CHARS]
    sample_data = pa.Table.from_pylist([{"eval_id": eval_id, **s} for s in samples], schema=EVAL_SAMPLES.as_arrow())
    lake.commit(SAMPLES_TABLE, sample_data, stamp, mode="overwrite", overwrite_filter=mine, schema=EVAL_SAMPLES)
    data = pa.Table.from_pylist(rows, schema=EVAL_RESULTS.as_arrow())
    row = LineageRecord(
        version_id=eval_id, kind="eval", name=eval_id.rsplit("/", 1)[0], uri=f"iceberg://{RESULTS_TABLE}",
        upstream=upstream, config_json=canonical_json(config), config_hash=config_hash,
        code_version=stamp.code_version, env_lock=env_lock_hash(), asset_key=asset_key, partition=partition,
        run_id=run_id,
        metadata_json=canonical_json({f"{r['task']}/{r['metric']}": round(r["value"], 6) for r in rows}),
    )
    commit = lake.commit(RESULTS_TABLE, data, stamp, mode="overwrite", overwrite_filter=mine, schema=EVAL_RESULTS,
                         lineage=row)
    return commit.snapshot_id


def results(lake: Lake, run: str | None = None, suite: str | None = None) -> list[dict[str, Any]]:
    """Rows of `evals.results`, by step, task, metric."""
    if not lake.has_table(RESULTS_TABLE):
        return []
    scan = lake.table(RESULTS_TABLE).scan(row_filter=EqualTo("run", run)) if run else lake.table(RESULTS_TABLE).scan()
    rows = scan.to_arrow().to_pylist()
    return sorted((r for r in rows if suite is None or r["suite"] == suite),
                  key=lambda r: (r["run"], r["step"], r["task"], r["metric"]))


def previous_results(lake: Lake, run: str, step: int, suite: str) -> list[dict[str, Any]]:
    """The results of the newest earlier checkpoint of `run` evaluated with `suite` (or [])."""
    earlier = [r for r in results(lake, run, suite) if r["step"] < step]
    if not earlier:
        return []
    last = max(r["step"] for r in earlier)
    return [r for r in earlier if r["step"] == last]


def score_table(rows: list[dict], previous: list[dict]) -> str:
    """Markdown: task, metric, value ± stderr, n, and the change from the previous checkpoint."""
    before = {(r["task"], r["metric"]): r for r in previous}
    step = f" (vs step {previous[0]['step']})" if previous else ""
    lines = [f"| task | metric | value | ± stderr | n | change{step} |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        err = f"{r['stderr']:.4f}" if r["stderr"] is not None else ""
        old = before.get((r["task"], r["metric"]))
        delta = f"{r['value'] - old['value']:+.4f}" if old else "—"
        lines.append(f"| {r['task']} | {r['metric']} | {r['value']:.4f} | {err} | {r['n']} | {delta} |")
    return "\n".join(lines)


def result_rows(*, eval_id: str, export, suite: str, task: str, metrics, tokens: int, engine: str,
                config_hash: str) -> list[dict]:
    now = dt.datetime.now(dt.timezone.utc)
    return [{"eval_id": eval_id, "checkpoint_id": export.checkpoint_id, "export_id": export.export_id,
             "run": export.run, "step": export.step, "tokens": tokens, "suite": suite, "task": task,
             "metric": m.metric, "value": float(m.value), "n": int(m.n), "stderr": m.stderr, "engine": engine,
             "config_hash": config_hash, "created_at": now} for m in metrics]
