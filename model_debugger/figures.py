"""The figure factory: every plot of a run or a verification, drawn once for exports and panels.

Each function takes records (:class:`~model_debugger.records.Run`) or a verification and returns
a :class:`matplotlib.figure.Figure` on its own Agg canvas, never registered with ``pyplot``, so
exports, the live widgets and tests draw without a display and without touching the user's
figures. ``live=True`` is the widgets' variant of the same figure: fixed margins instead of the
constrained layout (which dominates the drawing time of a redraw several times per second) and a
lower DPI. :func:`figure_png` turns a figure into PNG bytes without version metadata, so equal
figures give equal bytes. matplotlib is imported inside the functions so ``import
model_debugger`` stays light.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping

import numpy as np

from .records import Run, metric_role

MAX_MODULES = 8
WIDTH, HEIGHT, DPI = 6.4, 3.6, 100
LIVE_DPI = 80

__all__ = ["before_after_loss_figure", "figure_png", "first_nonfinite", "grad_norm_figure",
           "histogram_figure", "loss_figure", "new_figure", "verification_figure"]


def new_figure(width: float = WIDTH, height: float = HEIGHT, live: bool = False):
    """A Figure on its own Agg canvas (never registered with pyplot).

    Parameters
    ----------
    width, height : float
        Inches.
    live : bool
        The widgets' variant: fixed margins and :data:`LIVE_DPI` (fast to redraw); else the
        constrained layout at :data:`DPI` (exports).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if live:
        fig = Figure(figsize=(width, height), dpi=LIVE_DPI)
        fig.subplots_adjust(left=0.09, right=0.98, bottom=0.14, top=0.9, wspace=0.25)
    else:
        fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def figure_png(fig) -> bytes:
    """PNG bytes of a Figure at its own DPI, without the ``Software`` (version) metadata."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi, metadata={"Software": None})
    return buf.getvalue()


def _steps(run: Run) -> np.ndarray:
    idx = run.series("i")
    return idx if idx.size and np.all(np.isfinite(idx)) else np.arange(len(run.steps), dtype=float)


def _integer_steps(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _log_scale(ax, arrays: list[np.ndarray]) -> None:
    """Log y axis when every finite value is positive and they span more than two decades."""
    vals = np.concatenate([a[np.isfinite(a)] for a in arrays]) if arrays else np.array([])
    if vals.size and vals.min() > 0 and vals.max() / vals.min() > 100:
        ax.set_yscale("log")


def _empty(ax, what: str) -> None:
    ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes)


def first_nonfinite(run: Run) -> int | None:
    """The step of the first non-finite value the run recorded (or of its loss), or None."""
    first = run.first("nonfinite")
    if first is not None and first.get("step") is not None:
        return int(first["step"])
    loss = run.series("loss")
    bad = np.flatnonzero(~np.isfinite(loss)) if loss.size else []
    return int(_steps(run)[bad[0]]) if len(bad) else None


def _error_step(run: Run) -> tuple[str, int] | None:
    """``(what, step)`` of the error that ended a run (OOM, an exception), or None."""
    err = run.error
    if err is None:
        return None
    x = _steps(run)
    what = "OOM" if err.get("kind") == "oom" else err.get("type") or err.get("kind") or "error"
    return str(what), int(x[-1]) if x.size else 0


def loss_figure(runs: Run | list[Run], labels: list[str] | None = None,
                title: str = "Training loss per step", *, metrics: bool = False,
                live: bool = False):
    """Loss per optimizer step of one or more runs, validation losses as markers.

    The first non-finite step and the error that ended a run (an OOM) are marked.

    Parameters
    ----------
    runs : Run or list of Run
    labels : list of str, optional
        One legend label per run (default: none for one run, ``run 1``, ``run 2``, ... else).
    title : str
    metrics : bool
        Add a second panel with the tracked metrics that are not losses (the live panel).
    live : bool
        The widgets' variant (see :func:`new_figure`).

    Returns
    -------
    matplotlib.figure.Figure
    """
    runs = [runs] if isinstance(runs, Run) else list(runs)
    if labels is None:
        labels = [""] if len(runs) == 1 else [f"run {i + 1}" for i in range(len(runs))]
    # the metrics panel only when there is a metric to draw: no empty placeholder axes
    panel = metrics and any(points and not _is_loss(name) for run in runs
                            for name, points in run.metrics().items())
    fig = new_figure(7.0, 3.4, live) if panel else new_figure(live=live)
    ax = fig.add_subplot(1, 2, 1) if panel else fig.add_subplot()
    ax_met = fig.add_subplot(1, 2, 2) if panel else None
    chance = _majority_rate(runs) if panel else None
    curves = []
    for run, label in zip(runs, labels):
        pre = f"{label}: " if label else ""
        loss = run.series("loss")
        color = None
        if loss.size:
            (line,) = ax.plot(_steps(run), loss, lw=1.2, label=f"{pre}train loss")
            color = line.get_color()
            curves.append(loss)
            bad = first_nonfinite(run)
            if bad is not None:
                ax.axvline(bad, color=color, ls="--", lw=0.9,
                           label=f"{pre}first non-finite (step {bad})")
        for name, points in run.metrics().items():
            if not points:
                continue
            xs = [p[0] for p in points]
            ys = np.array([p[2] for p in points], dtype=float)
            role = metric_role(name)
            if role and role[1] == "loss" and (role[0] == "val" or metrics):
                ax.plot(xs, ys, "o-" if metrics else "o", ms=3, lw=0.8, label=f"{pre}{name}")
                curves.append(ys)
            elif ax_met is not None and not (role and role[1] == "loss"):
                ax_met.plot(xs, ys, "o-", ms=3, lw=0.8, label=f"{pre}{name}")
        ended = _error_step(run)
        if ended is not None:
            what, step = ended
            for a in (ax, ax_met) if ax_met is not None else (ax,):
                a.axvline(step, color=color or "black", ls=":", lw=1.2,
                          label=f"{pre}{what} at step {step}")
    _log_scale(ax, curves)
    if not curves:
        _empty(ax, "no loss recorded")
    ax.set_xlabel("step")
    _integer_steps(ax)
    ax.set_ylabel("loss")
    ax.set_title(title, **({"fontsize": 9} if panel else {}))
    if ax_met is not None:
        if chance is not None and any((metric_role(n) or ("", ""))[1] == "acc"
                                      for run in runs for n in run.metrics()):
            ax_met.axhline(chance, color="grey", ls="--", lw=0.9,
                           label=f"majority-class rate {chance:.3g} (chance)")
        ax_met.set_title("tracked metrics", fontsize=9)
        ax_met.set_xlabel("step")
    for a in (ax, ax_met):
        if a is not None and a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7, loc="best")
    return fig


def _is_loss(name: str) -> bool:
    role = metric_role(name)
    return bool(role and role[1] == "loss")


def _majority_rate(runs: list[Run]) -> float | None:
    """The accuracy of always predicting the majority class (the runs' last ``targets``)."""
    from .signals import constant_predictor

    for run in runs:
        targets = run.of("targets")
        if targets:
            rate = constant_predictor(targets[-1])[1]
            if rate is not None:
                return float(rate)
    return None


def grad_norm_figure(run: Run, title: str = "Gradient norms per step", live: bool = False):
    """The global gradient norm and the per-module norms (the largest few) of one run.

    Steps without norms (``norm_every``) are skipped: the lines join the measured steps.
    """
    fig = new_figure(live=live)
    ax = fig.add_subplot()
    x = _steps(run)
    gn = run.series("gn")
    curves = []
    if gn.size and np.isfinite(gn).any():
        ok = np.isfinite(gn)
        ax.plot(x[ok], gn[ok], color="black", lw=1.6, label="global")
        curves.append(gn)
    names, norms = run.module_norms()
    if names:
        with np.errstate(all="ignore"):
            finite = np.where(np.isfinite(norms), norms, np.nan)
            typical = [np.nanmedian(finite[:, j]) if np.isfinite(finite[:, j]).any() else -1.0
                       for j in range(len(names))]
        order = sorted(range(len(names)), key=lambda j: -typical[j])[:MAX_MODULES]
        for j in sorted(order):
            ok = np.isfinite(norms[:, j])
            ax.plot(x[ok], norms[ok, j], lw=0.9, label=f"module {names[j] or '(root)'}")
            curves.append(norms[:, j])
    bad = first_nonfinite(run)
    if bad is not None:
        ax.axvline(bad, color="red", ls="--", lw=0.9, label=f"first non-finite (step {bad})")
    _log_scale(ax, curves)
    if not curves:
        _empty(ax, "no gradient norms recorded")
    else:
        ax.legend(fontsize=7, loc="best", ncol=2)
    ax.set_xlabel("step")
    _integer_steps(ax)
    ax.set_ylabel("gradient L2 norm")
    ax.set_title(title)
    return fig


def histogram_figure(event: Mapping, live: bool = True):
    """One gradient histogram of a record's ``hist`` event (bin counts between ``lo``/``hi``)."""
    fig = new_figure(5.0, 2.8, live)
    ax = fig.add_subplot()
    counts = np.asarray(event.get("counts", []), dtype=float)
    if counts.size:
        edges = np.linspace(float(event["lo"]), float(event["hi"]), counts.size + 1)
        ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge")
    ax.set_title(f"{event.get('param')} gradient at step {event.get('step')}", fontsize=9)
    ax.set_xlabel("gradient value")
    ax.set_ylabel("count")
    return fig


def verification_figure(verification):
    """Per-seed values of the defining signal before and after the fix, with the noise band.

    ``verification`` is a :class:`~model_debugger.records.Verification` or its JSON.
    """
    v = verification.to_json() if hasattr(verification, "to_json") else dict(verification)
    fig = new_figure()
    ax = fig.add_subplot()
    seeds = v.get("seeds") or []
    before, after = v.get("before") or {}, v.get("after") or {}
    for pos, (name, side, color) in enumerate((("before", before, "tab:red"),
                                               ("after", after, "tab:green"))):
        vals = [x for x in side.get("values") or []
                if isinstance(x, (int, float)) and math.isfinite(x)]
        xs = np.full(len(vals), float(pos)) + np.linspace(-0.12, 0.12, len(vals)) * (len(vals) > 1)
        ax.plot(xs, vals, "o", color=color, label=f"{name} ({side.get('present', '?')} seeds "
                                                  "with the problem)")
        if side.get("mean") is not None:
            ax.hlines(side["mean"], pos - 0.25, pos + 0.25, color=color, lw=2)
    band = v.get("noise_band")
    if before.get("mean") is not None and band is not None:
        ax.axhspan(before["mean"] - band, before["mean"] + band, color="grey", alpha=0.2,
                   label=f"noise band ±{band:.3g}")
    ax.set_xticks([0, 1], ["before", "after"])
    ax.set_xlim(-0.6, 1.6)
    metric = v.get("metric") or "signal"
    scale = " (log10)" if v.get("scale") == "log10" else ""
    ax.set_ylabel(f"{metric}{scale}")
    ax.set_title(f"{v.get('category', '')}: {metric}, {v.get('direction', '?')} is better -> "
                 f"{v.get('verdict', '?')} ({len(seeds)} seeds)", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    return fig


def before_after_loss_figure(before: Mapping[int, Run], after: Mapping[int, Run]):
    """Loss curves of the unfixed (dashed) and fixed (solid) code, one colour per seed."""
    fig = new_figure()
    ax = fig.add_subplot()
    curves = []
    for i, seed in enumerate(sorted(set(before) | set(after), key=str)):
        for runs, style, name in ((before, "--", "before"), (after, "-", "after")):
            run = runs.get(seed)
            if run is None or not run.steps:
                continue
            loss = run.series("loss")
            ax.plot(_steps(run), loss, style, color=f"C{i % 10}", lw=1.1,
                    label=f"{name}, seed {seed}")
            curves.append(loss)
    _log_scale(ax, curves)
    if curves:
        ax.legend(fontsize=7, loc="best", ncol=2)
    else:
        _empty(ax, "no loss recorded")
    ax.set_xlabel("step")
    _integer_steps(ax)
    ax.set_ylabel("loss")
    ax.set_title("Loss before (dashed) and after (solid) the fix")
    return fig
