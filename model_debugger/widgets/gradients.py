"""The gradient panel: a per-layer gradient-norm heatmap over steps and a per-parameter histogram.

Histograms come from the record's ``hist`` events (every ``hist_every`` optimizer steps, see
``capture/torch_instrument.py``); the slider picks the step, the dropdown the parameter. The
charts are interactive plotly figures (:mod:`.charts`), PNG images where plotly is missing. A
run without histograms (Keras records none) shows no histogram browser at all, only a line
saying so, never an empty picture.
"""

from __future__ import annotations

import ipywidgets as W

from ..figures import figure_png, grad_norm_figure, histogram_figure
from ..records import Run
from . import charts

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
    """A gradient-norm heatmap (layer x step) plus a histogram browser (parameter, step slider).

    Parameters
    ----------
    interactive : bool, optional
        plotly charts (default: when plotly is installed) or PNG images (``norms``,
        ``histogram``: norm lines and the histogram).
    """

    def __init__(self, interactive: bool | None = None) -> None:
        self.interactive = charts.available() if interactive is None else interactive
        self.norms = W.Image(format="png")
        self.histogram = W.Image(format="png")
        self.heatmap = charts.widget(charts.gradient_heatmap(Run([]))) if self.interactive \
            else None
        self.hist_chart = charts.widget(charts.histogram_chart(None)) if self.interactive \
            else None
        self.param = W.Dropdown(description="parameter", options=[])
        self.step = W.IntSlider(description="hist step", min=0, max=0, value=0,
                                continuous_update=False)
        self.note = W.HTML("<small>no run yet</small>")
        self._hists: dict[str, list[dict]] = {}
        self.param.observe(self._select, names="value")
        self.step.observe(self._draw, names="value")
        self.browser = W.VBox([W.HBox([self.param, self.step]),
                               self.hist_chart if self.interactive else self.histogram])
        self.browser.layout.display = "none"
        super().__init__([self.note, self.heatmap if self.interactive else self.norms,
                          self.browser])

    def update(self, run: Run) -> None:
        """Show one run's gradients."""
        if self.interactive:
            charts.refill(self.heatmap, charts.gradient_heatmap(run))
        else:
            self.norms.value = figure_png(norms_figure(run))
        self._hists = histograms(run)
        n = sum(len(v) for v in self._hists.values())
        names, _ = run.module_norms()
        self.note.value = (f"<small>{len(run.steps)} steps; gradient norms of {len(names)} "
                           f"layers; " + (f"{n} gradient histograms over {len(self._hists)} "
                                          "parameters" if n else
                                          "no gradient histograms recorded") + "</small>")
        options = list(self._hists)
        self.param.options = options
        self.browser.layout.display = None if options else "none"
        if options:
            self.param.value = options[0]
            self._select()

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
            if self.interactive:
                charts.refill(self.hist_chart, charts.histogram_chart(event))
            else:
                self.histogram.value = figure_png(histogram_figure(event))
