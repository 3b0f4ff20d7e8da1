"""``target_copy``: the answer is one of the model's inputs (the target copied into a feature).

Measured on the kept training batches, input rows paired with their targets: an input column
that is a one-to-one function of the target (every class always shows the same value there,
and different classes different values; for a regression target, a column equal to an affine
map of it, ``|r| >= 0.99999``). A model then reads the answer off that column and every score
measured on data built the same way (a validation split of the same array) is perfect and
means nothing: the classic leak of a label column left in the features.

This is stricter than ``leakage``'s "a single feature predicts the target" (an easy task, say
``y = x0 > 0``, has one of those and no leak): a continuous feature that separates the classes
still varies within a class, a copy of the label does not. Inputs of one column are the task
itself (fitting ``y = 2x + 1``), never a leak. It also runs on runs that look
healthy (their validation score is what the leak inflates): a confirmed finding re-classifies
such a run as ``overfitting`` (:attr:`Probe.reveals`), the category of a validation score that
will not hold on new data. Located where the inputs were made.
"""

from __future__ import annotations

import numpy as np

from . import _numpy_stats as st
from .base import Probe, ProbeContext, register
from .class_imbalance import _targets
from .constant_inputs import _inputs

MIN_ROWS = 64
ROWS = 4096
MAX_COLUMNS = 4096     # wider inputs (images, sequences) are not tabular features
CONSISTENT = 0.999     # share of rows whose value is their class's value
AFFINE_R = 0.99999


@register
class TargetCopy(Probe):
    """An input column that is a copy of the target."""

    id = "target_copy"
    data_role = "inputs"
    categories = ("healthy", "overfitting", "convergence_to_wrong_solution")
    reveals = "overfitting"
    fix = ("Drop the input column that holds the target (a label or id column left in the "
           "features, or a feature computed from the target): the model reads the answer off it, "
           "and any score on data built the same way is meaningless.")

    def applies(self, ctx: ProbeContext) -> bool:
        """When the kept training inputs and targets are there, row for row."""
        return super().applies(ctx) and _inputs(ctx) is not None and _targets(ctx) is not None

    def run(self, ctx: ProbeContext):
        """One confirmed finding for the first column that copies the target."""
        x, y = _inputs(ctx), _targets(ctx)
        n = min(len(x), len(y), ROWS)
        if n < MIN_ROWS:
            return []
        x = np.asarray(x[:n])
        x = x.reshape(n, -1).astype("float64", copy=False)
        if not 2 <= x.shape[1] <= MAX_COLUMNS:  # one column: the task itself (y = 2x + 1)
            return []
        y = np.asarray(y[:n])
        labels = st.as_labels(y, st.loss_name(ctx))
        if labels is not None and labels.ndim == 1 and len(np.unique(labels)) >= 2:
            column, what = _label_column(x, labels)
        else:
            column, what = _affine_column(x, y.reshape(n, -1).astype("float64"))
        if column is None:
            return []
        return [self.finding(
            "data", True,
            f"Input column {column} of the training batches is a copy of the target ({what}, "
            f"over {n} rows): the model can read the answer off it, so its scores on data "
            "built the same way (a validation split of the same array) say nothing about new "
            "data.", st.data_location(ctx), strength=0.95, decisive=True, column=int(column),
            rows=int(n), features=int(x.shape[1]))]


def _label_column(x: np.ndarray, labels: np.ndarray) -> tuple[int | None, str]:
    """The first column whose values map one to one onto the classes (on >= 99.9% of rows)."""
    classes = np.unique(labels)
    for j in range(x.shape[1]):
        col = x[:, j]
        if not np.isfinite(col).all():
            continue
        values = []
        agree = 0
        for c in classes:
            vals, counts = np.unique(col[labels == c], return_counts=True)
            values.append(vals[np.argmax(counts)])
            agree += int(counts.max())
        if len(set(values)) == len(classes) and agree >= CONSISTENT * len(col):
            return j, f"each of the {len(classes)} classes always has its own value there"
    return None, ""


def _affine_column(x: np.ndarray, y: np.ndarray) -> tuple[int | None, str]:
    """The first column equal to an affine map of a one-column regression target."""
    if y.shape[1] != 1:
        return None, ""
    t = y[:, 0]
    if not np.isfinite(t).all() or t.std() == 0:
        return None, ""
    with np.errstate(all="ignore"):
        xs = x - x.mean(axis=0)
        ts = t - t.mean()
        r = (xs * ts[:, None]).sum(axis=0) / np.sqrt((xs ** 2).sum(axis=0) * (ts ** 2).sum())
    hits = np.flatnonzero(np.abs(np.nan_to_num(r)) >= AFFINE_R)
    if not hits.size:
        return None, ""
    return int(hits[0]), f"correlation {float(r[hits[0]]):.6f} with the target"
