"""``target_classes``: one-hot training targets that name no class, or several.

A one-hot target must set exactly one class. Labels counted from 1 (``1..K``) one-hot encoded
with depth ``K`` (``tf.one_hot(rating, 5)`` for ratings 1-5, ``to_categorical`` of a shifted
label, ``np.eye(K)[y]`` after a bad offset) leave the last label's rows all zeros: the loss asks
the model to push every class down for them, the class is never learned, and the other rows'
classes are shifted by one. Measured on the kept training targets of a classification loss: the
share of 0/1 target rows whose classes do not sum to one. Direct and decisive (``data``),
located where the targets were encoded (the one-hot call), else where the data enters training.
"""

from __future__ import annotations

import re

import numpy as np

from . import _numpy_stats as st
from ._heldout import source_line
from .base import Probe, ProbeContext, register

SHARE = 0.01  # rows naming no class (or several) at least this share of the kept targets
_ENCODE = re.compile(r"one_hot\s*\(|to_categorical\s*\(|\beye\s*\(|OneHotEncoder\s*\(")


@register
class TargetClasses(Probe):
    """0/1 targets of a classification loss whose rows do not name exactly one class."""

    id = "target_classes"
    cost = 0
    categories = ("loss_not_decreasing", "gradient_instability", "convergence_to_wrong_solution",
                  "overfitting")
    needs_live = True
    traces_origin = False  # (located at the encoding call, found below)
    fix = ("Encode labels 0..K-1 for K classes (shift labels counted from 1: y - 1), or give "
           "the one-hot encoding a depth of max(label) + 1; each target row must set one class.")

    def run(self, ctx: ProbeContext):
        """One confirmed finding when enough kept target rows set no class or several."""
        tr = ctx.trainer
        if tr is None or tr.targets is None or st.loss_name(ctx) not in (
                "cross_entropy", "nll_loss"):
            return []
        y = np.asarray(_host(tr.targets))
        if y.ndim != 2 or y.shape[1] < 2 or not np.issubdtype(y.dtype, np.number) or \
                not np.isin(y, (0, 1)).all():
            return []  # not one-hot rows
        sums = y.sum(axis=1)
        none, several = float((sums == 0).mean()), float((sums > 1).mean())
        if none + several < SHARE:
            return []
        what = (f"{none:.1%} of them set no class (all zeros)" if none >= several else
                f"{several:.1%} of them set several classes")
        where = source_line(ctx, _ENCODE, near=st.data_location(ctx)) or st.data_location(ctx)
        return [self.finding(
            "data", True,
            f"The training targets are one-hot rows of {y.shape[1]} classes, and {what}: a "
            f"label outside 0..{y.shape[1] - 1} (labels counted from 1, or a depth one short) "
            "encodes to a row that names no class. The model is pushed to reject every class "
            "for those rows and never learns the missing one.",
            where, strength=0.9, decisive=True, rows=int(len(y)), classes=int(y.shape[1]),
            no_class_share=none, several_classes_share=several)]


def _host(value):
    return value.detach().cpu().numpy() if hasattr(value, "detach") else value
