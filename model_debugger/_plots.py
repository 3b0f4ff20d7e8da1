"""Plots of runs and verifications as matplotlib Figures (Agg, no pyplot state).

Every function takes records (:class:`~model_debugger.records.Run`) or a verification dict and
returns a :class:`matplotlib.figure.Figure` attached to an Agg canvas, so exports, widgets and
tests can render them without a display and without touching ``pyplot``'s global figures.
:func:`figure_png` turns one into PNG bytes (deterministic: no timestamp or version metadata).
matplotlib is imported inside the functions so ``import model_debugger`` stays light.
"""

from __future__ import annotations

import io
import math

import numpy as np

from .records import Run, metric_role

MAX_MODULES = 8
WIDTH, HEIGHT, DPI = 6.4, 3.6, 100


def new_figure(width: float = WIDTH, height: float = HEIGHT):
    """A Figure on its own Agg canvas (never registered with pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def figure_png(fig) -> bytes:
    """Render a Figure to PNG bytes, without the ``Software`` (version) metadata."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
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


def first_nonfinite(run: Run) -> int | None:
    first = run.first("nonfinite")
    if first is not None and first.get("step") is not None:
        return int(first["step"])
    loss = run.series("loss")
    bad = np.flatnonzero(~np.isfinite(loss)) if loss.size else []
    return int(_steps(run)[bad[0]]) if len(bad) else None


def loss_figure(runs: Run | list[Run], labels: list[str] | None = None,
                title: str = "Training loss per step"):
    """Loss per optimizer step of one or more runs, validation losses as markers.

    Parameters
    ----------
    runs : Run or list of Run
    labels : list of str, optional
        One legend label per run (default ``run 1``, ``run 2``, ...).
    title : str

    Returns
    -------
    matplotlib.figure.Figure
    """
    runs = [runs] if isinstance(runs, Run) else list(runs)
    labels = labels or [f"run {i + 1}" for i in range(len(runs))]
    fig = new_figure()
    ax = fig.add_subplot()
    curves = []
    for run, label in zip(runs, labels):
        loss = run.series("loss")
        if loss.size:
            (line,) = ax.plot(_steps(run), loss, lw=1.2, label=f"{label}: train loss")
            curves.append(loss)
            bad = first_nonfinite(run)
            if bad is not None:
                ax.axvline(bad, color=line.get_color(), ls="--", lw=0.9,
                           label=f"{label}: first non-finite (step {bad})")
        for name, points in run.metrics().items():
            if metric_role(name) == ("val", "loss") and points:
                xs = [p[0] for p in points]
                ys = np.array([p[2] for p in points], dtype=float)
                ax.plot(xs, ys, "o", ms=3, label=f"{label}: {name}")
                curves.append(ys)
    _log_scale(ax, curves)
    if not curves:
        ax.text(0.5, 0.5, "no loss recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    _integer_steps(ax)
    ax.set_ylabel("loss")
    ax.set_title(title)
    if curves:
        ax.legend(fontsize=7, loc="best")
    return fig


def grad_norm_figure(run: Run, title: str = "Gradient norms per step"):
    """The global gradient norm and the per-module norms (the largest few) of one run."""
    fig = new_figure()
    ax = fig.add_subplot()
    x = _steps(run)
    gn = run.series("gn")
    curves = []
    if gn.size and np.isfinite(gn).any():  # steps without norms (norm_every) are skipped
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
        ax.text(0.5, 0.5, "no gradient norms recorded", ha="center", va="center",
                transform=ax.transAxes)
    else:
        ax.legend(fontsize=7, loc="best", ncol=2)
    ax.set_xlabel("step")
    _integer_steps(ax)
    ax.set_ylabel("gradient L2 norm")
    ax.set_title(title)
    return fig


def verification_figure(verification: dict):
    """Per-seed values of the defining signal before and after the fix, with the noise band."""
    fig = new_figure()
    ax = fig.add_subplot()
    seeds = verification.get("seeds") or []
    before, after = verification.get("before") or {}, verification.get("after") or {}
    for pos, (name, side, color) in enumerate((("before", before, "tab:red"),
                                               ("after", after, "tab:green"))):
        vals = [v for v in side.get("values") or [] if v is not None and math.isfinite(v)]
        xs = np.full(len(vals), float(pos)) + np.linspace(-0.12, 0.12, len(vals)) * (len(vals) > 1)
        ax.plot(xs, vals, "o", color=color, label=f"{name} ({side.get('present', '?')} seeds "
                                                  "with the problem)")
        if side.get("mean") is not None:
            ax.hlines(side["mean"], pos - 0.25, pos + 0.25, color=color, lw=2)
    band = verification.get("noise_band")
    if before.get("mean") is not None and band is not None:
        ax.axhspan(before["mean"] - band, before["mean"] + band, color="grey", alpha=0.2,
                   label=f"noise band ±{band:.3g}")
    ax.set_xticks([0, 1], ["before", "after"])
    ax.set_xlim(-0.6, 1.6)
    metric = verification.get("metric", "signal")
    scale = " (log10)" if verification.get("scale") == "log10" else ""
    ax.set_ylabel(f"{metric}{scale}")
    ax.set_title(f"{verification.get('category', '')}: {metric}, "
                 f"{verification.get('direction', '?')} is better -> "
                 f"{verification.get('verdict', '?')} ({len(seeds)} seeds)", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    return fig


def before_after_loss_figure(before: dict[int, Run], after: dict[int, Run]):
    """Loss curves of the unfixed (dashed) and fixed (solid) code, one colour per seed."""
    fig = new_figure()
    ax = fig.add_subplot()
    curves = []
    colors = [f"C{i}" for i in range(10)]
    for i, seed in enumerate(sorted(set(before) | set(after), key=str)):
        for runs, style, name in ((before, "--", "before"), (after, "-", "after")):
            run = runs.get(seed)
            if run is None or not run.steps:
                continue
            loss = run.series("loss")
            ax.plot(_steps(run), loss, style, color=colors[i % 10], lw=1.1,
                    label=f"{name}, seed {seed}")
            curves.append(loss)
    _log_scale(ax, curves)
    if curves:
        ax.legend(fontsize=7, loc="best", ncol=2)
    else:
        ax.text(0.5, 0.5, "no loss recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    _integer_steps(ax)
    ax.set_ylabel("loss")
    ax.set_title("Loss before (dashed) and after (solid) the fix")
    return fig
