"""The gradient panel: per-layer gradient-norm lines and a per-parameter histogram with a step slider.

Histograms come from the record's ``hist`` events (every ``hist_every`` optimizer steps, see
``capture/torch_instrument.py``); the slider picks the step, the dropdown the parameter.
"""

from __future__ import annotations

import ipywidgets as W
import numpy as np

from ..records import Run
from .render import figure_png, new_figure


def norms_figure(run: Run):
    """Per-module gradient norms per step (log scale when they span decades)."""
    try:
        from .._plots import grad_norm_figure
    except ImportError:  # pragma: no cover - only while _plots.py does not exist
        grad_norm_figure = None
    if grad_norm_figure is not None:
        return grad_norm_figure(run, title="Gradient norms per layer")
    fig = new_figure()  # pragma: no cover
    ax = fig.add_subplot()
    names, arr = run.module_norms()
    for j, name in enumerate(names[:8]):
        ax.plot(arr[:, j], lw=0.9, label=name or "(root)")
    ax.set_xlabel("step")
    ax.set_title("Gradient norms per layer")
    return fig


def histograms(run: Run) -> dict[str, list[dict]]:
    """``{param: [hist event, ...]}`` in step order."""
    out: dict[str, list[dict]] = {}
    for e in run.of("hist"):
        out.setdefault(e.get("param", "?"), []).append(e)
    return out


def histogram_figure(event: dict):
    """One gradient histogram (bin counts between ``lo`` and ``hi``)."""
    fig = new_figure(5.0, 2.8)
    ax = fig.add_subplot()
    counts = np.asarray(event.get("counts", []), dtype=float)
    if counts.size:
        edges = np.linspace(float(event["lo"]), float(event["hi"]), counts.size + 1)
        ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge")
    ax.set_title(f"{event.get('param')} gradient at step {event.get('step')}", fontsize=9)
    ax.set_xlabel("gradient value")
    ax.set_ylabel("count")
    return fig


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
