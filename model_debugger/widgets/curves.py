"""The loss-curve panel: train/validation loss and tracked metrics, NaN and OOM marked, live.

During ``%%reproduce`` a background thread reads the streaming record (``runs/<n>/record.jsonl``)
a few times per second and redraws only when new events arrived, at most ``1 / interval`` times
per second. Figures are plain Agg figures rendered to PNG (no pyplot state), so drawing from the
thread does not touch anything the user's cell uses.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from contextlib import contextmanager

import ipywidgets as W
import numpy as np

from ..records import Run, metric_role
from .render import figure_png, new_figure

INTERVAL = 0.5  # seconds between redraws while following a record


def curves_figure(run: Run, title: str = "Loss and metrics"):
    """Train loss per step, validation losses and other metrics per report, failures marked."""
    fig = new_figure(7.0, 3.4)
    ax_loss = fig.add_subplot(1, 2, 1)
    ax_met = fig.add_subplot(1, 2, 2)
    steps = run.steps
    x = np.arange(len(steps), dtype=float)
    loss = run.series("loss")
    if loss.size:
        ax_loss.plot(x, loss, lw=1.0, label="train loss (per step)")
        bad = np.flatnonzero(~np.isfinite(loss))
        if bad.size:
            ax_loss.axvline(bad[0], color="red", ls="--", lw=1.0, label=f"NaN/inf at step {bad[0]}")
    metrics = run.metrics()
    has_metric = False
    for name, points in metrics.items():
        xs = [p[0] for p in points]
        ys = [p[2] for p in points]
        if metric_role(name) and metric_role(name)[1] == "loss":
            ax_loss.plot(xs, ys, "o-", ms=3, lw=0.8, label=f"{name} (per report)")
        else:
            ax_met.plot(xs, ys, "o-", ms=3, lw=0.8, label=name)
            has_metric = True
    err = run.error
    if err is not None:
        where = max(len(steps) - 1, 0)
        label = "OOM" if err.get("kind") == "oom" else err.get("kind") or err.get("type")
        for ax in (ax_loss, ax_met):
            ax.axvline(where, color="black", ls=":", lw=1.2, label=f"{label} at step {where}")
    finite = loss[np.isfinite(loss)] if loss.size else loss
    if finite.size and finite.min() > 0 and finite.max() / finite.min() > 100:
        ax_loss.set_yscale("log")
    ax_loss.set_title(title, fontsize=9)
    ax_loss.set_xlabel("step")
    ax_met.set_title("tracked metrics" if has_metric else "no tracked metrics yet", fontsize=9)
    ax_met.set_xlabel("step")
    for ax in (ax_loss, ax_met):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    return fig


class RecordFollower:
    """Read new complete lines of a growing JSON-lines record, from whichever file is current."""

    def __init__(self, path_of: Callable[[], str | None]) -> None:
        self.path_of = path_of
        self.path: str | None = None
        self.offset = 0
        self.events: list[dict] = []

    def poll(self) -> bool:
        """Read what was appended since the last call; True when new events arrived."""
        path = self.path_of()
        if path != self.path:
            self.path, self.offset, self.events = path, 0, []
        if not path or not os.path.exists(path):
            return False
        with open(path, "rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n")
        if end < 0:
            return False
        self.offset += end + 1
        new = []
        for line in chunk[:end].splitlines():
            try:
                new.append(json.loads(line))
            except (ValueError, UnicodeDecodeError):
                continue
        self.events += new
        return bool(new)


class LossCurves(W.VBox):
    """Loss and metric curves of the current run, redrawn live while a record is followed."""

    def __init__(self) -> None:
        self.image = W.Image(format="png")
        self.status = W.HTML("<small>no run yet</small>")
        self.redraws = 0
        self._lock = threading.Lock()
        super().__init__([self.status, self.image])

    def update(self, run: Run, note: str = "") -> None:
        """Redraw from a run (thread-safe: one redraw at a time)."""
        with self._lock:
            png = figure_png(curves_figure(run))
            self.image.value = png
            self.redraws += 1
            err = run.error
            state = f"ended with {err.get('type')}" if err else (
                "finished" if run.ended else "running")
            self.status.value = (f"<small>{len(run.steps)} steps, {run.epochs} epochs, "
                                 f"{state}{' - ' + note if note else ''}</small>")

    @contextmanager
    def follow(self, path_of: Callable[[], str | None], interval: float = INTERVAL):
        """Redraw from the record ``path_of()`` names, in a background thread, until the block ends.

        The thread redraws only when new events arrived, at most once per ``interval`` seconds,
        and never raises into the block; the last state is drawn when the block exits.
        """
        follower = RecordFollower(path_of)
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(interval):
                try:
                    if follower.poll():
                        self.update(Run(list(follower.events)), "live")
                except Exception:  # noqa: BLE001 - a drawing failure must not touch the run
                    continue

        thread = threading.Thread(target=loop, name="model_debugger-curves", daemon=True)
        thread.start()
        try:
            yield follower
        finally:
            stop.set()
            thread.join(timeout=5)
            path = path_of()
            if path and os.path.exists(path):
                self.update(Run.load(path))
