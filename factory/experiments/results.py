"""`sweeps.results`: every cell of a sweep beside its final eval scores, ranked and plotted.

A sweep's cells are runs named `<sweep>-<hash8>` (`factory.experiments.sweep`); their checkpoints
land in `train.checkpoints` and their scores in `evals.results`. `write_sweep_results` joins both
with the sweep's expansion into one row per (cell, task, metric) at the cell's highest evaluated
step — plus one row with empty scores for a cell not evaluated yet, so the table always shows
every cell and its status (`evaluated`, `trained`, `pending`). An RL sweep's cell also gets one
row `rollouts/reward` once its run has sampled: the mean reward of its last 20 % of steps in
`rl.rollouts` (`factory.posttrain.rl.report.final_reward`), its step the last one; such a cell
is `trained` until an eval scores one of its checkpoints. It replaces the sweep's rows in
one overwrite filtered on `sweep` (re-running never doubles them; other sweeps' rows stay), reads
the source tables at one pinned snapshot each (named in the commit's summary), and writes a
lineage row `sweep/<name>@<snapshot>` whose upstream is every eval and checkpoint it used.

Why long format: a new task or source adds rows, not columns, and any question is one query:

    factory sql "select run, value from sweeps.results where sweep='smoke_lr' and metric='all' order by rank"

Every row carries its cell's `rank` by the sweep's own metric (`ranked_by`) in the sweep's own
direction (`better`: lower for bpb and losses, higher for `rollouts/reward`; unscored cells last),
so `ranked` — for the CLI and the auto-mixer — reads the ranks back and needs no sweep config.
Shown to people (`display_rows`, `ranking_table`), a cell without a score has no rank (`—`): a
pending cell is not fourth of four. `preview` is the read-only view `factory sweep results` prints;
only the `sweeps/results` asset, the auto-mixer and `--write` commit.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from operator import itemgetter
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
from pydantic import BaseModel, ConfigDict
from pyiceberg.expressions import EqualTo, In

from factory.evals.results import RESULTS_TABLE as EVALS_TABLE
from factory.experiments.sweep import SweepConfig, expand
from factory.lake import CommitStamp, Lake, LineageRecord
from factory.lake.schemas import SWEEP_RESULTS
from factory.lake.lineage import SNAPSHOT
from factory.posttrain.rl.report import final_reward
from factory.posttrain.rl.store import ROLLOUTS_TABLE
from factory.train.checkpoint import CHECKPOINTS_TABLE
from factory.version import canonical_json, config_hash

RESULTS_TABLE = "sweeps.results"
STATUSES = ("evaluated", "trained", "pending")
SCORE_COLUMNS = ("task", "metric", "value", "stderr", "eval_id")


class SweepReport(BaseModel):
    """What one `write_sweep_results` committed: the cells best first, and how far the sweep got."""

    model_config = ConfigDict(frozen=True)

    sweep: str
    metric: str
    ranking: list[dict[str, Any]]  # one entry per cell (see `ranked`), best first
    counts: dict[str, int]  # cells per status
    best: dict[str, Any] | None  # the first ranking entry, when it has a score
    table: str  # the ranking as Markdown
    rows: int
    snapshot_id: int | None


# -- collecting -------------------------------------------------------------------------------
def _read(lake: Lake, table: str, runs: set[str], fields: tuple[str, ...] = ("*",)) -> tuple[list[dict], int | None]:
    """`runs`' rows of `table` at its current snapshot (pinned, so every read names what it saw)."""
    if not lake.has_table(table):
        return [], None
    iceberg = lake.table(table)
    snapshot = iceberg.current_snapshot()
    if snapshot is None:
        return [], None
    scan = iceberg.scan(row_filter=In("run", runs), snapshot_id=snapshot.snapshot_id, selected_fields=fields)
    return scan.to_arrow().to_pylist(), snapshot.snapshot_id


