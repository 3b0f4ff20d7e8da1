"""Probe ``distribution_shift``: whether validation inputs come from the training distribution.

Three measurements on the input arrays: a per-feature two-sample Kolmogorov-Smirnov statistic, a
per-feature population stability index (10 quantile bins of the training values), and a
classifier two-sample test (a logistic regression telling training rows from validation rows,
scored by holdout AUC). A shift is confirmed when the classifier separates the splits
(AUC >= 0.75) or when one feature is shifted both significantly (KS above its Bonferroni
critical value at alpha = 0.001) and materially (PSI >= 0.25).
"""

from __future__ import annotations

import ast
import re

import numpy as np

from ..records import Finding
from . import _numpy_stats as st
from .base import Probe, ProbeContext, register

AUC_CONFIRM = 0.75      # classifier two-sample test: the splits are told apart
AUC_HINT = 0.6          # worth mentioning, not enough to confirm
PSI_MAJOR = 0.25        # the usual "major shift" level of the population stability index
ALPHA = 1e-3            # family-wise level of the per-feature KS tests
TOP = 5
ROW_CAP = 5000


@register
class DistributionShift(Probe):
    """Compare training and validation inputs feature by feature and as a whole."""

    id = "distribution_shift"
    data_role = "validation"  # provenance.VALIDATION: fit's validation_data, else the inputs
    traces_origin = False  # located by :func:`_split_location` (the side changed last)
    categories = ("overfitting", "convergence_to_wrong_solution", "loss_not_decreasing")
    needs_live = False
    fix = ("Build the validation split from the same distribution as training (shuffle before "
           "splitting, same preprocessing).")

    def applies(self, ctx: ProbeContext) -> bool:
        """When both training and validation input arrays are available."""
        return super().applies(ctx) and ctx.train_xy is not None and ctx.val_xy is not None

    def run(self, ctx: ProbeContext) -> list[Finding]:
        """One finding when the splits differ, confirmed as the module docstring says."""
        # at one precision: Keras hands training batches over as float32 and keeps a
        # validation_split slice as float64, and a value at two precisions is two values
        # (a binary column then reads as shifted by its whole share)
        x, v = (st.as_matrix(a).astype(np.float32).astype(np.float64)
                for a in (ctx.train_xy[0], ctx.val_xy[0]))
        if x.shape[1] != v.shape[1] or len(x) < 2 or len(v) < 2:
            return []
        rng = np.random.default_rng(0)
        x, v = x[st.subsample(x, ROW_CAP, rng)], v[st.subsample(v, ROW_CAP, rng)]
        x, v = np.nan_to_num(x), np.nan_to_num(v)
        d = x.shape[1]
        ks, ps = st.ks_columns(x, v), st.psi_columns(x, v)
        crit = st.ks_critical(len(x), len(v), ALPHA / d)
        significant = ks >= crit
        major = significant & (ps >= PSI_MAJOR)
        score = st.classifier_auc(x, v)
        confirmed = bool((score is not None and score >= AUC_CONFIRM) or major.any())
        if not confirmed and not significant.any() and (score is None or score < AUC_HINT):
            return []

        names = st.feature_names(ctx, d)
        order = [j for j in np.lexsort((-ps, -ks)) if significant[j]]
        top = [{"feature": names[j], "ks": float(ks[j]), "psi": float(ps[j]),
                "train_mean": float(np.mean(x[:, j])), "val_mean": float(np.mean(v[:, j]))}
               for j in order[:TOP]]
        strength = max(2 * (score - 0.5) if score is not None else 0.0,
                       min(1.0, float(np.max(np.where(major, ps, 0.0))) / (2 * PSI_MAJOR)))
        strength = float(np.clip(strength if confirmed else 0.5 * strength, 0.0, 1.0))
        auc_text = f"a classifier tells them apart with holdout AUC {score:.2f}" \
            if score is not None else "too few rows for the classifier test"
        where = ", ".join(f"{t['feature']} (KS {t['ks']:.2f}, PSI {t['psi']:.2f})" for t in top)
        if confirmed:
            text = (f"Validation inputs are not drawn from the training distribution: {auc_text}"
                    f"{'; most shifted: ' + where if where else ''}. The model is scored on data "
                    "unlike what it learned from, so a validation gap reflects the data split, "
                    "not (only) the model. If training inputs are augmented, part of the "
                    "shift is intended.")
        else:
            text = (f"Possible mild shift between training and validation inputs: {auc_text}"
                    f"{'; shifted: ' + where if where else ''}. Not strong enough to confirm.")
        return [self.finding("data", confirmed, text, _split_location(ctx), strength=strength,
                             auc=score, ks_critical=crit, top_features=top,
                             shifted_features=int(significant.sum()),
                             major_shift_features=int(major.sum()),
                             n_train=len(x), n_val=len(v))]


def _split_location(ctx: ProbeContext) -> dict | None:
    """Where the two splits' inputs came apart: the side whose inputs were made last.

    Validation inputs are traced back from the first evaluation forward (an inline transform
    there, ``net(xb * 10.0)``, is that line) or ``fit``'s ``validation_data``; training inputs
    from where training used them. Both come from shared data: the later of the two origins in
    the file is the change made to one side only (``DataLoader(TensorDataset(train_X * 1000,
    ...))`` beside a validation split left as it was), else the validation side's.
    """
    from ..provenance import VALIDATION, data_origin, validation_binding

    val = data_origin(ctx.ref("eval_forward") or st.data_location(ctx), VALIDATION)
    train = data_origin(st.data_location(ctx), "inputs")
    if val and train and train.get("file") == val.get("file") and "used_at" in train and \
            train["line"] > val["line"]:
        if _normalises(ctx, train):  # the training side's later step is its normalisation:
            # the validation pipeline skipped it, and the step goes there
            return validation_binding(st.data_location(ctx)) or val
        return train
    return val


_NORMALISES = re.compile(r"preprocess|normali[sz]|standardi[sz]|scaler\b|\bmean\b|\bstd\b|"
                         r"/\s*255", re.IGNORECASE)


def _normalises(ctx: ProbeContext, origin: dict) -> bool:
    """Whether the statement at ``origin`` normalises the data.

    A preprocess map, a scaler, a mean/std, a division by 255, rather than a corruption
    (``X * 1000``).
    """
    text = (ctx.source_files or {}).get(origin.get("file"))
    if not isinstance(text, str):
        return False
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    stmt = next((n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.Expr))
                 and n.lineno == origin["line"]), None)  # (not a block's whole body)
    segment = ast.get_source_segment(text, stmt) if stmt is not None else None
    return bool(segment and _NORMALISES.search(segment))
