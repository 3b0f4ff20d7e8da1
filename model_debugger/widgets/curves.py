"""The loss-curve panel: train/validation loss and tracked metrics, NaN and OOM marked, live.

During ``%%reproduce`` a background thread reads the streaming record (``runs/<n>/record.jsonl``)
and redraws only when new events arrived, at most once per ``interval`` seconds, and spaced
further when a redraw costs more than :data:`SHARE` of the time between them (a redraw reads
every step of the run so far: a long run's redraws are spaced out, never a growing share of the
kernel's time, which the training thread shares). The panel is an interactive plotly chart (:mod:`.charts`: hover values, zoom, a
linear / log toggle, a smoothing slider); where plotly is not installed it falls back to a PNG
of the same figure (an Agg figure, no pyplot state). Neither touches anything the user's cell
uses, so drawing from the thread is safe.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

import ipywidgets as W

from ..figures import figure_png, loss_figure
from ..records import Run
from . import charts

INTERVAL = 1.0  # seconds between redraws while following a record, at least
SHARE = 0.02  # ... and at least 1 / SHARE times what the last redraw took


def curves_figure(run: Run, title: str = "Loss and metrics"):
    """Train loss per step, validation losses and other metrics, failures marked.

    The figure factory's loss figure with its metrics panel, live variant.
    """
    return loss_figure(run, title=title, metrics=True, live=True)


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
        lines = [line for line in chunk[:end].splitlines() if line.strip()]
        try:  # one parse for the whole chunk (a line-by-line parse costs several times more)
            new = json.loads(b"[" + b",".join(lines) + b"]")
        except (ValueError, UnicodeDecodeError):
            new = None
        if not isinstance(new, list) or len(new) != len(lines) or \
                not all(isinstance(e, dict) for e in new):
            # a broken line, or one that joined parses as several (``1,2``): one by one
            new = []
            for line in lines:
                try:
                    event = json.loads(line)
                except (ValueError, UnicodeDecodeError):
                    continue
                if isinstance(event, dict):
                    new.append(event)
        self.events += new
        return bool(new)


class LossCurves(W.VBox):
    """Loss and metric curves of the current run, redrawn live while a record is followed.

    Parameters
    ----------
    interactive : bool, optional
        A plotly chart (default: when plotly is installed) or a PNG image.

    Attributes
    ----------
    chart : plotly.graph_objects.FigureWidget or None
        The interactive chart (None in the PNG fallback, where ``image`` holds the picture).
    smoothing : ipywidgets.FloatSlider
        The EMA weight of the smoothed training loss (redraws the chart).
    """

    def __init__(self, interactive: bool | None = None) -> None:
        self.interactive = charts.available() if interactive is None else interactive
        self.image = W.Image(format="png")
        self.chart = charts.widget(charts.loss_chart([])) if self.interactive else None
        self.status = W.HTML("<small>no run yet</small>")
        self.smoothing = W.FloatSlider(value=charts.SMOOTHING, min=0.0, max=0.99, step=0.01,
                                       description="smoothing", continuous_update=False)
        self.redraws = 0
        self.run: Run | None = None
        self._structure: tuple | None = None
        self._lock = threading.Lock()
        shown = [self.chart, self.smoothing] if self.interactive else [self.image]
        super().__init__([self.status, *shown])
        self.smoothing.observe(self._resmooth, names="value")

    def _resmooth(self, _change=None) -> None:
        if self.run is not None:
            self.update(self.run)

    def update(self, run: Run, note: str = "") -> None:
        """Redraw from a run (thread-safe: one redraw at a time)."""
        with self._lock:
            self.run = run
            if self.interactive:
                spec = charts.loss_spec(run, smoothing=self.smoothing.value)
                shape = charts.structure(spec)
                charts.redraw(self.chart, spec, shape == self._structure)
                self._structure = shape
            else:
                self.image.value = figure_png(curves_figure(run))
            self.redraws += 1
            err = run.error
            state = f"ended with {err.get('type')}" if err else (
                "finished" if run.ended else "running")
            epochs = f"{run.epochs} epoch" + ("" if run.epochs == 1 else "s")
            self.status.value = (f"<small>{len(run.steps)} steps, {epochs}, "
                                 f"{state}{' - ' + note if note else ''}</small>")

    @contextmanager
    def follow(self, path_of: Callable[[], str | None], interval: float = INTERVAL,
               on_update: Callable[[Run], None] | None = None):
        """Redraw from the record ``path_of()`` names, in a background thread, until the block ends.

        The thread redraws only when new events arrived, at most once per ``interval`` seconds
        and within :data:`SHARE` of the time (the wait after a redraw is at least its cost over
        ``SHARE``), and never raises into the block; the last state is drawn when the block
        exits. ``on_update(run)`` follows every live redraw (the sidebar's "running" line).
        """
        follower = RecordFollower(path_of)
        stop = threading.Event()

        def loop() -> None:
            wait = interval
            while not stop.wait(wait):
                started = time.perf_counter()
                try:
                    if follower.poll():
                        run = Run(list(follower.events))
                        self.update(run, "live")
                        if on_update is not None:
                            on_update(run)
                except Exception:  # noqa: BLE001 - a drawing failure must not touch the run
                    pass
                wait = max(interval, (time.perf_counter() - started) / SHARE)

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