def _collect(lake: Lake, sweep: SweepConfig) -> tuple[list[dict], dict[str, int]]:
    cells = expand(sweep)
    runs = {c.run for c in cells}
    saved, saved_at = _read(lake, CHECKPOINTS_TABLE, runs)
    scored, scored_at = _read(lake, EVALS_TABLE, runs)
    sampled, sampled_at = (_read(lake, ROLLOUTS_TABLE, runs, ("run", "step", "reward", "used")) if sweep.is_rl
                           else ([], None))
    now = dt.datetime.now(dt.timezone.utc)
    rows = []
    for cell in cells:
        ckpts = sorted((r for r in saved if r["run"] == cell.run), key=lambda r: (r["step"], r["created_at"]))
        by_id = {r["checkpoint_id"]: r for r in ckpts}  # a re-recorded checkpoint: its newest row
        evals = [r for r in scored if r["run"] == cell.run]
        final = max((r["step"] for r in evals), default=None)
        reward = final_reward([r for r in sampled if r["run"] == cell.run]) if sweep.is_rl else None
        base = {"sweep": sweep.name, "cell": cell.index, "run": cell.run,
                "config_hash": cell.experiment.identity_hash(), "params_json": canonical_json(cell.params),
                "experiment_json": canonical_json(cell.experiment), "ranked_by": sweep.metric, "created_at": now}
        if final is not None:
            for r in sorted((r for r in evals if r["step"] == final), key=itemgetter("task", "metric", "eval_id")):
                rows.append({**base, "status": "evaluated", "step": r["step"], "tokens": r["tokens"],
                             "train_loss": by_id.get(r["checkpoint_id"], {}).get("loss"),
                             "checkpoint_id": r["checkpoint_id"], **{k: r[k] for k in SCORE_COLUMNS}})
        if reward is not None:  # the policy's reward at the end of the run so far; its newest checkpoint beside it
            last = ckpts[-1] if ckpts else {}
            rows.append({**base, "status": "evaluated" if final is not None else "trained", "step": reward["step"],
                         "tokens": None, "train_loss": last.get("loss"), "checkpoint_id": last.get("checkpoint_id"),
                         "task": "rollouts", "metric": "reward", "value": reward["value"], "stderr": reward["stderr"],
                         "eval_id": None})
        if final is not None or reward is not None:
            continue
        if ckpts:
            last = ckpts[-1]
            rows.append({**base, "status": "trained", "step": last["step"], "tokens": last["tokens"],
                         "train_loss": last["loss"], "checkpoint_id": last["checkpoint_id"],
                         **dict.fromkeys(SCORE_COLUMNS)})
        else:
            rows.append({**base, "status": "pending", "step": None, "tokens": None, "train_loss": None,
                         "checkpoint_id": None, **dict.fromkeys(SCORE_COLUMNS)})
    rank = {e["cell"]: e["rank"] for e in _ranking(rows, sweep.metric, sweep.better)}
    for row in rows:
        row["rank"] = rank[row["cell"]]
    read = ((CHECKPOINTS_TABLE, saved_at), (EVALS_TABLE, scored_at), (ROLLOUTS_TABLE, sampled_at))
    upstream = {t: s for t, s in read if s is not None}
    return rows, upstream


def collect(lake: Lake, sweep: SweepConfig) -> list[dict]:
    """The rows of `sweeps.results` for `sweep` as the lake stands now (long format, see module doc)."""
    return _collect(lake, sweep)[0]


