"""Progress of long actions (probes, Verify runs), ticked by a background thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

import ipywidgets as W


class Progress(W.HBox):
    """A progress bar and a label.

    :meth:`step` is a phase's ``progress(done, total)`` callback; :meth:`track` moves it from a
    clock while a block runs. Used as a context manager, the bar is finished on exit.

    Parameters
    ----------
    description : str
    on_move : callable, optional
        ``on_move(fraction, label)`` after every move (the sidebar shows it); never raises
        into the action.
    on_close : callable, optional
        Called once when the action ends (the ``with`` block, or :meth:`track`'s).
    """

    def __init__(self, description: str = "", on_move=None, on_close=None) -> None:
        self.bar = W.FloatProgress(value=0.0, min=0.0, max=1.0, description=description)
        self.label = W.Label("")
        self._on_move, self._on_close = on_move, on_close
        super().__init__([self.bar, self.label])

    def __enter__(self) -> Progress:
        self._moved()
        return self

    def __exit__(self, *exc) -> None:
        self.finish()

    def finish(self) -> None:
        """The action ended: tell ``on_close`` (once)."""
        close, self._on_close = self._on_close, None
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001 - progress must never break the action
                pass

    def _moved(self) -> None:
        if self._on_move is not None:
            try:
                self._on_move(self.bar.value, self.label.value)
            except Exception:  # noqa: BLE001 - progress must never break the action
                pass

    def step(self, done: int, total: int, what: str = "run") -> None:
        """``done`` of ``total`` finished (a phase's ``progress`` callback)."""
        self.bar.value = min(max(done / total, 0.0), 1.0) if total else 1.0
        self.label.value = f"{what} {done} of {total}"
        self._moved()

    @contextmanager
    def track(self, fraction: Callable[[float], tuple[float, str]], interval: float = 0.5):
        """Run the block while ``fraction(elapsed)`` -> ``(0..1, label)`` moves the bar."""
        stop = threading.Event()
        t0 = time.monotonic()

        def move() -> None:
            try:
                value, text = fraction(time.monotonic() - t0)
                self.bar.value, self.label.value = min(max(value, 0.0), 1.0), text
                self._moved()
            except Exception:  # noqa: BLE001 - progress must never break the action
                pass

        def tick() -> None:
            while not stop.wait(interval):
                move()

        move()  # the first reading at once: a short action must not show an empty label
        thread = threading.Thread(target=tick, name="model_debugger-progress", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join(timeout=5)
            self.bar.value = 1.0
            self.label.value = f"done in {time.monotonic() - t0:.1f} s"
