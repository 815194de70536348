"""Loss curves as PNG bytes, and as Markdown a Dagster asset can show in its metadata.

Drawn on a `matplotlib.figure.Figure` with the Agg canvas directly, never through `pyplot`: no
display, no global backend switch, no figure registry to leak from a long-lived process.
The image is small (about 20 KB) because it travels inline, base64-encoded, in a `data:` URI.
"""

from __future__ import annotations

import base64
import io
import math

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


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
