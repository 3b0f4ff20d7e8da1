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

__all__ = ["available", "gradient_heatmap", "histogram_chart", "loss_chart", "overlay_chart",
           "refill", "smooth", "widget"]


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


def _thin(x: np.ndarray, y: np.ndarray) -> tuple[list, list]:
    if x.size > MAX_POINTS:
        keep = np.unique(np.linspace(0, x.size - 1, MAX_POINTS).astype(int))
        x, y = x[keep], y[keep]
    return [float(v) for v in x], [float(v) if np.isfinite(v) else None for v in y]


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


def loss_chart(runs: Run | list[Run], labels: list[str] | None = None, *,
               smoothing: float = SMOOTHING, dash: list[str] | None = None,
               colors: list[int] | None = None, title: str = "Loss and metrics"):
    """Training loss per step (raw and smoothed), validation losses and metrics, failures marked.

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
    plotly.graph_objects.Figure
        Loss on the left (with a linear / log toggle; logarithmic from the start when the
        losses are positive and span more than two decades, as in the exported figures),
        metrics on the right when any was tracked.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    runs = [runs] if isinstance(runs, Run) else list(runs)
    if labels is None:
        labels = [""] if len(runs) == 1 else [f"run {i + 1}" for i in range(len(runs))]
    dash = dash or ["solid"] * len(runs)
    colors = colors or list(range(len(runs)))
    quantities = [_quantities(r) for r in runs]
    panel = any(q["metric"] for q in quantities)
    fig = make_subplots(rows=1, cols=2 if panel else 1, horizontal_spacing=0.12,
                        subplot_titles=("loss", "tracked metrics") if panel else None)
    for i, (run, label, q) in enumerate(zip(runs, labels, quantities)):
        color, style = COLORS[colors[i] % len(COLORS)], dash[i % len(dash)]
        pre = f"{label}: " if label else ""
        loss = run.series("loss")
        steps = _steps(run)
        if loss.size:
            x, y = _thin(steps, loss)
            fig.add_trace(go.Scatter(
                x=x, y=y, mode="lines", name=f"{pre}train loss", legendgroup=pre,
                line={"color": color, "width": 1, "dash": style},
                opacity=0.35 if smoothing > 0 else 1.0,
                meta={"quantity": "train_loss", "run": i}), row=1, col=1)
            if smoothing > 0:
                x, y = _thin(steps, smooth(loss, smoothing))
                fig.add_trace(go.Scatter(
                    x=x, y=y, mode="lines", name=f"{pre}train loss (smoothed)",
                    legendgroup=pre, line={"color": color, "width": 2, "dash": style},
                    meta={"quantity": "train_loss_smoothed", "run": i}), row=1, col=1)
        for name, xs, ys in q["loss"]:
            fig.add_trace(go.Scatter(
                x=xs, y=[v if np.isfinite(v) else None for v in ys], mode="lines+markers",
                name=f"{pre}{name}", legendgroup=pre, marker={"size": 6, "color": color},
                line={"dash": "dot" if style == "solid" else style, "color": color, "width": 1},
                meta={"quantity": name, "run": i}), row=1, col=1)
        for j, (name, xs, ys) in enumerate(q["metric"]):
            fig.add_trace(go.Scatter(
                x=xs, y=[v if np.isfinite(v) else None for v in ys], mode="lines+markers",
                name=f"{pre}{name}", legendgroup=pre,
                marker={"size": 6, "color": COLORS[(i + j + 1) % len(COLORS)]},
                line={"dash": style}, meta={"quantity": name, "run": i}), row=1, col=2)
        bad = first_nonfinite(run)
        if bad is not None:
            _vline(fig, bad, f"{pre}first non-finite (step {bad})", "#d62728", "dash", panel)
        ended = _error_step(run)
        if ended is not None:
            what, step = ended
            _vline(fig, step, f"{pre}{what} at step {step}", "black", "dot", panel)
    baseline = _constant_loss(runs)
    if baseline is not None:
        fig.add_hline(y=baseline, line={"color": "grey", "dash": "dash", "width": 1},
                      annotation_text=f"constant predictor {baseline:.3g}",
                      annotation_position="bottom left", row=1, col=1)
    chance = _majority_rate(runs) if panel else None
    if chance is not None and any((metric_role(n) or ("", ""))[1] == "acc"
                                  for q in quantities for n, _, _ in q["metric"]):
        fig.add_hline(y=chance, line={"color": "grey", "dash": "dash", "width": 1},
                      annotation_text=f"chance (majority class) {chance:.3g}",
                      annotation_position="bottom left", row=1, col=2)
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(type="log" if _spans_decades(runs) else "linear", row=1, col=1)
    fig.update_layout(
        title={"text": title, "font": {"size": 13}}, height=340, hovermode="x",
        margin={"l": 50, "r": 10, "t": 60, "b": 40}, legend={"font": {"size": 10}},
        updatemenus=[_log_toggle()])
    return fig


def _spans_decades(runs: list[Run]) -> bool:
    """Every finite training loss positive, and the largest over 100x the smallest."""
    vals = np.concatenate([r.series("loss") for r in runs] or [np.array([])])
    vals = vals[np.isfinite(vals)]
    return bool(vals.size and vals.min() > 0 and vals.max() / vals.min() > 100)


def _vline(fig, x: float, text: str, color: str, dash: str, panel: bool) -> None:
    for col in (1, 2) if panel else (1,):
        fig.add_vline(x=x, line={"color": color, "dash": dash, "width": 1.2}, row=1, col=col,
                      annotation_text=text if col == 1 else None,
                      annotation_position="top right")


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
            x=[float(v) for v in x], y=[n or "(root)" for n in names],
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
        fig.update_layout(title={"text": f"{event.get('param')} gradient at step "
                                         f"{event.get('step')}", "font": {"size": 12}})
    fig.update_layout(height=260, margin={"l": 50, "r": 10, "t": 40, "b": 40},
                      xaxis_title="gradient value", yaxis_title="count", bargap=0)
    return fig


def widget(fig):
    """A live ``FigureWidget`` of a figure."""
    import plotly.graph_objects as go

    return go.FigureWidget(fig)


def refill(target, fig) -> None:
    """Replace a ``FigureWidget``'s traces and layout by a new figure's, in one update."""
    with target.batch_update():
        target.data = ()
        target.add_traces(list(fig.data))
        target.layout = fig.layout
