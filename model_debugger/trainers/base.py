"""The part of a trainer both frameworks share."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

SMALL, LARGE = 0.1, 10.0  # a weight's spread against the default init's: outside is suspect
                          # (fan-out and He schemes reach 5x the default on narrow layers)
OFFSET = 1.0              # a vector's mean distance from its default beyond this (and 10x its
                          # default spread) is suspect: a bias of -10 before a ReLU


class OverBudget(BaseException):  # noqa: N818 - a stop, like KeyboardInterrupt
    """A probe's training reached the probe budget's deadline (a hard limit): no verdict.

    A ``BaseException``, so that a probe's own ``except Exception`` around a fit cannot turn a
    stopped experiment into a verdict; :func:`~model_debugger.probes.base.run_probes` catches it.
    """


class SampleTrainer:
    """What both framework trainers share: the user's rate and the size of the kept sample.

    Subclasses set ``hyper`` (the optimizer's hyperparameters) and ``targets`` (the stacked
    training targets, or None), and define ``param_count``, ``fresh_model``, ``subset`` and
    ``fit``.
    """

    warm_up = False  # fit once before timing a step (a framework that traces on first call)
    deadline = float("inf")  # time.monotonic() past which no training step starts

    def on_time(self) -> None:
        """Raise :class:`OverBudget` once the deadline has passed (checked before each step).

        The probe budget is a hard limit: a probe that trains copies stops at the step that
        would start late, whatever the model (a GRU whose steps are slow on a loaded machine),
        and the probe gives no verdict.
        """
        if time.monotonic() > self.deadline:
            raise OverBudget("the probe budget ran out while training a copy")

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


    def throughput(self, batch_size: int, steps: int = 20, model=None) -> float:
        """Training rows per second of a fresh copy at ``batch_size`` (after 3 warm-up steps).

        The user's optimizer and loss on the kept sample: forward, backward and update, as the
        run does them, without the capture's hooks. ``model``: time this copy instead (it
        trains on: a second call times it warm).
        """
        import time

        model = self.fresh_model() if model is None else model
        inputs, target = self.subset(slice(0, min(self.n, max(batch_size, 1) * 4)))
        self.fit(model, inputs, target, 3, batch_size=batch_size)  # (a Keras trace)
        t0 = time.perf_counter()
        done = len(self.fit(model, inputs, target, steps, batch_size=batch_size))
        took = max(time.perf_counter() - t0, 1e-9)
        return min(batch_size, int(target.shape[0])) * done / took


def dropped_calls(calls: list[tuple], reached: set[int]) -> list[dict]:
    """The layers whose every call's output the returned values do not depend on, though its input.

    Parameters
    ----------
    calls : list of (name, kind, inputs, outputs, where)
        Each layer call of one forward pass, in order: the float tensors it got and gave (that
        carry gradients) and the user's line that called it.
    reached : set of int
        ids of the tensors the gradient of what the model returned reaches.

    Returns
    -------
    list of dict
        ``{"layer", "kind", "where"}`` per layer, in the order the pass met them: a layer with
        one call whose output is used is used.
    """
    found: dict[str, dict | None] = {}
    for name, kind, ins, outs, where in calls:
        if any(id(t) in reached for t in outs) or not any(id(t) in reached for t in ins):
            found[name] = None
        elif name not in found:
            found[name] = {"layer": name, "kind": kind, "where": where}
    return [f for f in found.values() if f is not None]


def init_outlier(value: np.ndarray, default: np.ndarray) -> dict | None:
    """How an initial weight departs from a default-initialised one, or None when it does not.

    A matrix or kernel (2+ dimensions) is judged by its spread: below ``SMALL`` (zeros
    included) or above ``LARGE`` times the default's standard deviation. A vector (bias,
    normalisation scale) by its mean distance from the default's mean: more than ``OFFSET`` and
    more than 10 times the default's largest magnitude.

    Returns
    -------
    dict or None
        ``{"kind": "small" | "large" | "offset", "ratio" or "offset": float}``.
    """
    value = np.asarray(value, dtype="float64")
    default = np.asarray(default, dtype="float64")
    if value.size < 2 or not np.isfinite(value).all():
        return None
    if value.ndim >= 2:
        ref = float(default.std())
        if not ref > 0:
            return None
        ratio = float(value.std()) / ref
        if ratio < SMALL:
            return {"kind": "small", "ratio": ratio}
        return {"kind": "large", "ratio": ratio} if ratio > LARGE else None
    offset = float(np.abs(value - default.mean()).mean())
    scale = max(float(np.abs(default).max()), 0.1)
    return {"kind": "offset", "offset": offset} if offset > OFFSET and offset > 10 * scale \
        else None
