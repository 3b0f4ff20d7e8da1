"""Passes over a training data source: how many batches each drew, of how many it holds.

Owned by the instruments' data hooks (a PyTorch ``DataLoader``, a ``tf.data`` dataset in a Keras
custom loop). A loop that leaves each pass early (a ``break`` or ``return`` in the batch loop)
draws fewer batches than its source holds: the ``passes`` event records it, and
``training_length`` / ``data_volume`` read it to name the loop.
"""

from __future__ import annotations

import weakref

PASSES_KEPT = 64  # passes over one source whose batch counts are kept
SOURCES_KEPT = 256  # sources followed (a loop that builds one per step: the first ones)


class Passes:
    """Batch counts per pass, for every source iterated, and which source trains.

    Sources are keyed by ``id()`` and held weakly: a key whose source is gone (a loader built
    again each epoch, its id reused) starts over.
    """

    def __init__(self) -> None:
        # key -> [weakref to the source, where its latest pass began, batches drawn per pass
        #         (current last), whether the current pass ran out, batches in a pass]
        self._seen: dict = {}
        self.train = None  # the key of the first source whose batch reached a training step

    def begin(self, key, source, where: dict | None, length: int | None) -> tuple[bool, bool]:
        """A new pass over ``source``: ``(the last pass was cut short, it ran out)``.

        Cut short: the training source's last pass drew at most half of its batches and did
        not run out. ``where`` (the line that iterated it) is kept per pass: the training
        loop's line, not a peek at one batch before training.
        """
        seen = self._seen.get(key)
        if seen is not None and seen[0]() is not source:  # a dead source's reused id
            del self._seen[key]
            if self.train == key:
                self.train = None
            seen = None
        if seen is None:
            if len(self._seen) < SOURCES_KEPT:
                try:
                    ref = weakref.ref(source)
                except TypeError:
                    return False, False
                self._seen[key] = [ref, where, [0], False, length]
            return False, False
        ran_out = seen[3]
        cut = key == self.train and not ran_out and bool(seen[4]) and \
            2 * seen[2][-1] <= seen[4]
        seen[1], seen[3] = where, False
        if len(seen[2]) < PASSES_KEPT:
            seen[2].append(0)
        else:  # past the passes kept: the last entry counts the latest pass
            seen[2][-1] = 0
        return cut, ran_out

    def drew(self, key) -> None:
        """One batch drawn from ``key``'s current pass."""
        seen = self._seen.get(key)
        if seen is not None:
            seen[2][-1] += 1

    def ran_out(self, key) -> None:
        """``key``'s current pass ran out (its iterator stopped)."""
        seen = self._seen.get(key)
        if seen is not None:
            seen[3] = True

    def trains(self, key) -> None:
        """``key``'s batch reached a training step (the first such source is the training one)."""
        if self.train is None and key in self._seen:
            self.train = key

    def event(self) -> dict | None:
        """The ``passes`` event's fields for the training source (None when there is none)."""
        seen = self._seen.get(self.train)
        if seen is None:
            return None
        where = seen[1] or {}
        return {"batches": seen[4], "drawn": list(seen[2]), "last_ran_out": seen[3],
                "file": where.get("file"), "line": where.get("line")}
