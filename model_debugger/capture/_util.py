"""Helpers shared by the Recorder and the instruments; imports nothing else of the package.

- :data:`FLUSH_SECONDS`: how often per-step events reach the record file at least;
- :func:`num`: a JSON-safe float (NaN and infinities as strings);
- :func:`rss_bytes`: the process's resident memory (one ``pread`` a call);
- :func:`is_oom`: whether an exception is an out-of-memory error of any framework;
- :func:`active_recorder`: the innermost active Recorder (its stack lives here, so that code
  below the Recorder, a keeper's spill, reaches it without importing the Recorder).

Importing this module imports neither torch nor tensorflow.
"""

from __future__ import annotations

import math
import os

PRESSED = 0.02  # outputs within this of a sigmoid's or tanh's bound press against it

FLUSH_SECONDS = 0.2  # per-step events reach the file at least this often; others at once


def num(value):
    """JSON-safe float: NaN and infinities become strings."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else str(value)


_statm = [-1, -1, 0]  # [pid, fd, page size]: /proc/self/statm stays open, one pread a step


def rss_bytes() -> int:
    """Resident set size of this process in bytes (0 when unknown)."""
    try:
        if _statm[0] != os.getpid():  # first call, or a forked child
            _statm[:] = [os.getpid(), os.open("/proc/self/statm", os.O_RDONLY),
                         os.sysconf("SC_PAGE_SIZE")]
        return int(os.pread(_statm[1], 128, 0).split()[1]) * _statm[2]
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def forward_fields(out) -> dict:
    """``{"forward": "finite", "output_zeros": share}`` for a finite model output, else ``{}``.

    Written with a ``nonfinite`` loss when the model's forward, replayed on that batch at the
    weights the step started from, gave finite outputs: the loss computation made the value
    (``output_zeros``: the share of outputs exactly 0, a ReLU's floor under a log).
    """
    import numpy as np

    x = np.asarray(out, dtype=np.float64)
    if not x.size or not np.isfinite(x).all():
        return {}
    return {"forward": "finite", "output_zeros": float((x == 0).mean())}


def is_oom(exc: BaseException) -> bool:
    """True for out-of-memory errors of any framework."""
    name = type(exc).__name__
    if name in ("OutOfMemoryError", "ResourceExhaustedError") or isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


active: list = []  # the Recorders inside their block, innermost last (appended by the Recorder)


def active_recorder():
    """The innermost active Recorder, or None."""
    return active[-1] if active else None


LR_EVENTS = 64  # ``lr`` events at most (one each time the rate moved by LR_MOVE or more)
LR_MOVE = 1.5


class RateTrack:
    """The learning rate's trajectory as ``lr`` events: one each time it moved by ``LR_MOVE``.

    Shared by both instruments (a PyTorch group's ``lr``, a Keras optimizer's
    ``learning_rate``), at most ``LR_EVENTS``: a schedule's shape, not every step.
    """

    def __init__(self, rec) -> None:
        self.rec = rec
        self.last: float | None = None
        self.events = 0

    @property
    def full(self) -> bool:
        """No more ``lr`` events will be written (reading the rate is then wasted work)."""
        return self.events >= LR_EVENTS

    def note(self, lr) -> None:
        """The rate in force at the record's current step."""
        if not isinstance(lr, (int, float)) or not math.isfinite(lr) or self.events >= LR_EVENTS:
            return
        last = self.last
        if last is None or (lr > 0) != (last > 0) or \
                lr > 0 and not 1 / LR_MOVE < lr / last < LR_MOVE:
            self.last = float(lr)
            self.events += 1
            self.rec.emit("lr", step=self.rec.step, lr=float(lr))
