"""Interactive charts of runs for the live panels: plotly figures (hover, zoom, log toggle).

The panels draw with plotly (:class:`plotly.graph_objects.FigureWidget`, an anywidget in plotly
6 and later: no lab extension of its own to build), chosen over a chart of our own on
``anywidget`` because hover values, zoom, pan, a legend that toggles series and log axes come
with it. The exported record keeps the static matplotlib images of :mod:`model_debugger.figures`
(they render on GitHub and nbviewer); the two read the same series from the same
:class:`~model_debugger.records.Run`.

Every chart here is a plain function of runs that returns a ``go.Figure`` (tests read its
traces); :func:`widget` turns one into a ``FigureWidget``, and :func:`refill` replaces a live
widget's content in one batch, so a redraw is one message. One series per quantity: a
validation loss logged under two names (``val_loss`` and ``eval_loss``) is drawn once, and the
per-epoch training loss a framework logs is not drawn beside the per-step one. Metric panels
carry the majority-class rate (chance) on accuracy and the constant predictor's loss on the
loss; the first non-finite step and an out-of-memory end are marked.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..figures import _error_step, _majority_rate, _steps, first_nonfinite
from ..records import Run, metric_role

MAX_POINTS = 2000  # per series sent to the browser (evenly thinned beyond)
SMOOTHING = 0.6  # default EMA weight of the smoothed training loss (0: raw)
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf")

__all__ = ["available", "gradient_heatmap", "histogram_chart", "loss_chart", "loss_spec",
           "overlay_chart", "redraw", "refill", "smooth", "structure", "widget"]


def available() -> bool:
    """Whether plotly (6 or later, its widget on anywidget) can be used in this kernel."""
    try:
        import anywidget  # noqa: F401
        import plotly
    except ImportError:
        return False
    return int(plotly.__version__.split(".")[0]) >= 6


def smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """Exponential moving average (TensorBoard's smoothing), skipping non-finite values.

    ``weight`` in [0, 1): 0 returns the values; a non-finite value stays non-finite and does
    not enter the average.
    """
    values = np.asarray(values, dtype=float)
    if weight <= 0 or values.size == 0:
        return values
    out = np.empty_like(values)
    acc, norm = 0.0, 0.0
    for i, v in enumerate(values):
        if not np.isfinite(v):
            out[i] = v
            continue
        acc = weight * acc + (1 - weight) * v
        norm = weight * norm + (1 - weight)
        out[i] = acc / norm
    return out


def _thin(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At most :data:`MAX_POINTS` evenly spaced points, as float arrays (non-finite: NaN, a gap).

    plotly validates and sends NumPy arrays as typed buffers, a list value by value: a live
    redraw of a few thousand steps costs a few milliseconds instead of tens.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size > MAX_POINTS:
        keep = np.unique(np.linspace(0, x.size - 1, MAX_POINTS).astype(int))
        x, y = x[keep], y[keep]
    return x, np.where(np.isfinite(y), y, np.nan)


def _quantities(run: Run) -> dict[str, list[tuple[str, list, list]]]:
    """``{"loss": [(name, xs, ys)], "metric": [...]}``: one series per (split, kind) quantity.

    Of the names that mean the same quantity the one with most points is kept; a per-epoch
    training loss is dropped when the run has its per-step loss.
    """
    chosen: dict[tuple, tuple[str, list]] = {}
    other: list[tuple[str, list]] = []
    for name, points in run.metrics().items():
        if not points:
            continue
        role = metric_role(name)
        if role is None:
            other.append((name, points))
        elif role not in chosen or len(points) > len(chosen[role][1]):
            chosen[role] = (name, points)
    has_step_loss = bool(run.series("loss").size)
    out: dict[str, list] = {"loss": [], "metric": []}
    for role, (name, points) in chosen.items():
        if role == ("train", "loss") and has_step_loss:
            continue
        out["loss" if role[1] == "loss" else "metric"].append(
            (name, [p[0] for p in points], [p[2] for p in points]))
    out["metric"] += [(n, [p[0] for p in pts], [p[2] for p in pts]) for n, pts in other]
    return out


def _constant_loss(runs: list[Run]) -> float | None:
    from ..signals import constant_predictor

    for run in runs:
        targets = run.of("targets")
        if targets:
            loss = constant_predictor(targets[-1])[0]
            if loss is not None and np.isfinite(loss):
                return float(loss)
    return None


def loss_chart(runs: Run | list[Run], labels: list[str] | None = None, **kwargs):
    """Training loss per step (raw and smoothed), validation losses and metrics, failures marked.

    The figure of :func:`loss_spec` (same parameters).

    Returns
    -------
    plotly.graph_objects.Figure
    """
    import plotly.graph_objects as go

    return go.Figure(loss_spec(runs, labels, **kwargs))


def loss_spec(runs: Run | list[Run], labels: list[str] | None = None, *,
              smoothing: float = SMOOTHING, dash: list[str] | None = None,
              colors: list[int] | None = None, title: str = "Loss and metrics") -> dict:
    """The loss chart as a plain figure dict (``{"data": [...], "layout": {...}}``).

    Plain dicts cost a few milliseconds where plotly's objects (validated, templated) cost
    tens: the live panel builds one per redraw and hands plotly only what changed.

    Parameters
    ----------
    runs : Run or list of Run
    labels : list of str, optional
        A legend prefix per run (default: none for one run, ``run 1``, ... else).
    smoothing : float
        EMA weight of the smoothed training loss (0: only the raw curve).
    dash : list of str, optional
        A plotly dash style per run (``"solid"``, ``"dash"``): the Verify overlay draws the
        reproduction dashed and the fixed code solid.
    colors : list of int, optional
        A colour index per run (default: one colour each); the overlay gives a seed one colour.
    title : str

    Returns
    -------
    dict
        Loss on the left (with a linear / log toggle; logarithmic from the start when the
        losses are positive and span more than two decades, as in the exported figures),
        metrics on the right when any was tracked.
    """
    runs = [runs] if isinstance(runs, Run) else list(runs)
    if labels is None:
        labels = [""] if len(runs) == 1 else [f"run {i + 1}" for i in range(len(runs))]
    dash = dash or ["solid"] * len(runs)
    colors = colors or list(range(len(runs)))
    quantities = [_quantities(r) for r in runs]
    panel = any(q["metric"] for q in quantities)
    data: list[dict] = []
    shapes: list[dict] = []
    notes: list[dict] = []

    def scatter(xs, ys, name, pre, i, quantity, axis=1, **style) -> None:
        data.append({"type": "scatter", "x": xs, "y": ys, "name": _esc(f"{pre}{name}"),
                     "legendgroup": pre, "meta": {"quantity": quantity, "run": i},
                     "xaxis": "x" if axis == 1 else "x2", "yaxis": "y" if axis == 1 else "y2",
                     **style})

    for i, (run, label, q) in enumerate(zip(runs, labels, quantities)):
        color, style = COLORS[colors[i] % len(COLORS)], dash[i % len(dash)]
        pre = f"{label}: " if label else ""
        loss = run.series("loss")
        steps = _steps(run)
        if loss.size:
            x, y = _thin(steps, loss)
            scatter(x, y, "train loss", pre, i, "train_loss", mode="lines",
                    line={"color": color, "width": 1, "dash": style},
                    opacity=0.35 if smoothing > 0 else 1.0)
            if smoothing > 0:
                x, y = _thin(steps, smooth(loss, smoothing))
                scatter(x, y, "train loss (smoothed)", pre, i, "train_loss_smoothed",
                        mode="lines", line={"color": color, "width": 2, "dash": style})
        for name, xs, ys in q["loss"]:
            scatter(xs, _finite(ys), name, pre, i, name, mode="lines+markers",
                    marker={"size": 6, "color": color},
                    line={"dash": "dot" if style == "solid" else style, "color": color,
                          "width": 1})
        for j, (name, xs, ys) in enumerate(q["metric"]):
            scatter(xs, _finite(ys), name, pre, i, name, axis=2, mode="lines+markers",
                    marker={"size": 6, "color": COLORS[(i + j + 1) % len(COLORS)]},
                    line={"dash": style})
        bad = first_nonfinite(run)
        if bad is not None:
            _vline(shapes, notes, bad, f"{pre}first non-finite (step {bad})", "#d62728",
                   "dash", panel)
        ended = _error_step(run)
        if ended is not None:
            what, step = ended
            _vline(shapes, notes, step, f"{pre}{what} at step {step}", "black", "dot", panel)
    baseline = _constant_loss(runs)
    if baseline is not None:
        _hline(shapes, notes, baseline, f"constant predictor {baseline:.3g}", "")
    chance = _majority_rate(runs) if panel else None
    if chance is not None and any((metric_role(n) or ("", ""))[1] == "acc"
                                  for q in quantities for n, _, _ in q["metric"]):
        _hline(shapes, notes, chance, f"chance (majority class) {chance:.3g}", "2")
    layout = {
        "title": {"text": title, "font": {"size": 13}}, "height": 340, "hovermode": "x",
        "margin": {"l": 50, "r": 10, "t": 60, "b": 40}, "legend": {"font": {"size": 10}},
        "updatemenus": [_log_toggle()], "shapes": shapes, "annotations": notes,
        "xaxis": {"title": {"text": "step"}, "domain": [0.0, 0.44] if panel else [0.0, 1.0],
                  "anchor": "y"},
        "yaxis": {"type": "log" if _spans_decades(runs) else "linear", "anchor": "x"}}
    if panel:
        layout["xaxis2"] = {"title": {"text": "step"}, "domain": [0.56, 1.0], "anchor": "y2"}
        layout["yaxis2"] = {"anchor": "x2"}
        notes += [{"text": text, "x": x, "xref": "paper", "y": 1.0, "yref": "paper",
                   "showarrow": False, "xanchor": "center", "yanchor": "bottom",
                   "font": {"size": 12}} for text, x in (("loss", 0.22), ("tracked metrics",
                                                                              0.78))]
    return {"data": data, "layout": layout}


def _esc(text: str) -> str:
    """Recorded text (metric names, error types) made plotly text.

    plotly reads tags there (``<a href>``, ``<b>``) as markup: ``<``, ``>`` and ``&`` are escaped.
    """
    import html

    return html.escape(str(text), quote=False)


def _finite(values) -> list:
    return [float(v) if np.isfinite(v) else None for v in values]


def structure(spec: dict) -> tuple:
    """What a redraw cannot change by new x/y values alone: traces, marks, axis types."""
    layout = spec["layout"]
    return (tuple((t["name"], t["xaxis"]) for t in spec["data"]),
            tuple((s["x0"], s["y0"]) for s in layout["shapes"]),
            tuple(a["text"] for a in layout["annotations"]), layout["yaxis"]["type"],
            layout["title"]["text"])


def _spans_decades(runs: list[Run]) -> bool:
    """Every finite training loss positive, and the largest over 100x the smallest."""
    vals = np.concatenate([r.series("loss") for r in runs] or [np.array([])])
    vals = vals[np.isfinite(vals)]
    return bool(vals.size and vals.min() > 0 and vals.max() / vals.min() > 100)


def _vline(shapes: list, notes: list, x: float, text: str, color: str, dash: str,
           panel: bool) -> None:
    for axis in ("", "2") if panel else ("",):
        shapes.append({"type": "line", "xref": f"x{axis}", "yref": f"y{axis} domain", "x0": x,
                       "x1": x, "y0": 0, "y1": 1,
                       "line": {"color": color, "dash": dash, "width": 1.2}})
    notes.append({"text": _esc(text), "x": x, "xref": "x", "y": 1, "yref": "y domain",
                  "showarrow": False, "xanchor": "left", "yanchor": "top",
                  "font": {"size": 10, "color": color}})


def _hline(shapes: list, notes: list, y: float, text: str, axis: str) -> None:
    shapes.append({"type": "line", "xref": f"x{axis} domain", "yref": f"y{axis}", "x0": 0,
                   "x1": 1, "y0": y, "y1": y, "line": {"color": "grey", "dash": "dash",
                                                       "width": 1}})
    notes.append({"text": _esc(text), "x": 0, "xref": f"x{axis} domain", "y": y, "yref": f"y{axis}",
                  "showarrow": False, "xanchor": "left", "yanchor": "bottom",
                  "font": {"size": 10, "color": "grey"}})


def _log_toggle(axis: str = "yaxis") -> dict:
    """Two buttons above the chart: the loss axis linear or logarithmic."""
    return {"type": "buttons", "direction": "right", "x": 1.0, "xanchor": "right", "y": 1.25,
            "yanchor": "top", "showactive": True, "pad": {"r": 4, "t": 0},
            "buttons": [{"label": "linear", "method": "relayout", "args": [{f"{axis}.type": "linear"}]},
                        {"label": "log", "method": "relayout", "args": [{f"{axis}.type": "log"}]}]}


def overlay_chart(before: Mapping[int, Run], after: Mapping[int, Run],
                  smoothing: float = SMOOTHING):
    """Verify's overlay: each seed's reproduction (dashed) and fixed run (solid) on one chart."""
    runs, labels, dash, colors = [], [], [], []
    for k, seed in enumerate(sorted(set(before) | set(after), key=str)):
        for side, found, style in (("before", before, "dash"), ("after", after, "solid")):
            run = found.get(seed)
            if run is not None and run.steps:
                runs.append(run)
                labels.append(f"{side}, seed {seed}")
                dash.append(style)
                colors.append(k)
    return loss_chart(runs, labels, smoothing=smoothing, dash=dash, colors=colors,
                      title="Loss before (dashed) and after (solid) the fix")


def gradient_heatmap(run: Run, title: str = "Gradient norm per layer (log10)"):
    """Per-layer gradient norms over steps as a heatmap (log10; hover gives layer, step, norm)."""
    import plotly.graph_objects as go

    names, norms = run.module_norms()
    fig = go.Figure()
    if names:
        steps = _steps(run)
        keep = np.isfinite(norms).any(axis=1)
        x, z = steps[keep], norms[keep]
        if x.size > MAX_POINTS:
            idx = np.unique(np.linspace(0, x.size - 1, MAX_POINTS).astype(int))
            x, z = x[idx], z[idx]
        with np.errstate(all="ignore"):
            logz = np.where(np.isfinite(z) & (z > 0), np.log10(np.where(z > 0, z, 1.0)), np.nan)
        fig.add_trace(go.Heatmap(
            x=[float(v) for v in x], y=[_esc(n or "(root)") for n in names],
            z=[[None if not np.isfinite(v) else float(v) for v in row] for row in logz.T],
            colorscale="Viridis", colorbar={"title": {"text": "log10"}},
            customdata=[[None if not np.isfinite(v) else float(v) for v in row] for row in z.T],
            hovertemplate="layer %{y}<br>step %{x}<br>norm %{customdata:.3g}<extra></extra>"))
    bad = first_nonfinite(run)
    if bad is not None:
        fig.add_vline(x=bad, line={"color": "#d62728", "dash": "dash"},
                      annotation_text=f"first non-finite (step {bad})")
    fig.update_layout(title={"text": title, "font": {"size": 13}},
                      height=max(220, 60 + 22 * len(names)),
                      margin={"l": 90, "r": 10, "t": 50, "b": 40}, xaxis_title="step")
    return fig


def histogram_chart(event: Mapping | None):
    """One gradient histogram of a ``hist`` event (bin counts between ``lo`` and ``hi``)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    counts = np.asarray((event or {}).get("counts", []), dtype=float)
    if counts.size:
        edges = np.linspace(float(event["lo"]), float(event["hi"]), counts.size + 1)
        fig.add_trace(go.Bar(x=[float(v) for v in (edges[:-1] + edges[1:]) / 2],
                             y=[float(v) for v in counts], width=float(np.diff(edges)[0]),
                             hovertemplate="value %{x:.3g}<br>count %{y}<extra></extra>"))
        fig.update_layout(title={"text": _esc(f"{event.get('param')} gradient at step "
                                              f"{event.get('step')}"), "font": {"size": 12}})
    fig.update_layout(height=260, margin={"l": 50, "r": 10, "t": 40, "b": 40},
                      xaxis_title="gradient value", yaxis_title="count", bargap=0)
    return fig


def widget(fig):
    """A live ``FigureWidget`` of a figure."""
    import plotly.graph_objects as go

    return go.FigureWidget(fig)


def refill(target, fig) -> None:
    """Replace a ``FigureWidget``'s traces and layout by a new figure's (or spec's), in one update."""
    data, layout = (fig["data"], fig["layout"]) if isinstance(fig, dict) else \
        (list(fig.data), fig.layout)
    with target.batch_update():
        target.data = ()
        target.add_traces(data)
        target.layout = layout


def redraw(target, spec: dict, same_structure: bool) -> None:
    """Show ``spec`` in a live widget: only new x/y values when the structure is unchanged.

    A live redraw then costs a few milliseconds of the training process's time (one message of
    the changed arrays) instead of a rebuilt, re-validated figure.
    """
    if not same_structure or len(target.data) != len(spec["data"]):
        refill(target, spec)
        return
    with target.batch_update():
        for trace, new in zip(target.data, spec["data"]):
            trace.x, trace.y = new["x"], new["y"]
