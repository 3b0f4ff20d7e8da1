"""The part of a trainer both frameworks share."""

from __future__ import annotations

from typing import Any


class SampleTrainer:
    """What both framework trainers share: the user's rate and the size of the kept sample.

    Subclasses set ``hyper`` (the optimizer's hyperparameters) and ``targets`` (the stacked
    training targets, or None).
    """

    hyper: dict
    targets: Any

    @property
    def lr(self) -> float:
        """The user's learning rate (1e-3 when the optimizer names none)."""
        return float(self.hyper.get("lr", 1e-3))

    @property
    def n(self) -> int:
        """Rows in the kept training sample."""
        return 0 if self.targets is None else int(self.targets.shape[0])
