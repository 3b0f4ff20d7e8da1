"""Framework warnings printed during the run: each kind recorded once, with the user's line.

PyTorch, Keras and NumPy say a good deal about a broken run on their own ("Using a target size
... different to the input size", "received `from_logits=True`, but the `output` argument was
produced by a Softmax", "Detected call of `lr_scheduler.step()` before `optimizer.step()`",
"overflow encountered"). Those lines scroll past in the output and are lost; here the
capture's layer over :func:`warnings.showwarning` records each one as a ``warning`` event: its
category, its message (redacted, at most :data:`MESSAGE` characters) and the innermost line of
the user's code on the stack when it was issued (the call that made the framework warn), then
passes it on (shown at the user's line where the framework's ``stacklevel`` pointed into a
wrapper of the capture). Warnings that only concern the framework's own future
(``DeprecationWarning``, ``FutureWarning``...) are not kept, nor more than :data:`KINDS` kinds;
repeats of a kind (the same message and line) are counted: a kind is written when first seen
and again with its count at the end (the last event of a kind holds its count).
"""

from __future__ import annotations

import os
import re
import sys
import threading
import warnings

from ..redact import redact
from . import patches
from .codeloc import user_location

MESSAGE = 500
KINDS = 20
SKIPPED = (DeprecationWarning, PendingDeprecationWarning, FutureWarning, ImportWarning,
           ResourceWarning)
_NUMBERS = re.compile(r"\d+")
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the package


class WarningLog:
    """The warnings of one capture, by kind (message without its numbers, and user line)."""

    def __init__(self, rec) -> None:
        self.rec = rec
        self.kinds: dict[tuple, dict] = {}
        self._lock = threading.Lock()  # showwarning runs on whichever thread warned
        self._closed = False

    def install(self):
        """Layer over ``warnings.showwarning``; returns what removes it."""
        return patches.install(warnings, "showwarning", self._factory)

    def _factory(self, show):
        def showwarning(message, category, filename, lineno, file=None, line=None):
            try:
                where = user_location(sys._getframe(1))
                self.note(message, category, where or {"file": filename, "line": lineno})
                if where and str(filename).startswith(_OURS):
                    # the framework's stacklevel pointed into one of the capture's wrappers
                    filename, lineno, line = where["file"], where["line"], None
            except Exception:  # noqa: BLE001 - a warning must never break the run
                pass
            return show(message, category, filename, lineno, file, line)
        return showwarning

    def note(self, message, category, where: dict) -> None:
        """Count one warning (the first of a kind keeps its message and location)."""
        if not isinstance(category, type) or issubclass(category, SKIPPED):
            return
        text = str(message)
        with self._lock:
            first = None if self._closed else self._note(category, text, where)
        if first is not None:  # written at once (a killed run keeps it), outside the lock
            self.rec.emit("warning", **first)

    def _note(self, category, text: str, where: dict) -> dict | None:
        """Count the warning; the event to write when it is the first of its kind."""
        key = (category.__name__, _NUMBERS.sub("#", text[:200]), where.get("file"),
               where.get("line"))
        seen = self.kinds.get(key)
        if seen is not None:
            seen["count"] += 1
            return None
        if len(self.kinds) >= KINDS:
            return None
        seen = self.kinds[key] = {
            "category": category.__name__, "message": redact(text[:4 * MESSAGE])[:MESSAGE],
            "file": where.get("file"), "line": where.get("line"), "step": self.rec.step,
            "count": 1}
        return dict(seen)

    def finish(self) -> None:
        """Write the final count of each kind seen more than once (the last event counts).

        Warnings after this are passed on, not recorded.
        """
        with self._lock:
            self._closed = True
            kinds, self.kinds = list(self.kinds.values()), {}
        for kind in kinds:
            if kind["count"] > 1:
                try:
                    self.rec.emit("warning", **kind)
                except Exception:  # noqa: BLE001 - the run's own end must still be written
                    pass
