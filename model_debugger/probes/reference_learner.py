"""``reference_learner``: whether the data holds what the model did not learn.

A loss that settles well above zero is the task's floor when the targets cannot be told from
the inputs any better (noisy labels, a hard task), and a failure of the model when they can
(a bottleneck it cannot pass, a rate it cannot learn at). A 5-nearest-neighbour predictor on
the kept training rows (standardised inputs, two folds: it needs no training, so nothing about
the user's model or optimiser limits it) says which: its held-out score against the run's own.

It blames no cause, so it returns no finding: the measurement (``learnable``) goes to Isolate,
which keeps a plateau a problem instead of taking it as the task's floor when the neighbours do
far better than the model (:func:`model_debugger.phases.isolate._settle_plateau`).
"""

from __future__ import annotations

import numpy as np

from . import _numpy_stats as st
from ._layers import token_ids
from .base import Probe, ProbeContext, register
from .report import ProbeResult

MIN_ROWS = 64


@register
class ReferenceLearner(Probe):
    """A k-nearest-neighbour score on the kept rows against the run's own score."""

    id = "reference_learner"
    cost = 1
    categories = ("loss_not_decreasing",)
    needs_live = True
    frameworks = ("torch", "keras")

    def run(self, ctx: ProbeContext):
        """``learnable``: the neighbours' and the model's scores.

        Nothing when either is unknown (no kept rows of one flat numeric input, no score of
        the run's own), or when the inputs are ids an embedding looks up (a token id is no
        nearer to the next id than to any other: neighbours on ids measure nothing).
        """
        tr = ctx.trainer
        if tr is None or tr.n < MIN_ROWS or token_ids(ctx):
            return []  # (ids an embedding looks up have no distance: no neighbours)
        inputs, target = tr.subset(np.arange(tr.n))
        if len(inputs) != 1:
            return []
        try:
            x = np.asarray(st.host(inputs[0]), dtype=np.float64)
            y = np.asarray(st.host(target))
        except (TypeError, ValueError):
            return []
        labels = st.as_labels(y, getattr(tr.loss_fn, "__name__", None))
        if labels is not None and (labels < 0).any():
            return []  # ignored positions: not one label per row
        if labels is None:
            try:
                y = y.astype(np.float64).reshape(len(y), -1)
            except (TypeError, ValueError):
                return []
            if y.shape[1] != 1:
                return []  # several outputs: one column's R^2 is not the model's loss
            y = y[:, 0]
        if not np.isfinite(x).all() or (labels is None and not np.isfinite(y).all()):
            return []
        model, metric = _model_score(ctx, labels is not None)
        if model is None:
            return []
        score = st.knn_score(x, labels if labels is not None else y, labels is not None)
        return ProbeResult(learnable={"reference": "5-nearest-neighbour", "metric": metric,
                                      "score": round(float(score), 4),
                                      "model_score": round(float(model), 4),
                                      "rows": int(min(len(x), 1536))})


def _model_score(ctx: ProbeContext, classes: bool) -> tuple[float | None, str]:
    """The run's own score on the neighbours' scale.

    Its best validation (else training) accuracy, or for a mean-squared regression the share
    of the target's variance its loss explains.
    """
    sig = ctx.signals
    if classes:  # the better of its two: the neighbours score held-out training rows, so a
        # validation split that is harder than the training rows must not count against it
        scores = [float(sig[k]) for k in ("val_acc_max", "train_acc_max")
                  if isinstance(sig.get(k), (int, float))]
        return (max(scores) if scores else None), "accuracy"
    base, final = sig.get("constant_predictor_loss"), sig.get("loss_final")
    targets = ctx.run.of("targets")
    if (targets[-1] if targets else {}).get("loss") == "mse_loss" and \
            isinstance(base, (int, float)) and base > 0 and isinstance(final, (int, float)):
        return 1.0 - float(final) / float(base), "r2"
    return None, "r2"
