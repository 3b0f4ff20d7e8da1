"""The part of a trainer both frameworks share."""

from __future__ import annotations

from typing import Any


class SampleTrainer:
    """What both framework trainers share: the user's rate and the size of the kept sample.

    Subclasses set ``hyper`` (the optimizer's hyperparameters) and ``targets`` (the stacked
    training targets, or None), and define ``param_count``, ``fresh_model``, ``subset`` and
    ``fit``.
    """

    warm_up = False  # fit once before timing a step (a framework that traces on first call)

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

    def steps_within(self, steps: int, batch_size: int = 64, floor: int = 30,
                     work: float = 2e7, seconds: float | None = None) -> int:
        """How many of ``steps`` training steps a probe affords on this model (at least ``floor``).

        The cost of a step is taken as parameters x batch size, so a probe on a large model
        shortens itself deterministically (the same count on a busy or an idle machine). Only
        for models beyond ``work`` is one step timed, to keep the probe within ``seconds``.
        """
        per_step = max(max(self.param_count(), 1) * min(batch_size, max(self.n, 1)), 1)
        count = max(floor, min(steps, int(steps * work / per_step)))
        if seconds is None or per_step <= work:
            return count
        import time

        model = self.fresh_model()
        inputs, target = self.subset(slice(0, min(batch_size, self.n)))
        if self.warm_up:
            self.fit(model, inputs, target, 1, batch_size=batch_size)  # the trace
        t0 = time.perf_counter()
        self.fit(model, inputs, target, 2, batch_size=batch_size)
        took = max((time.perf_counter() - t0) / 2, 1e-6)
        return max(5, min(count, int(seconds / took)))
