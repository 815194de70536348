"""muP transfer: where the best learning rate sits at each width, with and without muP.

Reads the `mup_lr` sweep (`configs/sweeps/mup_lr.py`: learning rate x d_model 64/128/256 x
standard / muP parametrization) from the lake, writes its rows of `sweeps.results` and the plot
(bpb against lr, one line per width, one panel per parametrization, a star at each line's best),
then prints per parametrization and width the held-out bits per byte at every lr, the best lr on
the grid, and the vertex of a parabola in log2(lr) through the best point and its neighbours
(`edge`: the grid did not bracket the optimum).

The baseline is the standard parametrization measured in the same sweep: its best-lr spread over
widths, log2(max best lr / min best lr), against muP's, and the slope of log2(best lr) against
log2(width) (muP's should be near 0; standard's negative: wider wants smaller steps), and how far
apart each parametrization's width curves lie at equal lr (muP's should collapse onto one). The
control line compares muP and standard at the base width, where they are the same model (must be 0).

`--run` first trains and scores the cells that are not done, middle-out (`priority`: the central
learning rates first, the grid's edges and the base-width muP duplicates last, so a run cut short
has bracketed what it could), each as a one-cell `run_sweep` (`factory sweep run` without
Dagster), scored by the transformers engine: vLLM's start-up would cost more than a cell trains.

    FACTORY_HOME=.factory OMP_NUM_THREADS=1 .venv/bin/python bench/mup_bench.py [--run]

Not part of the tests. A cell takes 30 s to 1.5 min on an idle core (40 steps, then 5-15 s of
export, equivalence check and eval), 2-3x that when the two cores are shared; the 42 cells took
about 40 minutes on shared cores. Without `--run` it reads and reports in ~20 s.
"""

from __future__ import annotations

import argparse
import math
import time

from configs.evals import suite
from configs.sweeps.mup_lr import mup_lr
from factory.evals.results import results
from factory.experiments.local import run_sweep
from factory.experiments.results import plot, write_sweep_results
from factory.experiments.sweep import Cell, SweepConfig, expand
from factory.home import artifacts_dir
from factory.infer import EngineConfig
from factory.lake import Lake


def curves(ranking: list[dict]) -> tuple[dict[tuple[str, int], dict[float, float]], set[tuple[str, int, float]]]:
    """(parametrization, d_model) -> {lr: score} over the scored cells, and which of those scores
    a muP cell at its base width borrowed from the standard cell there (the same model: width
    multiplier 1) because it was not scored itself (`priority` runs those last)."""
    out: dict[tuple[str, int], dict[float, float]] = {}
    bases = set()
    for e in ranking:
        if e["value"] is None or not math.isfinite(e["value"]):
            continue
        p, base = e["params"], e["params"]["model.mup_base_width"]
        bases |= {base} - {None}
        out.setdefault((kind_of(base), p["model"]["d_model"]), {})[p["optimizer.lr"]] = e["value"]
    borrowed = set()
    for base in bases:
        for lr, value in out.get(("SP", base), {}).items():
            if lr not in out.setdefault((kind_of(base), base), {}):
                out[kind_of(base), base][lr] = value
                borrowed.add((kind_of(base), base, lr))
    return out, borrowed


def kind_of(base: int | None) -> str:
    return "SP" if base is None else f"muP (base {base})"


