"""Loss curves as PNG bytes, as a small SVG, and as Markdown a Dagster asset can show in its metadata.

The PNG is drawn on a `matplotlib.figure.Figure` with the Agg canvas directly, never through
`pyplot`: no display, no global backend switch, no figure registry to leak from a long-lived
process. It is about 20 KB, base64-encoded in a `data:` URI.

The Dagster UI renders a Markdown metadata value inline only below 1,000 characters
(`MetadataEntry.tsx` in dagster-webui: `expandSmallValues && mdStr.length < 1000`); anything
longer, a PNG always, sits behind "[Show Markdown]". So the training run's loss curve is
`loss_curve_markdown`: an SVG of at most 40 bucket means, axes and four labels, written by hand
(no plotting library) and shrunk until its Markdown fits under that limit.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
INLINE_MARKDOWN = 1000  # the UI's limit for Markdown shown inline (see the module docstring)


def loss_curve_png(rows: list[tuple[int, float]], title: str, *, ylabel: str = "loss") -> bytes:
    """Plot (step, value) rows, sorted by step, as a PNG. Non-finite values leave gaps and are
    counted in the legend; no rows gives a labelled empty plot rather than an error."""
    rows = sorted(rows)
    fig = Figure(figsize=(6, 3.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    steps = [step for step, _ in rows]
    values = [value if math.isfinite(value) else math.nan for _, value in rows]
    nonfinite = sum(1 for _, value in rows if not math.isfinite(value))
    label = f"{ylabel} ({nonfinite} non-finite)" if nonfinite else ylabel
    ax.plot(steps, values, linewidth=1.2, label=label)
    if not rows:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.set(title=title, xlabel="step", ylabel=ylabel)
    ax.grid(True, alpha=0.3)
    if rows:
        ax.legend(loc="upper right")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def png_markdown(png: bytes, alt: str = "loss curve") -> str:
    """A Markdown image whose source is the PNG itself (`data:image/png;base64,...`)."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode('ascii')})"


def loss_curve_svg(rows: Sequence[tuple[int, float]], *, points: int = 40, width: int = 480,
                   height: int = 140) -> bytes:
    """(step, value) rows as a compact SVG line: the mean of each of at most `points` buckets of
    steps, a gap where a bucket has no finite value, the value range and the step range labelled."""
    rows = sorted(rows)
    finite = [v for _, v in rows if math.isfinite(v)]
    left, right, top, bottom = 44, width - 8, 8, height - 20
    if not finite:
        body = f'<text x="{width // 2}" y="{height // 2}" text-anchor="middle">no data</text>'
    else:
        lo, hi = min(finite), max(finite)
        first, last = rows[0][0], rows[-1][0]
        span_x, span_y = max(last - first, 1), (hi - lo) or 1.0
        size = max(1, math.ceil(len(rows) / points))
        path, pen = [], "M"
        for i in range(0, len(rows), size):
            bucket = rows[i:i + size]
            values = [v for _, v in bucket if math.isfinite(v)]
            if not values:  # a gap: the next point starts a new segment
                pen = "M"
                continue
            x = left + (bucket[-1][0] - first) / span_x * (right - left)
            y = top + (hi - sum(values) / len(values)) / span_y * (bottom - top)
            path.append(f"{pen}{x:.0f} {y:.0f}")
            pen = "L"
        body = (f'<path d="{"".join(path)}" fill="none" stroke="#4F43DD" stroke-width="1.5"/>'
                f'<text x="{left - 4}" y="{top + 8}" text-anchor="end">{hi:.3g}</text>'
                f'<text x="{left - 4}" y="{bottom}" text-anchor="end">{lo:.3g}</text>'
                f'<text x="{left}" y="{height - 4}">{first}</text>'
                f'<text x="{right}" y="{height - 4}" text-anchor="end">step {last}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
            f'font-size="11"><path d="M{left} {top}V{bottom}H{right}" fill="none" stroke="#999"/>{body}</svg>').encode()


def loss_curve_markdown(rows: Sequence[tuple[int, float]], alt: str = "loss curve") -> str:
    """The loss curve as a Markdown image short enough for the Dagster UI to show inline: fewer
    buckets until it fits (a long run's curve keeps its shape at 40, 20 or 10 points)."""
    points = 40
    while True:
        svg = base64.b64encode(loss_curve_svg(rows, points=points)).decode("ascii")
        markdown = f"![{alt}](data:image/svg+xml;base64,{svg})"
        if len(markdown) < INLINE_MARKDOWN or points <= 2:
            return markdown
        points //= 2
