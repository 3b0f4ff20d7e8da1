"""Probe ``constant_baseline``: whether the model beats a predictor that ignores its input.

The best constant predictor outputs the label prior (classification) or the target mean
(regression); its loss is the label entropy (cross-entropy, in nats), the mean binary entropy
(binary cross-entropy), the target variance (MSE) or the mean absolute deviation from the median
(L1). The capture's ``constant_predictor_loss`` signal is used when present; otherwise the
baseline is computed from the training targets. A final loss still >= 95% of the baseline
measures the symptom (the model learned nothing beyond the prior), not its cause: the learning
rate is the usual lever, but unscaled inputs, a missing input path or labels apart from their
rows give the same curve. So the finding is a hypothesis (``hyperparameter``); the probes that
undo a cause in a re-run (``lr_range`` among them) confirm one. Below 80%, silent.
"""

from __future__ import annotations

import math

import numpy as np

from ..records import Finding
from . import _numpy_stats as st
from .base import Probe, ProbeContext, register, setting_location

CONFIRM = 0.95
HINT = 0.8
DIP = 0.7          # a best step this far below the baseline is more than batch noise


def _num(signals: dict, key: str) -> float:
    v = signals.get(key)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else math.nan


def _entropy(labels: np.ndarray) -> float:
    p = np.unique(labels, return_counts=True)[1] / len(labels)
    return float(-(p * np.log(p)).sum())


def _huber_constant(ym: np.ndarray, beta: float) -> float:
    """The least mean Smooth-L1 loss (threshold ``beta``) of one constant per column.

    The loss is convex in the constant, so a golden-section search between each column's
    extremes finds it (every column at once).
    """
    def loss(c: np.ndarray) -> np.ndarray:
        d = np.abs(ym - c)
        return np.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta).mean(axis=0)

    golden = (math.sqrt(5) - 1) / 2
    lo, hi = ym.min(axis=0), ym.max(axis=0)
    for _ in range(60):
        a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
        left = loss(a) <= loss(b)
        lo, hi = np.where(left, lo, a), np.where(left, b, hi)
    return float(loss((lo + hi) / 2).mean())


def baseline_from_targets(y, loss: str | None, beta: float = 1.0) -> tuple[float, str] | None:
    """The constant predictor's loss for targets ``y`` under ``loss`` (guessed when None).

    ``beta`` is Smooth-L1's threshold (Huber's ``delta``). Returns ``(loss, kind)`` or None when
    the loss has no formula here.
    """
    y = np.asarray(y)
    if loss in ("binary_cross_entropy", "binary_cross_entropy_with_logits"):
        p = np.clip(st.as_matrix(y).mean(axis=0), 1e-12, 1 - 1e-12)
        return float(np.mean(-(p * np.log(p) + (1 - p) * np.log(1 - p)))), "binary entropy"
    labels = st.as_labels(y, loss)
    if loss in st.CLASSIFICATION_LOSSES or (loss is None and labels is not None):
        return (_entropy(labels), "label entropy") if labels is not None else None
    ym = st.as_matrix(y)
    if loss in ("mse_loss", None):
        return float(ym.var(axis=0).mean()), "target variance"
    if loss == "l1_loss":
        return float(np.abs(ym - np.median(ym, axis=0)).mean()), "mean absolute deviation"
    if loss in ("smooth_l1_loss", "huber_loss") and beta == 0:  # Smooth-L1 at beta 0 is L1
        return float(np.abs(ym - np.median(ym, axis=0)).mean()), "mean absolute deviation"
    if loss in ("smooth_l1_loss", "huber_loss") and beta > 0 and np.isfinite(ym).all():
        scale = beta if loss == "huber_loss" else 1.0  # Huber(delta) = delta * SmoothL1(delta)
        return scale * _huber_constant(ym, beta), "least Huber loss of a constant"
    return None


@register
class ConstantBaseline(Probe):
    """Compare the training loss with the loss of the best input-independent predictor."""

    id = "constant_baseline"
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution")
    needs_live = False
    lever = True  # "raise the rate or train longer": what makes up for most other faults
    fix = "Raise the learning rate or train longer until the model beats the constant predictor."

    def applies(self, ctx: ProbeContext) -> bool:
        """When the baseline is known: the capture's signal, or training targets to compute it."""
        has_signal = math.isfinite(_num(ctx.signals, "constant_predictor_loss"))
        return super().applies(ctx) and (has_signal or ctx.train_xy is not None)

    def run(self, ctx: ProbeContext) -> list[Finding]:
        """One finding when the final loss is >= 80% of the baseline's (confirmed at >= 95%)."""
        s = ctx.signals
        final, low = _num(s, "loss_final"), _num(s, "loss_min")
        base, source, kind = _num(s, "constant_predictor_loss"), "signal", "from the record"
        if not math.isfinite(base) and ctx.train_xy is not None and ctx.train_xy[1] is not None:
            name = st.loss_name(ctx)
            kwargs = (ctx.loss or {}).get("kwargs") or {}
            beta = kwargs.get("delta" if name == "huber_loss" else "beta", 1.0)
            known = name not in ("smooth_l1_loss", "huber_loss") or ctx.framework == "torch"
            got = baseline_from_targets(ctx.train_xy[1], name, float(beta)) if known and \
                isinstance(beta, (int, float)) else None  # a Keras delta is not recorded
            if got is not None:
                (base, kind), source = got, "arrays"
                if st.loss_name(ctx) is None:
                    kind += " (loss kind assumed)"
        if not math.isfinite(final) or not math.isfinite(base) or base <= 0:
            return []
        ratio = final / base
        if ratio < HINT:
            return []
        confirmed = ratio >= CONFIRM
        head = (f"final loss {final:.4g}; always predicting the label prior / target mean "
                f"scores {base:.4g}, {kind}; ratio {ratio:.3g}")
        if confirmed and math.isfinite(low) and low < DIP * base:
            text = (f"The loss went down to {low:.4g} at its best step but ended back at the "
                    f"constant predictor's level ({head}): training collapsed to the prior, "
                    "typically because the learning rate is too high for the later phase.")
        elif confirmed:
            text = (f"The loss never beat the constant predictor ({head}): the model learned "
                    "nothing beyond the label prior / mean. The inputs never influenced the "
                    "output, typically a learning rate far too low (or too high), too few steps, "
                    "or an optimiser that does not reach the parameters.")
        else:
            text = (f"The loss barely beats the constant predictor ({head}): the model has "
                    "learned little beyond the label prior / mean.")
        strength = 0.5 if confirmed else 0.2  # a symptom-level cause: specific probes rank first
        location = setting_location(ctx.ref("optimizer"), "lr") or st.data_location(ctx)
        # the comparison measures the symptom; no re-run undid a cause: a hypothesis, ranked
        # after what an experiment confirms (the rate is tested by lr_range)
        return [self.finding("hyperparameter", False, text, location, strength=strength,
                             baseline_loss=base, baseline_source=source, baseline_kind=kind,
                             loss_final=final, loss_min=low, ratio=ratio,
                             majority_rate=s.get("majority_rate"))]