# -- ranking ----------------------------------------------------------------------------------
def _entries(rows: list[dict], metric: str) -> list[dict]:
    """One entry per cell with its score on `metric` (None when it has none). A cell scored on
    `metric` by several suites at its final step takes the suite its experiment names (what the eval
    sensor runs)."""
    task, name = metric.split("/", 1)
    cells: dict[int, list[dict]] = {}
    for r in rows:
        cells.setdefault(r["cell"], []).append(r)
    entries = []
    for index, group in cells.items():
        suite = json.loads(group[0]["experiment_json"]).get("eval_suite")
        hits = sorted((r for r in group if r["task"] == task and r["metric"] == name),
                      key=lambda r: (not (r["eval_id"] or "").endswith(f"/{suite}"), r["eval_id"] or ""))
        row = hits[0] if hits else group[0]
        score = {k: row[k] if hits else None for k in ("value", "stderr", "eval_id")}
        entries.append({"cell": index, "run": row["run"], "status": row["status"],
                        "params": json.loads(row["params_json"]), **score, "step": row["step"],
                        "tokens": row["tokens"], "train_loss": row["train_loss"],
                        "checkpoint_id": row["checkpoint_id"], "config_hash": row["config_hash"]})
    return entries


def _ranking(rows: list[dict], metric: str, better: str = "lower") -> list[dict]:
    """`_entries` best first by `metric` (`better`: "lower" or "higher"); cells without a finite
    score last (trained before pending), still numbered: every cell gets a rank 1..n."""
    sign = -1.0 if better == "higher" else 1.0

    def key(e: dict) -> tuple:
        unscored = e["value"] is None or not math.isfinite(e["value"])
        return unscored, 0.0 if unscored else sign * e["value"], STATUSES.index(e["status"]), e["cell"]

    return [{"rank": i + 1, **e} for i, e in enumerate(sorted(_entries(rows, metric), key=key))]


def ranked(lake: Lake, sweep_name: str) -> list[dict]:
    """The ranking last written to `sweeps.results` for `sweep_name` ([] when never written).

    Each entry: rank, cell, run, status, params (path -> value), value, stderr, eval_id, step,
    tokens, train_loss, checkpoint_id, config_hash."""
    if not lake.has_table(RESULTS_TABLE):
        return []
    rows = lake.table(RESULTS_TABLE).scan(row_filter=EqualTo("sweep", sweep_name)).to_arrow().to_pylist()
    if not rows:
        return []
    rank = {r["cell"]: r["rank"] for r in rows}  # as written, in the sweep's direction
    return [{"rank": rank[e["cell"]], **e} for e in sorted(_entries(rows, rows[0]["ranked_by"]), key=lambda e: rank[e["cell"]])]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_weights(value: Any) -> bool:
    """Mix weights (table -> share), as opposed to a whole sub-config's fields (`model`)."""
    return isinstance(value, dict) and all(_is_number(v) for v in value.values())


def _fmt(value: Any) -> str:
    if _is_weights(value):
        return "{" + ", ".join(f"{k.rsplit('.', 1)[-1]}: {v:.3g}" for k, v in value.items()) + "}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _labels(path: str, values: list[Any]) -> Callable[[Any], str]:
    """How one param's values read: `path=value`, and a whole sub-config by only the fields that
    differ among `values` (`model.d_model=64, model.n_heads=2`): all of them would bury those."""
    configs = [v for v in values if isinstance(v, dict) and not _is_weights(v)]
    fields = [k for k in dict.fromkeys(k for v in configs for k in v)
              if len({canonical_json(v.get(k)) for v in configs}) > 1]

    def label(value: Any) -> str:
        if isinstance(value, dict) and not _is_weights(value):
            return ", ".join(f"{path}.{k}={_fmt(value.get(k))}" for k in fields or value)
        return f"{path}={_fmt(value)}"

    return label


def counts_line(counts: dict[str, int]) -> str:
    """`2 evaluated, 1 trained, 1 pending` (statuses with no cell left out, unless all are)."""
    return ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no cells"


def scored(entry: dict) -> bool:
    """Whether a ranking entry has a finite score; only those get a rank shown (the rest are unranked)."""
    return entry["value"] is not None and math.isfinite(entry["value"])