def optimum(curve: dict[float, float]) -> tuple[float, float | None]:
    """The best lr on the grid, and the vertex of a parabola in log2(lr) through it and its two
    neighbours (None when the best lr is at the grid's edge, or the three points are not convex)."""
    lrs = sorted(curve)
    i = min(range(len(lrs)), key=lambda k: curve[lrs[k]])
    if i in (0, len(lrs) - 1):
        return lrs[i], None
    (x0, x1, x2), (y0, y1, y2) = [math.log2(lrs[k]) for k in (i - 1, i, i + 1)], [curve[lrs[k]] for k in (i - 1, i, i + 1)]
    denom = (x0 - x1) * (x0 - x2) * (x1 - x2)
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / denom
    b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / denom
    return lrs[i], (2 ** (-b / (2 * a)) if a > 0 else None)


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of log2(best lr) against log2(width)."""
    xs, ys = [math.log2(w) for w, _ in points], [math.log2(lr) for _, lr in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def report(ranking: list[dict]) -> str:
    data, borrowed = curves(ranking)
    lrs = sorted({lr for c in data.values() for lr in c})
    lines = ["| parametrization | d_model | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | best lr | fitted |",
             "|---|---:|" + "---:|" * len(lrs) + "---:|---:|"]
    drift = {}
    for kind in sorted({k for k, _ in data}, key=lambda k: k != "SP"):
        best = []
        for d in sorted(w for k, w in data if k == kind):
            curve = data[kind, d]
            grid, fitted = optimum(curve)
            best.append((d, fitted or grid))
            cells = [("—" if lr not in curve else f"**{curve[lr]:.4f}**" if lr == grid else f"{curve[lr]:.4f}")
                     + ("†" if (kind, d, lr) in borrowed else "") for lr in lrs]
            lines.append(f"| {kind} | {d} | " + " | ".join(cells) + f" | {grid:g} | {f'{fitted:.3g}' if fitted else 'edge'} |")
        if len(best) >= 2:
            lo, hi = min(lr for _, lr in best), max(lr for _, lr in best)
            drift[kind] = (math.log2(hi / lo), slope(best))
    lines.append("")
    if borrowed:
        lines.append("†: not scored itself; the standard cell's score at the base width (the same model)")
    for kind, d in data:  # the control: at its base width a muP cell is the standard model
        same = [lr for lr in data[kind, d] if kind == kind_of(d) and (kind, d, lr) not in borrowed
                and lr in data.get(("SP", d), {})]
        if same:
            gap = max(abs(data[kind, d][lr] - data["SP", d][lr]) for lr in same)
            lines.append(f"control: {kind} vs SP at d_model {d} (same model), max |bpb difference| over {len(same)} lr(s) = {gap:.2e}")
    for kind, (spread, s) in drift.items():
        lines.append(f"{kind}: best-lr spread over widths log2(max/min) = {spread:.2f}, "
                     f"slope d log2(lr*) / d log2(width) = {s:+.2f}")
    mup = [v for k, v in drift.items() if k != "SP"]
    if "SP" in drift and mup:
        sp, mu = drift["SP"][0], mup[0][0]
        ratio = f"{sp / mu:.2f}" if mu > 0 else "inf" if sp > 0 else "undefined (neither moves on this grid)"
        lines.append(f"best-lr spread ratio SP / muP = {ratio} (> 1: muP's optimum moves less)")
    collapse = {kind: collapse_of(data, kind) for kind in drift}
    for kind, value in collapse.items():
        lines.append(f"{kind}: curves' spread over widths at equal lr, mean over lrs of (max - min) bpb = {value:.4f}")
    if collapse.get("SP") and len(collapse) > 1:
        mu = next(v for k, v in collapse.items() if k != "SP")
        lines.append(f"curve spread ratio SP / muP = {collapse['SP'] / mu:.2f} (> 1: muP's curves lie closer together)")
    return "\n".join(lines)


def collapse_of(data: dict[tuple[str, int], dict[float, float]], kind: str) -> float:
    """How far apart one parametrization's width curves lie: at each lr every width scored, the
    spread of bpb over widths, averaged over those lrs (muP's early training is width-invariant)."""
    widths = [d for k, d in data if k == kind]
    lrs = set.intersection(*(set(data[kind, d]) for d in widths))
    gaps = [max(data[kind, d][lr] for d in widths) - min(data[kind, d][lr] for d in widths) for lr in lrs]
    return sum(gaps) / len(gaps) if gaps else math.nan


def priority(sweep: SweepConfig) -> list[Cell]:
    """The cells middle-out: the grid's central learning rates first (the higher of two equally
    central ones first; the widest model first), its edges last, and the muP cells at the base
    width (the same models as standard there) after everything."""
    lrs = sweep.params["optimizer.lr"]
    centre = (len(lrs) - 1) / 2

    def key(cell: Cell) -> tuple:
        model = cell.experiment.model
        return (model.width_multiplier == 1.0 and model.mup_base_width is not None,
                abs(lrs.index(cell.params["optimizer.lr"]) - centre - 0.25), -model.d_model, cell.index)

    return sorted(expand(sweep), key=key)


def run(lake: Lake, sweep: SweepConfig) -> None:
    """Train and evaluate every cell, in `priority` order: each as a one-cell sweep of the same
    name, which is the same experiment and run (a rerun skips what is done)."""
    started = time.perf_counter()
    engine = EngineConfig(kind="transformers")  # vLLM's start-up per cell would cost more than the cell trains
    cells = priority(sweep)
    for n, cell in enumerate(cells):
        steps = cell.experiment.steps
        if any(r["step"] == steps for r in results(lake, cell.run, cell.experiment.eval_suite)):
            continue  # scored at its final step: not even a trainer process to start (a grown grid reruns)
        one = sweep.model_copy(update={"params": {k: [v] for k, v in cell.params.items()}})
        assert expand(one)[0].run == cell.run
        print(f"{n + 1}/{len(cells)} ({time.perf_counter() - started:.0f} s)", flush=True)
        run_sweep(lake, one, suites=suite, engine=engine)
    print(f"sweep {sweep.name}: {len(cells)} cells in {time.perf_counter() - started:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", action="store_true", help="train and evaluate the sweep's cells first")
    args = parser.parse_args()
    sweep, lake = mup_lr(), Lake.open()
    if args.run:
        run(lake, sweep)
    result = write_sweep_results(lake, sweep, asset_key="bench")
    path = plot(result, sweep, artifacts_dir(lake.home) / "sweeps" / sweep.name / "summary.png")
    print(f"sweeps.results snapshot {result.snapshot_id}: {result.counts}; plot {path}\n")
    print(report(result.ranking))


if __name__ == "__main__":
    main()
