"""The demo's closing summary: what the pipeline left in the lake, read back with the factory's APIs.

`collect` reads numbers only (snapshot summaries for row counts, the refinement steps' lineage
rows for drops, `train.checkpoints` / `train.metrics` for the run, `evals.results` for scores),
so the summary states what is in the lake, not what the demo's processes said they did; `render`
turns them into the lines printed after the phases, with where to look next.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from factory.lake import Lake, LakeError

SYNTHETIC = "synthetic."
REJECTED = "_rejected"


@dataclass(frozen=True)
class Drops:
    """One source through its refinement pipeline: documents in (raw) and out (refined), by reason."""

    source: str
    rows_in: int
    rows_out: int
    dropped: dict[str, int]


@dataclass(frozen=True)
class Summary:
    tables: dict[str, int | None]  # table -> rows (None: its metadata is unreadable)
    drops: list[Drops]
    run: str | None = None
    steps: int | None = None
    tokens: int | None = None
    loss: tuple[tuple[int, float], tuple[int, float]] | None = None  # (step, loss) first and last
    checkpoint: str | None = None  # the scored checkpoint (the run's newest with results)
    suite: str | None = None
    scores: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)  # (task, metric) -> (value, n)
    builds: dict[str, str] = field(default_factory=dict)  # repo -> failure class of its latest build (demo set)

    @property
    def synthetic(self) -> dict[str, tuple[int, int]]:
        """Synthetic pipeline -> (accepted rows, rejected candidates)."""
        return {name.removeprefix(SYNTHETIC): (rows or 0, self.tables.get(name + REJECTED) or 0)
                for name, rows in self.tables.items() if name.startswith(SYNTHETIC) and not name.endswith(REJECTED)}


def collect(lake: Lake, run: str | None, pipelines: list) -> Summary:
    """The numbers of the summary; `run` is the demo's training run, `pipelines` the RefineConfigs."""
    from factory.data.refine.report import drop_table

    tables = {name: _rows(lake, name) for name in lake.tables()}
    by_source: dict[str, list[dict]] = {}
    for row in drop_table(lake, pipelines):
        by_source.setdefault(row["source"], []).append(row)
    drops = [Drops(source, steps[0]["rows_in"], steps[-1]["rows_out"],
                   dict(sum((Counter(s["dropped"]) for s in steps), Counter()).most_common()))
             for source, steps in by_source.items()]
    from factory.envs.store import builds

    latest = {row["repo"]: row["failure_class"] for row in builds(lake, "demo")}  # oldest first: newest wins
    return Summary(tables=tables, drops=drops, builds=latest, **(_training(lake, run) if run else {}))


def _rows(lake: Lake, name: str) -> int | None:
    try:
        snapshot = lake.table(name).current_snapshot()
    except LakeError:  # one unreadable table must not hide the others (`factory tables` names it)
        return None
    summary = snapshot.summary.additional_properties if snapshot and snapshot.summary else {}
    return int(summary.get("total-records", 0))


def _training(lake: Lake, run: str) -> dict:
    from pyiceberg.expressions import And, EqualTo

    from factory.evals.results import results
    from factory.train.checkpoint import checkpoints
    from factory.train.trackers import METRICS_TABLE

    found: dict = {"run": run}
    if ckpts := checkpoints(lake, run):
        found |= {"steps": ckpts[-1]["step"], "tokens": ckpts[-1]["tokens"]}
    if lake.has_table(METRICS_TABLE):
        rows = lake.table(METRICS_TABLE).scan(row_filter=And(EqualTo("run", run), EqualTo("name", "loss")),
                                              selected_fields=("step", "value")).to_arrow().to_pylist()
        if rows:
            rows.sort(key=lambda r: r["step"])
            found["loss"] = ((rows[0]["step"], rows[0]["value"]), (rows[-1]["step"], rows[-1]["value"]))
    if "loss" not in found and len(ckpts) > 1:  # a tracker without the metrics table: the checkpoints' losses
        found["loss"] = ((ckpts[0]["step"], ckpts[0]["loss"]), (ckpts[-1]["step"], ckpts[-1]["loss"]))
    if scored := results(lake, run):
        last = max(r["step"] for r in scored)
        newest = [r for r in scored if r["step"] == last]
        found |= {"checkpoint": newest[0]["checkpoint_id"], "suite": newest[0]["suite"],
                  "scores": {(r["task"], r["metric"]): (r["value"], r["n"]) for r in newest}}
    return found


