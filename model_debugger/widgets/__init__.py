"""Notebook widgets (ipywidgets 8 + matplotlib): phase tracker, loss curves, gradients, findings.

Imported only by the notebook front end; importing :mod:`model_debugger` does not import them.
"""

from .curves import LossCurves
from .findings import FindingsTable
from .gradients import GradientPanel
from .progress import Progress
from .tracker import PhaseTracker

__all__ = ["FindingsTable", "GradientPanel", "LossCurves", "PhaseTracker", "Progress"]
