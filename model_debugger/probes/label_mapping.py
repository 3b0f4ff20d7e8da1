"""``label_mapping``: validation labels that number the classes otherwise than training's.

A label encoder fitted on each split apart (a ``StringLookup`` or ``LabelEncoder`` adapted again
on the validation labels, classes numbered by frequency or by first appearance) gives the same
class another id in each split. The model learns the training ids, and validation scores it
against the others: training accuracy climbs while validation stays near chance, which reads as
overfitting. Measured on the trained model: its predictions on the kept validation rows, against
their labels, and the one-to-one relabelling of the classes that agrees best with them (the
assignment problem on the confusion matrix). When that relabelling lifts validation accuracy
from near what it was to about the training rows' accuracy, while the training rows need no
relabelling, the validation labels are numbered otherwise: decisive. Located where the
validation labels were made.
"""

from __future__ import annotations

import numpy as np

from .base import Probe, ProbeContext, register

LIFT = 0.25    # relabelling lifts validation accuracy by at least this much ...
NEAR = 0.8     # ... to at least this share of the training rows' accuracy
PER_CLASS = 5  # validation rows per class at least
ROWS = 4096
LEARNED = 0.2  # training accuracy this far above the majority rate: the model learned them
TRAIN_SLACK = 0.05  # no renumbering of the training labels does better than this


@register
class LabelMapping(Probe):
    """Validation labels whose class ids are a permutation of the training ones."""

    id = "label_mapping"
    categories = ("overfitting", "convergence_to_wrong_solution", "loss_not_decreasing")
    symptom = "convergence_to_wrong_solution"  # the loss falls, the validation metric does not
    needs_live = True
    frameworks = ("torch", "keras")
    traces_origin = False  # located at the validation labels' origin below
    fix = ("Encode the validation labels with the training split's mapping (reuse the fitted "
           "encoder or vocabulary: lookup = StringLookup(vocabulary=train_vocab); "
           "encoder.transform(y_val), not fit_transform).")

    def applies(self, ctx: ProbeContext) -> bool:
        """With a trained model and kept validation rows."""
        tr = ctx.trainer
        return super().applies(ctx) and tr is not None and ctx.model is not None and \
            getattr(tr, "val_inputs", None) is not None and tr.val_targets is not None

    def run(self, ctx: ProbeContext):
        """One decisive finding when a relabelling of validation restores its accuracy."""
        tr = ctx.trainer
        val = _classes(tr, ctx.model, tr.val_inputs, tr.val_targets)
        train = _classes(tr, ctx.model, tr.inputs, tr.targets)
        if val is None or train is None:
            return []
        (pred, truth, k), (tpred, ttruth, _) = val, train
        if len(truth) < PER_CLASS * k:
            return []
        rows, cols, relabelled = _best_renumbering(pred, truth, k)
        as_labelled = float(np.mean(pred == truth))
        on_train = float(np.mean(tpred == ttruth))
        majority = float(np.bincount(ttruth, minlength=k).max() / len(ttruth))
        _, _, train_relabelled = _best_renumbering(tpred, ttruth, k)
        moved = {int(r): int(c) for r, c in zip(rows, cols) if r != c}
        if not moved or relabelled < as_labelled + LIFT or relabelled < NEAR * on_train or \
                on_train < majority + LEARNED or train_relabelled > on_train + TRAIN_SLACK:
            return []  # (a model that learned the training labels as numbered, and only
            # the validation labels need renumbering)
        pairs = ", ".join(f"{r} -> {c}" for r, c in sorted(moved.items())[:8])
        return [self.finding(
            "data", True,
            f"The trained model's predictions agree with the validation labels on "
            f"{as_labelled:.0%} of {len(truth)} rows, and with the training labels on "
            f"{on_train:.0%}. Renumbering the validation classes ({pairs}) makes them agree on "
            f"{relabelled:.0%}: the validation labels number the classes otherwise than the "
            "training labels (an encoder fitted on each split apart).",
            _where(ctx), strength=0.95, decisive=True, undone=True, mapping=moved,
            val_accuracy=as_labelled, val_accuracy_relabelled=relabelled,
            train_accuracy=on_train, rows=len(truth))]


def _best_renumbering(pred: np.ndarray, truth: np.ndarray, k: int) -> tuple:
    """``(rows, cols, accuracy)``: the one-to-one class renumbering agreeing best with ``pred``.

    The assignment problem on the confusion matrix (SciPy's solver when installed; else
    every permutation up to 7 classes, a greedy matching beyond).
    """
    confusion = np.zeros((k, k))
    np.add.at(confusion, (truth, pred), 1)
    try:
        from scipy.optimize import linear_sum_assignment
    except ImportError:  # (SciPy is not a dependency of the core package)
        rows, cols = _assign(confusion)
    else:
        rows, cols = linear_sum_assignment(-confusion)
    return rows, cols, float(confusion[rows, cols].sum() / len(truth))


def _assign(confusion: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The matching of rows to columns with the largest total, without SciPy."""
    import itertools

    k = len(confusion)
    rows = np.arange(k)
    if k <= 7:
        best = max(itertools.permutations(range(k)),
                   key=lambda perm: confusion[rows, list(perm)].sum())
        return rows, np.array(best)
    cols = np.full(k, -1)
    free_rows, free_cols = set(range(k)), set(range(k))
    for flat in np.argsort(-confusion, axis=None):
        r, c = divmod(int(flat), k)
        if r in free_rows and c in free_cols:
            cols[r] = c
            free_rows.discard(r)
            free_cols.discard(c)
    return rows, cols


def _classes(tr, model, inputs, targets) -> tuple | None:
    """``(predicted ids, label ids, classes)`` of up to ``ROWS`` rows; None unless one class per row.

    The output must have a column per class (two or more); labels are class ids, or one-hot
    rows.
    """
    n = min(len(targets), ROWS)
    inputs = tuple(x[:n] for x in inputs)
    truth = np.asarray(targets[:n].cpu() if hasattr(targets, "cpu") else targets[:n])
    try:
        out = np.asarray(tr.predict(model, inputs), dtype=np.float64)
    except Exception:  # noqa: BLE001 - a model the kept rows cannot be fed to: nothing to read
        return None
    if out.ndim != 2 or out.shape[1] < 2 or len(out) != n:
        return None
    k = out.shape[1]
    if truth.ndim == 2 and truth.shape[1] == k:
        if not np.all(np.isclose(truth.sum(axis=1), 1.0)):
            return None  # multi-hot or soft labels
        truth = truth.argmax(axis=1)
    if truth.ndim != 1 or truth.dtype.kind not in "iuf" or \
            not np.all(np.mod(truth, 1) == 0) or truth.min() < 0 or truth.max() >= k:
        return None
    return out.argmax(axis=1), truth.astype(int), k


def _where(ctx: ProbeContext) -> dict | None:
    """Where the validation labels were made: ``validation_data``'s targets, else the eval's.

    A hand-written score's labels: where the name they were compared under was assigned, else
    traced from the comparison that used them.
    """
    from ..provenance import VALIDATION_TARGETS, data_origin
    from . import _numpy_stats as st

    labels = next((e for e in ctx.run.of("ref") if e.get("kind") == "eval_labels"), None)
    if labels is not None and labels.get("made"):
        return {"file": labels["file"], "line": labels["line"]}
    used = ctx.ref("eval_labels") or ctx.ref("eval_forward") or st.data_location(ctx)
    return data_origin(used, VALIDATION_TARGETS) or used
