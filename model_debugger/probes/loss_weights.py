"""``loss_weights``: class weights in the loss that tilt the classes far beyond the data.

A class weight (``nn.CrossEntropyLoss(weight=...)``, Keras ``fit(class_weight=...)``) or a
positive weight (``nn.BCEWithLogitsLoss(pos_weight=...)``) is there to even out an imbalance: at inverse
frequencies each class holds the same share of the loss. A weight copied from another dataset
or set by hand (``pos_weight=25`` on balanced labels) tilts it instead: the model learns to
call nearly everything the heavy class, the loss falls and the run looks healthy.

Measured on the kept targets: the share of the loss each class holds under the weights
(weight times frequency) against the share it holds without them. When the weights tilt the
classes :data:`TILT` to one or more, and :data:`BEYOND` times further than the data itself
does, the suspicion is tested on two fresh copies trained on the same rows, one with the weights
and one without, both judged on the plain (unweighted) loss of the held-out rows: confirmed
when the unweighted copy's is clearly lower. (The plain loss is what the unweighted copy
minimises: a tilt this far is what makes the suspicion, the comparison tells whether it costs
the model; a weight of 2-4 chosen on purpose to favour recall is below the tilt looked at.)
Located where the weight's value is written (a config entry, ``pos_weight=25.0``), else at
the loss.
"""

from __future__ import annotations

import math
import re

import numpy as np

from . import _numpy_stats as st
from ._heldout import BETTER, COPY_STEPS, LONGER, SettingExperiment, heldout_loss, source_line
from .base import ProbeContext, register, setting_location

TILT = 5.0  # the heaviest class's share of the loss over the lightest's, at least ...
BEYOND = 3.0  # ... and this many times the tilt the classes have without the weights
MIN_ROWS = 64
_KEYWORDS = ("pos_weight", "weight", "class_weight")


def tilt(tr) -> dict | None:
    """How far the loss's weights tilt the classes of the kept targets (None: not weighted).

    ``{"keyword", "tilt", "data_tilt", "class"}``: the weighted shares' ratio (heaviest over
    lightest class), the unweighted one, and the class (or output column) that decides it.
    """
    kwargs = getattr(tr, "loss_kwargs", None) or {}
    name = getattr(getattr(tr, "loss_fn", None), "__name__", "")
    try:
        y = np.asarray(st.host(tr.targets))
    except (TypeError, ValueError, AttributeError):
        return None
    if len(y) < MIN_ROWS:
        return None
    pos, weight = kwargs.get("pos_weight"), kwargs.get("weight")
    if name == "binary_cross_entropy_with_logits" and pos is not None and weight is None:
        y = y.reshape(len(y), -1).astype(np.float64)
        try:
            w = np.broadcast_to(np.asarray(st.host(pos), dtype=np.float64).reshape(-1),
                                (y.shape[1],))
        except ValueError:  # weights for another layout of the targets: not read here
            return None
        p = y.mean(axis=0)
        best = None
        for c in range(y.shape[1]):
            if not 0 < p[c] < 1 or not w[c] > 0:
                continue
            raw = p[c] / (1 - p[c])  # positives' share of the loss over negatives', unweighted
            got = abs(math.log(w[c] * raw))
            if best is None or got - abs(math.log(raw)) > best[0]:
                best = (got - abs(math.log(raw)), got, abs(math.log(raw)), c)
        if best is None:
            return None
        return {"keyword": "pos_weight", "tilt": math.exp(best[1]),
                "data_tilt": math.exp(best[2]), "class": int(best[3])}
    class_weight = kwargs.get("class_weight")  # Keras fit's, by class id
    if class_weight is not None or (name in ("cross_entropy", "nll_loss") and
                                    weight is not None and pos is None):
        labels = st.as_labels(y, name)
        w = np.asarray(st.host(weight if class_weight is None else class_weight),
                       dtype=np.float64).reshape(-1)
        if labels is None or labels.ndim != 1:
            return None
        labels = labels[(labels >= 0) & (labels < len(w))]  # (ignored positions)
        counts = np.bincount(labels, minlength=len(w)).astype(np.float64)
        present = (counts > 0) & (w > 0)
        if present.sum() < 2:
            return None
        shares, raw = (w * counts)[present], counts[present]
        heavy = int(np.flatnonzero(present)[np.argmax(shares)])
        return {"keyword": "weight" if class_weight is None else "class_weight",
                "tilt": float(shares.max() / shares.min()),
                "data_tilt": float(raw.max() / raw.min()), "class": heavy}
    return None


@register
class LossWeights(SettingExperiment):
    """Class weights that tilt the classes beyond the data, tested by copies without them."""

    id = "loss_weights"
    cost = 2
    categories = ("healthy", "convergence_to_wrong_solution", "loss_not_decreasing")
    reveals = "convergence_to_wrong_solution"
    frameworks = ("torch", "keras")
    fix = ("Set the class weights from the class frequencies of this data (inverse frequency: "
           "pos_weight = negatives / positives), or remove them.")

    def applies(self, ctx: ProbeContext) -> bool:
        """With a trainer whose loss is weighted (``weight=`` or ``pos_weight=``)."""
        kwargs = getattr(ctx.trainer, "loss_kwargs", None) or {}
        return super().applies(ctx) and any(kwargs.get(k) is not None for k in _KEYWORDS)

    def run(self, ctx: ProbeContext):
        """A finding when the weights tilt the classes; confirmed by copies without them."""
        tr = ctx.trainer
        found = tilt(tr)
        if found is None or found["tilt"] < TILT or \
                found["tilt"] < BEYOND * found["data_tilt"]:
            return []
        plain = tr.without_loss_weights()
        weighted, unweighted = _judged(tr, plain, ctx)
        if BETTER * weighted <= unweighted < weighted:  # better, not clearly: train longer
            weighted, unweighted = _judged(tr, plain, ctx, steps=LONGER * COPY_STEPS,
                                           seconds=LONGER * 2.0)
        confirmed = unweighted < BETTER * weighted
        keyword = found["keyword"]
        written = re.compile(rf"""\b{keyword}["']?\s*[:=]\s*[-\d.(\[{{]""")
        anywhere = re.compile(rf"\b{keyword}\s*=")
        loss_at = ctx.ref("loss_fn") or ctx.ref("backward")
        where = source_line(ctx, written, near=loss_at) or \
            setting_location(source_line(ctx, anywhere, near=loss_at), keyword) or loss_at
        heavy = (f"the positives and negatives of output {found['class']}"
                 if keyword == "pos_weight" else f"class {found['class']} and the lightest class")
        return [self.finding(
            "hyperparameter", confirmed,
            f"The loss's {keyword} weighs {heavy} {found['tilt']:.1f} to 1 in the loss, where "
            f"the data alone weighs them {found['data_tilt']:.1f} to 1: the model learns to "
            "favour the heavier side. "
            f"Two copies trained on the same rows, judged on the plain loss of held-out rows: "
            f"{weighted:.4g} with the weights, {unweighted:.4g} without"
            + (" (clearly better)." if confirmed else " (not clearly better)."),
            where, strength=0.8 if confirmed else 0.2, undone=confirmed, decisive=confirmed,
            keyword=keyword,
            tilt=round(found["tilt"], 3), data_tilt=round(found["data_tilt"], 3),
            heldout_weighted=weighted, heldout_unweighted=unweighted)]


def _judged(tr, plain, ctx, **longer) -> tuple[float, float]:
    """Held-out plain loss of a copy trained with the weights and of one trained without."""
    return (heldout_loss(tr, ctx, best=True, judge=plain, **longer),
            heldout_loss(plain, ctx, best=True, **longer))
