"""Passes over a training data source: how many batches each drew, of how many it holds.

Owned by the instruments' data hooks (a PyTorch ``DataLoader``, a ``tf.data`` dataset in a Keras
custom loop). A loop that leaves each pass early (a ``break`` or ``return`` in the batch loop)
draws fewer batches than its source holds: the ``passes`` event records it, and
``training_length`` / ``data_volume`` read it to name the loop.
"""

from __future__ import annotations

PASSES_KEPT = 64  # passes over one source whose batch counts are kept
SOURCES_KEPT = 256  # sources followed (a loop that builds one per step: the first ones)


class Passes:
    """Batch counts per pass, for every source iterated, and which source trains."""

    def __init__(self) -> None:
        # key -> [where it was first iterated, batches drawn per pass (current last),
        #         whether the current pass ran out, batches in a pass]
        self._seen: dict = {}
        self.train = None  # the key of the first source whose batch reached a training step

    def begin(self, key, where: dict | None, length: int | None) -> bool:
        """A new pass over ``key``; True when the training source's last pass was cut short.

        Cut short: it drew at most half of the source's batches and did not run out.
        """
        seen = self._seen.get(key)
        if seen is None:
            if len(self._seen) < SOURCES_KEPT:
                self._seen[key] = [where, [0], False, length]
            return False
        cut = key == self.train and not seen[2] and bool(seen[3]) and 2 * seen[1][-1] <= seen[3]
        if len(seen[1]) < PASSES_KEPT:
            seen[1].append(0)
            seen[2] = False
        return cut

    def drew(self, key) -> None:
        """One batch drawn from ``key``'s current pass."""
        seen = self._seen.get(key)
        if seen is not None:
            seen[1][-1] += 1

    def ran_out(self, key) -> None:
        """``key``'s current pass ran out (its iterator stopped)."""
        seen = self._seen.get(key)
        if seen is not None:
            seen[2] = True

    def trains(self, key) -> None:
        """``key``'s batch reached a training step (the first such source is the training one)."""
        if self.train is None and key in self._seen:
            self.train = key

    def event(self) -> dict | None:
        """The ``passes`` event's fields for the training source (None when there is none)."""
        seen = self._seen.get(self.train)
        if seen is None:
            return None
        where = seen[0] or {}
        return {"batches": seen[3], "drawn": list(seen[1]), "last_ran_out": seen[2],
                "file": where.get("file"), "line": where.get("line")}
