"""Probe ``class_imbalance``: whether one class is so frequent that predicting it is enough.

Class frequencies come from the training targets (``ctx.train_xy[1]``: integer labels, 0/1 floats
or one-hot rows) or, on a log-only session, from the record's last ``targets`` event (class counts,
or the mean of binary targets under a binary cross-entropy); when both exist the larger sample
wins. Confirmed when the majority class holds >= 80% of the samples or the rarest class <= 5%.
Located where the imbalance is undone (:func:`_where`): the line that dropped rows, else where
training weighs the classes.
An accuracy sitting at the majority share is named in the explanation: the model has learned to
predict the majority class.
"""

from __future__ import annotations

import math

import numpy as np

from ..provenance import callee_made, data_origin, filters_rows
from ..records import Finding
from . import _numpy_stats as st
from .base import Probe, ProbeContext, register

MAJORITY = 0.8
RARE = 0.05
MIN_SAMPLES = 20
AT_MAJORITY = 0.01      # |accuracy - majority share| counted as "sits at the majority rate"


def _targets(ctx: ProbeContext):
    """The kept training targets: the arrays, else the targets of the sampled batches."""
    if ctx.train_xy is not None and ctx.train_xy[1] is not None:
        return ctx.train_xy[1]
    y = getattr(ctx.trainer, "targets", None)
    if y is None:
        return None
    return y.detach().cpu().numpy() if hasattr(y, "detach") else np.asarray(y)


def _from_arrays(ctx: ProbeContext) -> dict[int, int] | None:
    y = _targets(ctx)
    if y is None:
        return None
    labels = st.as_labels(y, st.loss_name(ctx))
    if labels is None:
        return None
    classes, counts = np.unique(labels, return_counts=True)
    return {int(c): int(n) for c, n in zip(classes, counts)}


def _from_record(ctx: ProbeContext) -> dict[int, int] | None:
    events = ctx.run.of("targets")
    if not events:
        return None
    t = events[-1]
    if t.get("counts"):
        return {i: int(c) for i, c in enumerate(t["counts"])}
    mean, n = t.get("mean"), t.get("n")
    if str(t.get("loss", "")).startswith("binary_cross_entropy") and n and mean is not None \
            and 0 <= mean <= 1:
        return {0: round(n * (1 - mean)), 1: round(n * mean)}
    return None


