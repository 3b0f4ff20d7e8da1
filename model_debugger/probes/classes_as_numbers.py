"""``classes_as_numbers``: class labels fitted as numbers by a regression loss.

Digits 0-9 (or any few consecutive class ids) given to a one-unit output under a squared or
absolute error: the model learns a number per input, and rounding it is a poor classifier,
since neighbouring ids are "close" and the loss pays for a 9 read as 0 more than for a 4 read
as 5. The loss falls and the run looks healthy. Measured on the run's own model and the kept
rows: the targets are a few consecutive integers each holding a fair share of the rows, and a
5-nearest-neighbour classifier on the same inputs (no training: nothing about the model limits
it) tells the classes apart far better than both the model's rounded outputs and always naming
the commonest id (ratings skewed to one value, a fair regression, are no such case). A direct measurement,
decisive; on a run that looked healthy it re-classifies it ``convergence_to_wrong_solution``.
Located at the regression loss (``loss="mse"``), else at the output layer.
"""

from __future__ import annotations

import re

import numpy as np

from . import _numpy_stats as st
from ._heldout import source_line
from ._made import output_location
from .base import Probe, ProbeContext, register

MAX_CLASSES = 30  # consecutive integer ids, at most this many ...
MIN_SHARE = 0.02  # ... each holding at least this share of the rows
MARGIN = 0.15     # the neighbours' accuracy above the model's rounded outputs'
MIN_ROWS = 64
_REGRESSION = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
_LOSS_LINE = re.compile(r"""loss\s*=\s*["'](?:mse|mae|mean_squared_error|mean_absolute_error|"""
                        r"""huber)["']|\b(?:MSELoss|L1Loss|SmoothL1Loss|HuberLoss|"""
                        r"""MeanSquaredError|MeanAbsoluteError|Huber)\(|\bF\.mse_loss\(""")


def class_ids(y) -> np.ndarray | None:
    """``y`` as integer class ids when it looks like classes, else None.

    One column of integers (any dtype), 3 to :data:`MAX_CLASSES` consecutive values, each at
    least :data:`MIN_SHARE` of the rows.
    """
    y = np.asarray(y, dtype=np.float64)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1 or len(y) < MIN_ROWS or not np.isfinite(y).all() or \
            not np.all(y == np.round(y)):
        return None
    values, counts = np.unique(y, return_counts=True)
    if not 3 <= len(values) <= MAX_CLASSES or values[-1] - values[0] != len(values) - 1 or \
            counts.min() < MIN_SHARE * len(y):
        return None
    return y.astype(np.int64)


@register
class ClassesAsNumbers(Probe):
    """Few consecutive integer targets under a regression loss, classified far worse than k-NN."""

    id = "classes_as_numbers"
    cost = 1
    categories = ("healthy", "convergence_to_wrong_solution", "loss_not_decreasing")
    reveals = "convergence_to_wrong_solution"
    needs_live = True
    frameworks = ("torch", "keras")
    fix = ("Treat the labels as classes: an output unit per class with a softmax (or logits) "
           "and a cross-entropy loss (sparse_categorical_crossentropy / nn.CrossEntropyLoss), "
           "and predict with argmax.")

    def run(self, ctx: ProbeContext):
        """A confirmed finding when the neighbours classify far better than the model rounds."""
        tr = ctx.trainer
        if tr is None or st.loss_name(ctx) not in _REGRESSION:
            return []
        inputs, target = (tr.val_inputs, tr.val_targets) if getattr(tr, "val_targets", None) \
            is not None and len(tr.val_targets) >= MIN_ROWS else (tr.inputs, tr.targets)
        if inputs is None or len(inputs) != 1 or target is None:
            return []
        labels = class_ids(st.host(target))
        if labels is None:
            return []
        try:
            out = np.asarray(tr.predict(tr.model, tuple(inputs)), dtype=np.float64)
            out = out.reshape(len(labels), -1)
            x = np.asarray(st.host(inputs[0]), dtype=np.float64)
        except Exception:  # noqa: BLE001 - a model the probe cannot call on these rows
            return []
        if out.shape[1] != 1:
            return []
        rounded = np.clip(np.rint(out[:, 0]), labels.min(), labels.max())
        model_acc = float((rounded == labels).mean())
        knn_acc = float(st.knn_score(x, labels - labels.min(), True))
        majority = float(np.bincount(labels - labels.min()).max() / len(labels))
        if knn_acc < max(model_acc, majority) + MARGIN:
            return []  # (ratings skewed to one value: the neighbours' vote is no classifier)
        where = source_line(ctx, _LOSS_LINE, near=ctx.ref("model")) or output_location(ctx) \
            or ctx.ref("model")
        k = int(labels.max() - labels.min() + 1)
        return [self.finding(
            "architecture", True,
            f"The targets are {k} consecutive class ids ({labels.min()}-{labels.max()}) fitted "
            f"as numbers by a regression loss on one output. Rounded, the model's outputs name "
            f"the right class for {model_acc:.0%} of {len(labels)} rows; a 5-nearest-neighbour "
            f"classifier on the same inputs gets {knn_acc:.0%}: the classes can be told apart, "
            "the number line cannot.",
            where, strength=0.85, decisive=True, classes=k, rows=int(len(labels)),
            rounded_accuracy=model_acc, knn_accuracy=knn_acc, majority_rate=majority)]
