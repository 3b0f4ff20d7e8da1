"""Probe ``leakage``: whether the model sees the answer, or validation is contaminated.

Three measurements, each reported as its own finding:

(a) duplicates: validation rows with an exact copy among the training rows (rows hashed by their
    bytes). Confirmed when at least 1% of validation rows are copies and that rate is more than
    twice (+1 point) the rate at which training rows repeat among themselves, so naturally
    discrete data, whose rows repeat anyway, is not mistaken for a leak;
(b) a single feature that predicts the target almost perfectly: for classification, a
    one-feature lookup / nearest-value classifier scored two-fold reaches >= 98% accuracy while
    the majority class is < 90%; for regression, ``|Pearson r| >= 0.99``;
(c) validation scores too good to be true: the final validation loss below half the final
    training loss (by a margin of at least 10% of the constant predictor's loss, so two near-zero
    losses do not count), or validation accuracy >= 99.9% while training accuracy is lower by
    at least a point (a perfect validation score alone may just be an easy task: unconfirmed).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from ..records import Finding
from . import _numpy_stats as st
from .base import Probe, ProbeContext, register

DUP_MIN_FRACTION = 0.01
FEATURE_ACC = 0.98
MAJORITY_MAX = 0.9
PEARSON = 0.99
VAL_LOSS_RATIO = 0.5
VAL_ACC = 0.999
MAX_FEATURES = 512      # lookup classifiers on at most this many features (screened by eta^2)
ROW_CAP = 4000


def _num(signals: dict, key: str) -> float:
    v = signals.get(key)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else math.nan


def _rows(x: np.ndarray) -> list[bytes]:
    """Row keys: the bytes of each float64 row (``+ 0.0`` makes ``-0.0`` equal ``0.0``)."""
    return [r.tobytes() for r in np.ascontiguousarray(st.as_matrix(x) + 0.0)]


@register
class Leakage(Probe):
    """Look for duplicates across splits, an answer-carrying feature, too-good validation."""

    id = "leakage"
    categories = ("overfitting", "convergence_to_wrong_solution")
    needs_live = False
    fix = ("Remove the leaking feature or the duplicated rows so validation samples are not seen "
           "in training.")

    def applies(self, ctx: ProbeContext) -> bool:
        """Arrays give (a) and (b); validation signals alone give (c) on a log-only session."""
        has_val = any(k in ctx.signals for k in ("val_loss_final", "val_acc_final"))
        return super().applies(ctx) and (ctx.train_xy is not None or has_val)

    def run(self, ctx: ProbeContext) -> list[Finding]:
        """The findings of each measurement that applies: (a) and (b) need arrays, (c) signals."""
        out = []
        if ctx.train_xy is not None and ctx.val_xy is not None:
            out += self._duplicates(ctx)
        if ctx.train_xy is not None and ctx.train_xy[1] is not None:
            out += self._feature(ctx)
        return out + self._too_good(ctx, any(f.confirmed for f in out))

    def _duplicates(self, ctx: ProbeContext) -> list[Finding]:
        train, val = _rows(ctx.train_xy[0]), _rows(ctx.val_xy[0])
        if not train or not val or len(train[0]) != len(val[0]):
            return []
        counts = Counter(train)
        copies = sum(1 for r in val if r in counts)
        frac = copies / len(val)
        within = sum(c for c in counts.values() if c > 1) / len(train)
        if not copies or frac < DUP_MIN_FRACTION:
            return []
        confirmed = frac > 2 * within + 0.01
        text = (f"{copies} of {len(val)} validation rows ({frac:.1%}) are exact copies of training "
                "rows: the model is validated partly on data it trained on, so validation "
                "overstates how well it generalises. Deduplicate before splitting.")
        if not confirmed:
            text = (f"{copies} of {len(val)} validation rows ({frac:.1%}) also occur in training, "
                    f"but {within:.1%} of training rows repeat within training too: the data may "
                    "be naturally discrete, or records were duplicated before the split.")
        return [self.finding("data", confirmed, text, st.data_location(ctx),
                             strength=min(1.0, 0.5 + frac) if confirmed else 0.2,
                             duplicate_count=copies, duplicate_fraction=frac,
                             train_self_duplicate_fraction=within, n_val=len(val))]

    def _feature(self, ctx: ProbeContext) -> list[Finding]:
        x, y = st.as_matrix(ctx.train_xy[0]), np.asarray(ctx.train_xy[1])
        if len(x) != len(y) or len(x) < 20:
            return []
        keep = st.subsample(x, ROW_CAP, np.random.default_rng(0))
        x, y = np.nan_to_num(x[keep]), y[keep]
        names, labels = st.feature_names(ctx, x.shape[1]), st.as_labels(y, st.loss_name(ctx))
        if labels is not None:
            classes, lab = np.unique(labels, return_inverse=True)
            majority = float(np.bincount(lab).max() / len(lab))
            if majority >= MAJORITY_MAX or len(classes) < 2:
                return []
            cols = np.arange(x.shape[1])
            if len(cols) > MAX_FEATURES:   # screen by the correlation ratio eta^2
                onehot = np.eye(len(classes))[lab]
                means = (onehot.T @ x) / onehot.sum(axis=0)[:, None]
                between = ((means[lab] - x.mean(axis=0)) ** 2).sum(axis=0)
                total = ((x - x.mean(axis=0)) ** 2).sum(axis=0) + 1e-300
                cols = np.argsort(-between / total)[:MAX_FEATURES]
            perm = np.random.default_rng(0).permutation(len(lab))
            folds = (perm[: len(perm) // 2], perm[len(perm) // 2:])
            score = {j: st.lookup_accuracy(x[:, j], lab, folds) for j in cols}
            hits = sorted((j for j in score if score[j] >= FEATURE_ACC), key=lambda j: -score[j])
            evidence = {"majority_rate": majority}
            what = "predicts the class almost perfectly (held-out accuracy {:.3f}, majority " \
                f"class {majority:.3f})"
        else:
            ym = st.as_matrix(y)
            if not np.isfinite(ym).all():
                return []
            xs, ys = x - x.mean(axis=0), ym - ym.mean(axis=0)
            sx, sy = np.sqrt((xs ** 2).sum(axis=0)), np.sqrt((ys ** 2).sum(axis=0))
            with np.errstate(all="ignore"):
                r = np.nan_to_num((xs.T @ ys) / np.outer(sx, sy))
            best = np.abs(r).max(axis=1)
            score = {j: float(best[j]) for j in range(x.shape[1])}
            hits = sorted(np.flatnonzero(best >= PEARSON), key=lambda j: -best[j])
            evidence = {}
            what = "is almost a linear copy of the target (|Pearson r| = {:.4f})"
        if not hits:
            return []
        kind = "abs_pearson_r" if labels is None else "accuracy"
        evidence.update({kind: float(score[hits[0]]), "feature": names[hits[0]], "n": len(x),
                         "features": [{"feature": names[j], kind: float(score[j])}
                                      for j in hits[:5]]})
        text = (f"Feature {names[hits[0]]} alone {what.format(score[hits[0]])}: it likely "
                "encodes the target (an id, a post-outcome field, the label itself). The model "
                "can learn this shortcut instead of the task, and will fail where the feature "
                "is unavailable.")
        return [self.finding("data", True, text, st.data_location(ctx), strength=0.9,
                             **evidence)]

    def _too_good(self, ctx: ProbeContext, leak_found: bool) -> list[Finding]:
        s = ctx.signals
        out = []
        vl, tl = _num(s, "val_loss_final"), _num(s, "train_loss_final")
        tl = tl if math.isfinite(tl) else _num(s, "loss_final")
        ref = next((v for v in (_num(s, "constant_predictor_loss"), _num(s, "loss_initial"), tl)
                    if math.isfinite(v) and v > 0), math.nan)
        if tl > 0 and vl < VAL_LOSS_RATIO * tl and tl - vl >= 0.1 * ref:
            out.append(self.finding(
                "data", True, f"Validation loss ({vl:.4g}) ends far below training loss "
                f"({tl:.4g}, ratio {vl / tl:.2f}): validation is easier than training, typically "
                "because validation rows overlap training or come from a simpler distribution.",
                st.data_location(ctx), strength=0.6, val_loss_final=vl, train_loss_final=tl,
                ratio=vl / tl))
        va, ta = _num(s, "val_acc_final"), _num(s, "train_acc_final")
        if va >= VAL_ACC:
            confirmed = leak_found or (ta <= va - 0.01)
            text = f"Validation accuracy is {va:.2%}" + (
                f", above training accuracy ({ta:.2%}): validation is easier than the data the "
                "model trains on, a sign of overlap or leakage." if ta <= va - 0.01 else
                ": too good to be true unless the task is easy" + (
                    "; the leakage found above explains it." if leak_found else
                    " (no duplicate or answer-carrying feature was measured)."))
            out.append(self.finding("data", confirmed, text, st.data_location(ctx),
                                    strength=0.6 if confirmed else 0.3, val_acc_final=va,
                                    train_acc_final=ta))
        return out