@register
class ClassImbalance(Probe):
    """Measure class frequencies and relate them to the accuracy the run reached."""

    id = "class_imbalance"
    data_role = "targets"
    traces_origin = False  # located by :func:`_where`: the rows dropped, else the weighting
    categories = ("convergence_to_wrong_solution", "loss_not_decreasing")
    needs_live = False
    fix = ("Weight the loss by inverse class frequency (CrossEntropyLoss(weight=...)) or "
           "resample; for a binary score, choose the decision threshold on validation data.")

    def suggestion(self, finding) -> str:
        """For a single class: the step that overwrote the labels; else the class's fix."""
        if finding.evidence.get("single_class"):
            return ("Every training label is the same class: find the step that overwrote or "
                    "mis-read the labels (a mask, a `* 0`, the wrong column) and fix it.")
        return self.fix

    def applies(self, ctx: ProbeContext) -> bool:
        """When there are training targets: as arrays, or a ``targets`` event in the record."""
        return super().applies(ctx) and (_targets(ctx) is not None or bool(ctx.run.of("targets")))

    def run(self, ctx: ProbeContext) -> list[Finding]:
        """One confirmed finding when the majority class holds >= 80% or the rarest class <= 5%."""
        sources = [(c, name) for c, name in ((_from_arrays(ctx), "arrays"),
                                              (_from_record(ctx), "record")) if c]
        if not sources:
            return []
        counts, source = max(sources, key=lambda s: sum(s[0].values()))
        seen = {k: v for k, v in counts.items() if v > 0}
        n = sum(seen.values())
        if n < MIN_SAMPLES or not seen:
            return []
        if len(seen) == 1:  # the extreme: one class, nothing to learn about the inputs
            [only] = seen
            # a constant prediction is what Classify saw; else (a contrastive loss whose
            # positive is always column 0, built in the loop) it stays a hypothesis
            constant = getattr(ctx.classification, "primary", None) == \
                "convergence_to_wrong_solution"
            return [self.finding(
                "data", constant, f"Every one of the {n} training targets is class {only}: the "
                "model can only learn to predict it, whatever the inputs (the labels were "
                "overwritten or read from the wrong place).",
                data_origin(st.data_location(ctx), self.data_role),
                strength=0.95 if constant else 0.3, decisive=constant, counts=counts, n=n,
                source=source, majority_class=only, majority_share=1.0, single_class=True)]
        major, minor = max(seen, key=seen.get), min(seen, key=seen.get)
        major_share, minor_share = seen[major] / n, seen[minor] / n
        if major_share < MAJORITY and minor_share > RARE:
            return []

        at_majority = []
        for split in ("val", "train"):
            acc = ctx.signals.get(f"{split}_acc_final")
            if isinstance(acc, (int, float)) and math.isfinite(acc) \
                    and abs(acc - major_share) <= AT_MAJORITY:
                at_majority.append((ctx.signals.get(f"{split}_acc_name") or f"{split} accuracy",
                                    float(acc)))
        missing = sorted(k for k, v in counts.items() if v == 0)
        total = ctx.run.of("targets")[-1].get("n") if source == "record" else None
        sampled = bool(source == "record" and ctx.run.of("targets")[-1].get("sampled"))
        of = f"a sample of {n} of the {total} training targets" if sampled else \
            f"{n} training targets"
        text = (f"The classes are imbalanced: class {major} holds {seen[major]} of {of} "
                f"({major_share:.1%}), the rarest, class {minor}, {seen[minor]} "
                f"({minor_share:.1%}).")
        if missing:
            more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
            text += f" Classes {missing[:10]}{more} " + (
                "do not occur in that sample." if sampled else "never occur.")
        if at_majority:
            said = ", ".join(f"{name} = {acc:.3f}" for name, acc in at_majority)
            text += (f" The accuracy sits at the majority rate ({said}): the model predicts the "
                     "majority class and has learned nothing about the others.")
        text += (" Plain accuracy and an unweighted loss reward predicting the frequent class; "
                 "weight the loss or resample, and judge with a class-balanced metric.")
        severity = max((major_share - MAJORITY) / (1 - MAJORITY), (RARE - minor_share) / RARE)
        strength = 0.5 + 0.3 * float(np.clip(severity, 0, 1)) + (0.2 if at_majority else 0.0)
        return [self.finding("data", True, text, _where(ctx, self.data_role), strength=strength,
                             counts=counts, n=n, source=source, majority_class=major,
                             majority_share=major_share, minority_class=minor,
                             minority_share=minor_share,
                             accuracy_at_majority=[name for name, _ in at_majority])]


def _where(ctx: ProbeContext, role: str) -> dict | None:
    """Where the imbalance is undone: the line that dropped rows, else where the loss is set.

    Training targets traced to a statement that keeps the rows a mask selects (``X, y =
    X[keep], y[keep]``) were made imbalanced there (a permutation, ``X[perm]``, drops none). Imbalanced at their source (a dataset, a generator's ``weights=``),
    the data is what it is: the fix is class weights or resampling where training weighs the
    classes, Keras's ``fit`` (``class_weight=``), or the line that made the loss function
    (``weight=``, ``pos_weight=``), else where the data enters training.
    """
    used = st.data_location(ctx)
    origin = data_origin(used, role)
    if origin is not None and origin != used and filters_rows(origin):
        return origin
    if used is not None and used == ctx.ref("loss_fn"):
        return callee_made(used)
    return used