def display_rows(ranking: list[dict]) -> list[list[str]]:
    """Rank, run, params, the metric (± stderr), train loss and status of every cell, as text; a
    cell without a score shows `—` for its rank (it is listed last, not ranked)."""
    lines = []
    paths = dict.fromkeys(k for e in ranking for k in e["params"])
    label = {p: _labels(p, [e["params"][p] for e in ranking if p in e["params"]]) for p in paths}
    for e in ranking:
        value = f"{e['value']:.4f}" if scored(e) else "—"
        if scored(e) and e["stderr"] is not None:
            value += f" ± {e['stderr']:.4f}"
        loss = "—" if e["train_loss"] is None else f"{e['train_loss']:.4f}"
        params = ", ".join(label[k](v) for k, v in e["params"].items())
        lines.append([str(e["rank"]) if scored(e) else "—", e["run"], params, value, loss, e["status"]])
    return lines


def ranking_table(ranking: list[dict], metric: str) -> str:
    """`display_rows` as Markdown (the asset's metadata)."""
    lines = [f"| rank | run | params | {metric} | train loss | status |", "|---:|---|---|---:|---:|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in display_rows(ranking)]
    return "\n".join(lines)


def preview(lake: Lake, sweep: SweepConfig) -> SweepReport:
    """What `write_sweep_results` would commit, read from the lake and written nowhere
    (`factory sweep results` without `--write`): `rows` counted, `snapshot_id` None."""
    rows, _ = _collect(lake, sweep)
    return _report(sweep, rows, snapshot_id=None)


def _report(sweep: SweepConfig, rows: list[dict], *, snapshot_id: int | None) -> SweepReport:
    ranking = _ranking(rows, sweep.metric, sweep.better)
    counts = {s: sum(e["status"] == s for e in ranking) for s in STATUSES}
    best = ranking[0] if ranking and scored(ranking[0]) else None
    return SweepReport(sweep=sweep.name, metric=sweep.metric, ranking=ranking, counts=counts, best=best,
                       table=ranking_table(ranking, sweep.metric), rows=len(rows), snapshot_id=snapshot_id)


# -- writing ----------------------------------------------------------------------------------
def write_sweep_results(lake: Lake, sweep: SweepConfig, *, run_id: str = "", asset_key: str = "sweeps/results",
                        partition: str = "") -> SweepReport:
    """Replace `sweep`'s rows of `sweeps.results` (one commit), then write its lineage row."""
    rows, upstream = _collect(lake, sweep)
    stamp = CommitStamp(asset_key=asset_key, config_hash=config_hash(sweep), run_id=run_id, partition=partition,
                        upstream=upstream)
    data = pa.Table.from_pylist(rows, schema=SWEEP_RESULTS.as_arrow())
    report = _report(sweep, rows, snapshot_id=None)
    best = report.best
    used = sorted({r[k] for r in rows for k in ("eval_id", "checkpoint_id") if r[k]})
    row = LineageRecord(
        version_id=f"sweep/{sweep.name}@{SNAPSHOT}", kind="sweep_results", name=f"sweep/{sweep.name}",
        uri=f"iceberg://{RESULTS_TABLE}", upstream=used, config_json=canonical_json(sweep),
        config_hash=stamp.config_hash, code_version=stamp.code_version, env_lock=stamp.env_lock, asset_key=asset_key,
        partition=partition, run_id=run_id,
        metadata_json=canonical_json({"metric": sweep.metric, "counts": report.counts, "rows": len(rows),
                                      "best": best and {"run": best["run"], "value": best["value"]}}),
    )
    commit = lake.commit(RESULTS_TABLE, data, stamp, mode="overwrite", overwrite_filter=EqualTo("sweep", sweep.name),
                         schema=SWEEP_RESULTS, lineage=row)
    return _report(sweep, rows, snapshot_id=commit.snapshot_id)


# -- plotting ---------------------------------------------------------------------------------
def plot(report_or_rows: SweepReport | list[dict], sweep: SweepConfig, path: str | Path) -> Path:
    """A PNG of the sweep's metric against what it varies (`factory.experiments.sweep_plot`)."""
    from factory.experiments.sweep_plot import plot as draw  # matplotlib only once something is drawn

    return draw(report_or_rows, sweep, path)
