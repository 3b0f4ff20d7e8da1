"""The gradient panel: per-layer gradient-norm lines and a per-parameter histogram with a step slider.

Histograms come from the record's ``hist`` events (every ``hist_every`` optimizer steps, see
``capture/torch_instrument.py``); the slider picks the step, the dropdown the parameter.
"""

from __future__ import annotations

import ipywidgets as W

from ..figures import figure_png, grad_norm_figure, histogram_figure
from ..records import Run

__all__ = ["GradientPanel", "histogram_figure", "histograms", "norms_figure"]


def norms_figure(run: Run):
    """Per-module gradient norms per step (log scale when they span decades), live variant."""
    return grad_norm_figure(run, title="Gradient norms per layer", live=True)


def histograms(run: Run) -> dict[str, list[dict]]:
    """``{param: [hist event, ...]}`` in step order."""
    out: dict[str, list[dict]] = {}
    for e in run.of("hist"):
        out.setdefault(e.get("param", "?"), []).append(e)
    return out


class GradientPanel(W.VBox):
    """Gradient-norm lines plus a histogram browser (parameter dropdown, step slider)."""

    def __init__(self) -> None:
        self.norms = W.Image(format="png")
        self.param = W.Dropdown(description="parameter", options=[])
        self.step = W.IntSlider(description="hist step", min=0, max=0, value=0,
                                continuous_update=False)
        self.histogram = W.Image(format="png")
        self.note = W.HTML("<small>no run yet</small>")
        self._hists: dict[str, list[dict]] = {}
        self.param.observe(self._select, names="value")
        self.step.observe(self._draw, names="value")
        super().__init__([self.note, self.norms, W.HBox([self.param, self.step]),
                          self.histogram])

    def update(self, run: Run) -> None:
        """Show one run's gradients."""
        self.norms.value = figure_png(norms_figure(run))
        self._hists = histograms(run)
        n = sum(len(v) for v in self._hists.values())
        self.note.value = (f"<small>{len(run.steps)} steps; {n} gradient histograms over "
                           f"{len(self._hists)} parameters</small>")
        options = list(self._hists)
        self.param.options = options
        if options:
            self.param.value = options[0]
            self._select()
        else:
            self.histogram.value = b""

    def _select(self, _change=None) -> None:
        events = self._hists.get(self.param.value) or []
        self.step.max = max(len(events) - 1, 0)
        self.step.value = min(self.step.value, self.step.max)
        self._draw()

    def _draw(self, _change=None) -> None:
        events = self._hists.get(self.param.value) or []
        if events:
            event = events[min(self.step.value, len(events) - 1)]
            self.step.description = f"step {event.get('step')}"
            self.histogram.value = figure_png(histogram_figure(event))
