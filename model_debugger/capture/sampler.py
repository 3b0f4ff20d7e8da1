"""Where a training step's unaccounted time goes: the user's line, sampled.

A step's time is data wait, forward, backward and the optimizer step, and the rest: what the
loop itself does per step (a ``time.sleep``, a synchronous log or checkpoint, a host copy, a
metric computed on the CPU). When the capture sees that rest dominate, a :class:`LineSampler`
thread looks at the training thread every few milliseconds while it is outside those four and
counts the user's line it is on: a direct measurement of where the time goes.

:class:`OverheadWatch` (mixed into both instruments) decides when to start one: after the first
steps, when the rest of each step dominates.

Importing this module imports neither torch nor tensorflow.
"""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Callable

from .codeloc import is_user_file, user_frame

INTERVAL = 0.005  # seconds between samples
MAX_SAMPLES = 20_000  # then it stops: enough to rank the lines
# the loop's own time per step (not data, forward, backward or the optimizer): after this many
# steps, when its median is >= OVERHEAD_SECONDS and >= OVERHEAD_SHARE of the step, the user's
# lines it is spent on are sampled (``step_overhead``)
OVERHEAD_AFTER = 32
OVERHEAD_SECONDS = 0.005
OVERHEAD_SHARE = 0.3


class LineSampler:
    """Counts the user's line the training thread is on, while ``idle()`` says it is idle.

    Parameters
    ----------
    thread_id : int
        The training thread (``threading.get_ident()`` of the thread that trains).
    idle : callable
        True while the thread is outside data loading, forward, backward and the optimizer.
    loop_code : code object or collection of code objects, optional
        The code of the training loop: the user's function that steps the optimizer, or every
        user function on the stack when it stepped (a ``training_step`` method called by the
        ``fit`` that loops). Each sample also counts the line of the innermost of these its own
        stack passes through (``loop_counts``): the call in the loop behind time spent deeper
        (a ``validate()`` it calls every step, a helper).
    """

    def __init__(self, thread_id: int, idle: Callable[[], bool], loop_code=None) -> None:
        self._thread_id = thread_id
        self._idle = idle
        self._loop_code = None if loop_code is None else frozenset(
            loop_code if isinstance(loop_code, (set, frozenset, list, tuple)) else (loop_code,))
        self.loop_counts: collections.Counter = collections.Counter()
        self._stop = threading.Event()
        self.counts: collections.Counter = collections.Counter()
        self.samples = 0  # samples taken while idle (lines in user code or not)
        self._thread = threading.Thread(target=self._loop, name="model-debugger-sampler",
                                        daemon=True)

    def start(self) -> LineSampler:
        """Start sampling; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop and wait for the sampling thread (idempotent)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    def _loop(self) -> None:
        while not self._stop.wait(INTERVAL) and self.samples < MAX_SAMPLES:
            try:
                if not self._idle():
                    continue
                frame = sys._current_frames().get(self._thread_id)
                if frame is None:
                    return  # the training thread is gone
                self.samples += 1
                f = user_frame(frame)
                if f is not None:
                    self.counts[(f.f_code.co_filename, f.f_lineno)] += 1
                    g = f
                    while g is not None and self._loop_code is not None and \
                            g.f_code not in self._loop_code:
                        g = g.f_back
                    if g is not None and self._loop_code is not None:
                        self.loop_counts[(g.f_code.co_filename, g.f_lineno)] += 1
                    del g
                del frame, f
            except Exception:  # noqa: BLE001 - sampling is best effort, never a failure
                return

    def top(self, n: int = 5, loop: bool = False) -> list[dict]:
        """The ``n`` lines sampled most: ``{"file", "line", "share"}`` of the idle samples.

        With ``loop``, the training loop's own lines (``loop_counts``).
        """
        if not self.samples:
            return []
        counts = self.loop_counts if loop else self.counts
        return [{"file": f, "line": line, "share": round(c / self.samples, 4)}
                for (f, line), c in counts.most_common(n)]


class OverheadWatch:
    """The first steps' timings; a :class:`LineSampler` when the loop's own time dominates them.

    The instrument defines ``_idle()`` (outside data loading, forward, backward and the step),
    ``hold`` and ``rec``, calls :meth:`_init_overhead` once, :meth:`_watch_overhead` per step
    and :meth:`_emit_overhead` when the capture ends.
    """

    def _init_overhead(self) -> None:
        self._early: list[tuple] | None = []  # (dt, data wait, busy) of the first steps
        self._sampler: LineSampler | None = None

    def _idle(self) -> bool:  # pragma: no cover - each instrument defines it
        raise NotImplementedError

    def _watch_overhead(self, dt: float, dw: float, busy: float, thread_id: int | None = None,
                        loop_code=None) -> None:
        """Keep one step's timings; after the first steps, sample if the rest dominates.

        ``thread_id`` and ``loop_code`` name the training thread and the user's loop function
        (by default the calling thread and the user's frame that called: a step hook that runs
        on another thread, inside a traced function, passes them).
        """
        if self._early is None:
            return
        self._early.append((dt, dw, busy))
        if len(self._early) < OVERHEAD_AFTER:
            return
        rest = sorted(max(0.0, d - w - b) for d, w, b in self._early[1:])
        share = sorted(max(0.0, d - w - b) / d for d, w, b in self._early[1:] if d > 0)
        self._early = None
        median = rest[len(rest) // 2]
        if median >= OVERHEAD_SECONDS and share and share[len(share) // 2] >= OVERHEAD_SHARE:
            if thread_id is None:  # the user's function that steps and the user's functions
                # that called it directly: the loop (up to the first library frame: a Lightning
                # or Hugging Face trainer's loop is no line of the user's, and time in a hook it
                # runs is not traced to the trainer.fit line)
                thread_id, loop_code = threading.get_ident(), []
                frame = user_frame(sys._getframe())
                while frame is not None and is_user_file(frame.f_code.co_filename):
                    loop_code.append(frame.f_code)
                    frame = frame.f_back
                del frame
            self._sampler = LineSampler(thread_id, self._idle, loop_code).start()
            self.hold(self._sampler.stop)

    def _emit_overhead(self) -> None:
        """The ``step_overhead`` event: the lines the sampler saw the idle loop on."""
        sampler = self._sampler
        if sampler is None:
            return
        sampler.stop()
        self.rec.emit("step_overhead", samples=sampler.samples, lines=sampler.top(),
                      loop_lines=sampler.top(loop=True), interval=INTERVAL)
