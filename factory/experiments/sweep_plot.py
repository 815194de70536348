"""The PNG of a sweep's results: its metric against what the sweep varies.

Purpose: `results.plot` (the `sweeps/results` asset, `factory sweep results --write`) draws here.
Design: mix weights get one scatter panel per table (the auto-mixer's view); any other sweep plots
its metric against its first param, one line per value of the middle params of a grid, and, for a
grid of three or more params, one panel per value of the last (a shared y axis: the muP sweep's
standard vs muP panels). A star marks each line's best point. A whole sub-config as a value (a
`model`) is labelled by the fields that differ among the sweep's values (`results._labels`), and
non-numeric values keep the order the sweep lists them in. Matplotlib's Agg canvas directly: no
pyplot, no global backend. Why apart from `results`: drawing is the one part that needs
matplotlib, and the collecting and ranking read best without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from factory.experiments.results import SweepReport, _fmt, _is_number, _labels, _ranking, scored
from factory.experiments.sweep import Dirichlet, SweepConfig
from factory.version import canonical_json

LOG_SCALE_PARAMS = ("lr",)  # the last segment of a param path plotted on a log axis


def _mix_tables(sweep: SweepConfig) -> list[str]:
    values = sweep.params["mix_weights"]
    if isinstance(values, Dirichlet):
        return list(values.tables)
    return list(dict.fromkeys(t for weights in values for t in weights))


def _plot_mix(fig, sweep: SweepConfig, points: list[dict]) -> None:
    """One scatter of the metric against each table's weight (the auto-mixer's view)."""
    tables = _mix_tables(sweep)
    cols = min(4, len(tables))
    axes = fig.subplots(-(-len(tables) // cols), cols, sharey=True, squeeze=False).ravel()
    for ax, table in zip(axes, tables):
        ax.scatter([p["params"]["mix_weights"].get(table, 0.0) for p in points], [p["value"] for p in points])
        ax.set_xlim(0, 1)
        ax.set_xlabel(f"weight of {table.rsplit('.', 1)[-1]}")
    for ax in axes[len(tables):]:
        ax.set_visible(False)
    axes[0].set_ylabel(sweep.metric)


def _order(sweep: SweepConfig, path: str) -> Callable[[Any], tuple]:
    """A sort key for one param's values: numbers by value (8 before 16); values of a list holding
    anything else (None, a sub-config) in the order the sweep lists them."""
    listed = sweep.params[path]
    if not isinstance(listed, list) or all(_is_number(v) for v in listed):
        return lambda v: (0, v, "") if _is_number(v) else (1, 0, _fmt(v))
    keys = [canonical_json(v) for v in listed]
    return lambda v: (0, keys.index(canonical_json(v)), "") if canonical_json(v) in keys else (1, 0, canonical_json(v))


def _panel_param(sweep: SweepConfig) -> str | None:
    """A grid of three or more params draws one panel per value of its last one."""
    return list(sweep.params)[-1] if sweep.search == "grid" and len(sweep.params) >= 3 else None


def _plot_params(fig, sweep: SweepConfig, points: list[dict]) -> None:
    """The metric against the first param; a grid draws one line per value of the middle params
    and, with three or more params, one panel per value of the last (a shared y axis)."""
    paths = list(sweep.params)
    x, panel = paths[0], _panel_param(sweep)
    rest = [r for r in paths[1:] if r != panel] if sweep.search == "grid" else []
    label = {p: _labels(p, [q["params"][p] for q in points]) for p in paths}
    order = {p: _order(sweep, p) for p in paths}
    numeric = all(_is_number(p["params"][x]) for p in points)
    panels: dict[str, list[dict]] = {}
    for p in points:
        panels.setdefault(canonical_json(p["params"][panel]) if panel else "", []).append(p)
    ordered = sorted(panels.values(), key=lambda g: order[panel](g[0]["params"][panel])) if panel else [points]
    axes = fig.subplots(1, max(1, len(ordered)), sharey=True, squeeze=False).ravel()
    for ax, panel_points in zip(axes, ordered):
        groups: dict[str, list[dict]] = {}
        for p in panel_points:
            groups.setdefault(", ".join(label[r](p["params"][r]) for r in rest), []).append(p)
        for name, group in sorted(groups.items(), key=lambda kv: [order[r](kv[1][0]["params"][r]) for r in rest]):
            group.sort(key=lambda p: order[x](p["params"][x]))
            xs = [p["params"][x] if numeric else _fmt(p["params"][x]) for p in group]
            (line,) = ax.plot(xs, [p["value"] for p in group], marker="o",
                              linestyle="-" if sweep.search == "grid" else "none", label=name or None)
            if sweep.search == "grid":  # where each line's optimum sits
                sign = -1.0 if sweep.better == "higher" else 1.0
                best = min(range(len(group)), key=lambda i: sign * group[i]["value"])
                ax.plot([xs[best]], [group[best]["value"]], marker="*", markersize=14, color=line.get_color())
        xs = [p["params"][x] for p in panel_points]
        if numeric and xs and min(xs) > 0 and (x.rsplit(".", 1)[-1] in LOG_SCALE_PARAMS or max(xs) / min(xs) >= 100):
            ax.set_xscale("log")
            if sweep.search == "grid":  # a tick per grid value: log minor-tick labels overlap in a narrow panel
                ax.minorticks_off()
                ax.set_xticks(sorted(set(xs)), [_fmt(v) for v in sorted(set(xs))], fontsize="small")
        ax.set_xlabel(x)
        if panel and panel_points:
            ax.set_title(label[panel](panel_points[0]["params"][panel]), fontsize="medium")
        if rest and panel_points and ax is axes[0]:
            ax.legend(fontsize="small")
    axes[0].set_ylabel(sweep.metric)


def plot(report_or_rows: SweepReport | list[dict], sweep: SweepConfig, path: str | Path) -> Path:
    """A PNG of the sweep's metric against what it varies (mix weights: one panel per table; a grid
    of three or more params: one panel per value of the last)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg directly: no pyplot, no global backend
    from matplotlib.figure import Figure

    ranking = report_or_rows.ranking if isinstance(report_or_rows, SweepReport) else _ranking(
        report_or_rows, sweep.metric, sweep.better)
    points = [e for e in ranking if scored(e)]
    mix = "mix_weights" in sweep.params
    panels = len(_mix_tables(sweep)) if mix else len(sweep.params[_panel_param(sweep)]) if _panel_param(sweep) else 1
    fig = Figure(figsize=(3.2 * min(4, panels), 3.2 * -(-panels // 4)) if mix else (6, 4) if panels == 1 else
                 (1.5 + 4.5 * panels, 4),
                 layout="constrained")
    FigureCanvasAgg(fig)
    (_plot_mix if mix else _plot_params)(fig, sweep, points)
    if not points:
        fig.text(0.5, 0.5, "no evaluated cells yet", ha="center", va="center")
    fig.suptitle(f"{sweep.name}: {sweep.metric} ({sweep.better} is better), {len(points)}/{len(ranking)} cells scored")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path
