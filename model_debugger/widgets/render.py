"""Figure helpers of the widgets: the figure factory's live variant (see :mod:`..figures`).

Widgets redraw often (live, from a background thread), so their figures skip the constrained
layout the export's figures use (it dominates the drawing time) and render at a lower DPI.
"""

from __future__ import annotations

from ..figures import LIVE_DPI as DPI
from ..figures import figure_png
from ..figures import new_figure as _new_figure

__all__ = ["DPI", "figure_png", "new_figure"]


def new_figure(width: float = 6.4, height: float = 3.6):
    """A Figure on its own Agg canvas, with fixed margins (the live variant)."""
    return _new_figure(width, height, live=True)
