"""``target_scale``: regression targets far from unit scale.

A regression loss on targets in the thousands (prices in dollars, a series left in raw units,
a ``y * 1000`` slip) makes the loss and every gradient that much larger: the learning rate that
suits the weights is far too large for the output layer, or the output has to grow by orders of
magnitude from its small initial values. Measured on the kept training targets (their spread or
mean beyond :data:`SCALE`, or a spread below ``1 / SCALE``), then tested by experiment: two fresh
copies trained on the same rows with the user's optimizer, one on the targets as they are and one
on the targets standardised with the training rows' mean and spread. Each copy's held-out loss is
divided by the loss of predicting the training mean in its own units, so the two are compared on
one scale; confirmed when the standardised copy is clearly better. Located where the targets
were made.
"""

from __future__ import annotations

import math

import numpy as np

from ._heldout import BETTER, as_is, heldout_variants
from .base import Probe, ProbeContext, register

SCALE = 100.0  # targets whose spread or |mean| reaches this (or whose spread is below 1/this)
_REGRESSION = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")


@register
class TargetScale(Probe):
    """Targets far from unit scale, and a copy on standardised targets learns clearly better."""

    id = "target_scale"
    cost = 2
    data_role = "targets"
    about_scale = True
    categories = ("gradient_instability", "loss_not_decreasing", "overfitting",
                  "convergence_to_wrong_solution")
    needs_live = True
    fix = ("Standardise the regression targets with the training split's mean and standard "
           "deviation ((y - mean) / std) and undo it on the predictions; or scale them to units "
           "near 1.")

    def applies(self, ctx: ProbeContext) -> bool:
        """With a trainer, a regression loss averaged over the rows and at least 40 targets."""
        tr = ctx.trainer
        loss = ctx.loss or {}
        return super().applies(ctx) and tr is not None and tr.targets is not None and \
            tr.n >= 40 and loss.get("name") in _REGRESSION and \
            (tr.loss_kwargs or {}).get("reduction", "mean") == "mean"

    def run(self, ctx: ProbeContext):
        """One finding when the targets are off scale: confirmed by the standardised copy."""
        tr = ctx.trainer
        y = np.asarray(tr.targets, dtype=np.float64)
        if not np.isfinite(y).all():
            return []  # non-finite targets are nonfinite_inputs' finding
        mu, sd = float(y.mean()), float(y.std())
        if not sd > 0 or (max(sd, abs(mu)) < SCALE and sd > 1.0 / SCALE):
            return []
        name = ctx.loss["name"]
        runs, cut = heldout_variants(
            ctx, [as_is, lambda x, t, _cut: (x, (t - mu) / sd)], seed=2)
        rel = []
        for held, t in runs:  # each as a share of the constant predictor's loss in its units
            base = _constant_loss(name, np.asarray(t, dtype=np.float64), cut)
            rel.append(held / base if math.isfinite(held) and base > 0 else float("inf"))
        raw, standardised = rel
        confirmed = math.isfinite(standardised) and standardised < BETTER * raw
        size = f"a spread of {sd:.3g} and a mean of {mu:.3g}"
        return [self.finding(
            "data", confirmed,
            f"The regression targets are far from unit scale ({size}). Two fresh copies trained "
            f"on the same rows reach a held-out loss of {_shown(raw)} of the constant "
            f"predictor's on the targets as they are and {_shown(standardised)} on standardised "
            "targets"
            + (": the scale of the targets holds the training back." if confirmed else
               ": no clearly better, so their scale is not what holds it back."),
            ctx.ref("loss_fn") or ctx.ref("fit"), undone=confirmed,
            strength=0.85 if confirmed else 0.15, target_mean=mu, target_std=sd,
            heldout_relative_as_is=raw, heldout_relative_standardised=standardised)]


def _constant_loss(name: str, t: np.ndarray, cut: int) -> float:
    """The held-out loss of predicting the training rows' mean (median for L1), per element."""
    train, held = t[:cut], t[cut:]
    centre = np.median(train, axis=0) if name == "l1_loss" else train.mean(axis=0)
    err = held - centre
    if name == "mse_loss":
        return float(np.mean(err ** 2))
    if name == "l1_loss":
        return float(np.mean(np.abs(err)))
    a = np.abs(err)  # smooth L1 / Huber with the default threshold 1
    return float(np.mean(np.where(a < 1.0, 0.5 * a ** 2, a - 0.5)))


def _shown(value: float) -> str:
    return f"{value:.0%}" if math.isfinite(value) else "a non-finite share"
