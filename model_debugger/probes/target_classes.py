"""``target_classes``: one-hot training targets that name no class, or several.

A one-hot target must set exactly one class. Labels counted from 1 (``1..K``) one-hot encoded
with depth ``K`` (``tf.one_hot(rating, 5)`` for ratings 1-5, ``np.eye(K)[y]`` after a bad
offset) leave the last label's rows all zeros, and the first column is never set: under a
softmax cross-entropy an all-zero row adds no loss and no gradient, so that class is silently
never learned, and every other class is read one off. Measured on the kept training targets of
a classification loss: the share of 0/1 target rows whose classes do not sum to one. Rows with
no class while one column is never set is that signature: direct and decisive (``data``),
located where the targets were encoded (the one-hot call), else where the data enters
training. Zero rows without it (rows masked out on purpose) and rows with several classes (a
multi-label target under a single-label loss) are reported as hypotheses.
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
        y = np.asarray(st.host(tr.targets))
        if y.ndim != 2 or y.shape[1] < 2 or not np.issubdtype(y.dtype, np.number) or \
                not np.isin(y, (0, 1)).all():
            return []  # not one-hot rows
        sums = y.sum(axis=1)
        none, several = float((sums == 0).mean()), float((sums > 1).mean())
        if none + several < SHARE:
            return []
        where = source_line(ctx, _ENCODE, near=st.data_location(ctx)) or st.data_location(ctx)
        unused = [int(c) for c in np.flatnonzero(y.sum(axis=0) == 0)]
        common = dict(rows=int(len(y)), classes=int(y.shape[1]), no_class_share=none,
                      several_classes_share=several, columns_never_set=unused)
        if several > none:
            return [self.finding(
                "architecture", False,
                f"{several:.1%} of the one-hot training targets set several of the "
                f"{y.shape[1]} classes, under a single-label cross-entropy: several labels "
                "per row want one sigmoid per class and a binary cross-entropy.",
                where, strength=0.4, **common)]
        shifted = bool(unused)
        return [self.finding(
            "data", shifted,
            f"{none:.1%} of the one-hot training targets set none of the {y.shape[1]} classes "
            "(all zeros): under a softmax cross-entropy such a row adds no loss and no "
            "gradient, so its class is never learned"
            + (f", and column{'s' if len(unused) > 1 else ''} {unused} "
               f"{'are' if len(unused) > 1 else 'is'} never set: labels counted from 1 encoded "
               f"with depth {y.shape[1]} (the last label falls off, every other is read one "
               "off)." if shifted else
               ". Every class is set somewhere: if the zero rows are masked out on purpose "
               "this is by design."),
            where, strength=0.9 if shifted else 0.3, decisive=shifted, **common)]
