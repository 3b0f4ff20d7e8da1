"""Figure helpers for the widgets: Agg figures rendered to PNG, never registered with pyplot.

Widgets redraw often (live, from a background thread), so their figures skip the constrained
layout the export's figures use (it dominates the drawing time) and render at a lower DPI.
"""

from __future__ import annotations

import io

DPI = 80


def new_figure(width: float = 6.4, height: float = 3.6):
    """A Figure on its own Agg canvas, with fixed margins."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.14, top=0.9, wspace=0.25)
    FigureCanvasAgg(fig)
    return fig


def figure_png(fig) -> bytes:
    """PNG bytes of a Figure (no version metadata, so equal figures give equal bytes)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()