def render(summary: Summary, *, phases: list[tuple[str, float]], setup_seconds: float | None, log: str,
           factory: str = "factory", experiment: str = "smoke") -> list[str]:
    """The summary's lines: the lake, refinement, training, evals, synthetic data, times, next steps."""
    from factory.demo.steps import duration

    lines = ["", "== summary"]

    def section(title: str, rows: list[str]) -> None:
        for i, row in enumerate(rows or ["-"]):
            lines.append(f"{title if i == 0 else '':<11}{row}")

    known = [r for r in summary.tables.values() if r is not None]
    by_namespace: dict[str, list[int]] = {}
    for name, rows in sorted(summary.tables.items()):
        by_namespace.setdefault(name.split(".")[0], []).append(rows or 0)
    unreadable = len(summary.tables) - len(known)
    namespaces = [f"{ns} {len(r)} ({sum(r):,} rows)" for ns, r in by_namespace.items()]
    section("lake", [f"{len(summary.tables)} tables, {sum(known):,} rows" + (f", {unreadable} unreadable" if unreadable
                                                                            else "") + " by namespace:",
                     *(" · ".join(namespaces[i:i + 4]) for i in range(0, len(namespaces), 4))])
    section("refine", [f"{d.source} {d.rows_in:,} → {d.rows_out:,} documents" + _reasons(d) for d in summary.drops])
    train = []
    if summary.run and summary.steps is not None:
        text = f"{summary.run}: {summary.steps:,} steps, {summary.tokens:,} tokens"
        if summary.loss:
            (s0, l0), (s1, l1) = summary.loss
            text += f", loss {l0:.3f} → {l1:.3f} (step {s0} → {s1})"
        train.append(text)
    section("train", train)
    section("eval", _scores(summary))
    section("synthetic", [f"{name} {rows:,} rows ({rejected:,} rejected)"
                          for name, (rows, rejected) in sorted(summary.synthetic.items())])
    passed = sorted(repo for repo, outcome in summary.builds.items() if outcome == "passed")
    failed = [f"{repo} ({outcome})" for repo, outcome in sorted(summary.builds.items()) if outcome != "passed"]
    tasks = [f"{name.removeprefix('tasks.')} {rows or 0:,}" for name, rows in sorted(summary.tables.items())
             if name.startswith("tasks.") and name != "tasks.attempts"]
    section("repos", ([f"{len(passed)}/{len(summary.builds)} demo environments built and tested: {', '.join(passed)}"
                       + (f"; failed: {', '.join(failed)}" if failed else "")] if summary.builds else [])
            + ([f"tasks derived from their test suites: {' · '.join(tasks)}"] if tasks else []))
    times = ([("setup (install)", setup_seconds)] if setup_seconds is not None else []) + phases
    times.append(("pipeline", sum(s for _, s in phases)))
    width = max([34, *(len(name) + 2 for name, _ in times)])
    section("time", [f"{name:<{width}}{duration(seconds):>7}" for name, seconds in times])
    section("next", _next(summary, factory, experiment))
    section("log", [f"{log}  (third-party output: Spark, vLLM, Dagster's own events and warnings)"])
    return lines


def _reasons(d: Drops, shown: int = 3) -> str:
    if not d.dropped:
        return ""
    named = ", ".join(f"{reason} {n:,}" for reason, n in list(d.dropped.items())[:shown])
    hidden = len(d.dropped) - shown
    more = f", {hidden} more reason{'s' if hidden > 1 else ''}" if hidden > 0 else ""
    return f" (dropped {sum(d.dropped.values()):,}: {named}{more})"


def _scores(summary: Summary) -> list[str]:
    if not summary.scores:
        return []
    parts = []
    if (bpb := summary.scores.get(("bpb", "all"))) is not None:
        parts.append(f"{bpb[0]:.3f} bits per byte on held-out text ({bpb[1]:,} documents)")
    if (humaneval := summary.scores.get(("humaneval", "pass@1"))) is not None:
        parts.append(f"HumanEval pass@1 {humaneval[0]:.3f} ({humaneval[1]:,} problems)")
    if (lines := summary.scores.get(("line_completion", "exact_match"))) is not None:
        parts.append(f"line completion exact match {lines[0]:.3f} ({lines[1]:,} lines)")
    return [f"{summary.checkpoint} (suite {summary.suite}):", *parts]


def _next(summary: Summary, factory: str, experiment: str) -> list[str]:
    steps = [("make ui", "the asset graph, runs, metadata and lineage at http://127.0.0.1:3000"),
             ("make mlflow", "loss curves and the run's card in MLflow at http://127.0.0.1:5000"),
             (f"{factory} tables", "every table: rows, bytes, snapshot, asset key"),
             (f"{factory} drops", "each refinement step: rows kept, dropped by reason"),
             (f"{factory} evals --run {experiment}", "every score of the run's checkpoints")]
    if summary.checkpoint and summary.suite:
        eval_id = f"eval/{summary.checkpoint.removeprefix('ckpt/')}/{summary.suite}"
        steps.append((f"{factory} lineage {eval_id}", "where those scores came from, down to the raw snapshots"))
    steps += [(f"{factory} envs builds --repos demo", "each repository build: phases, failure class, tests"),
              (f"{factory} mix show default_synthetic", "the mix with the synthetic rows in it"),
              (f"{factory} sweep launch smoke_lr", "queue a sweep (runs under make ui)"),
              (f'{factory} sql "select source, count(*) from raw.python_stdlib group by 1"', "")]
    width = max(len(command) for command, why in steps if why)
    return [f"{command:<{width}}  {why}".rstrip() for command, why in steps]
