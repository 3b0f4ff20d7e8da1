"""``constant_inputs``: the model's training inputs do not vary from row to row.

Measured on the kept training inputs: when every feature (every pixel, every token position)
holds the same value in every row, the inputs cannot tell one example from another, so no model
can do better than predicting the label prior or the target mean, whatever its architecture or
rate. That is a direct measurement with no experiment to add (a copy trained on identical rows
is the constant predictor); the finding is located where the inputs were made (a zeroing
``x * 0``, a broken preprocessing step, a mask applied everywhere).
"""

from __future__ import annotations

import numpy as np

from . import _numpy_stats as st
from .base import Probe, ProbeContext, register

MIN_ROWS = 16
ROWS = 512    # rows compared at most
SAME = 0.99   # share of the rows equal to the first one


@register
class ConstantInputs(Probe):
    """Training inputs identical across rows."""

    id = "constant_inputs"
    data_role = "inputs"
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution")
    fix = ("Look at the inputs the model is trained on: they are the same in every row (a "
           "preprocessing step zeroed or overwrote them). Fix that step; the model cannot learn "
           "from identical inputs.")

    def applies(self, ctx: ProbeContext) -> bool:
        """When training inputs were kept (the arrays, or the sampled batches)."""
        return super().applies(ctx) and _inputs(ctx) is not None

    def run(self, ctx: ProbeContext):
        """One confirmed finding when (almost) every kept row equals the first one."""
        x = _inputs(ctx)
        if x is None or len(x) < MIN_ROWS:
            return []
        x = np.asarray(x[:ROWS]).reshape(min(len(x), ROWS), -1)
        if x.shape[1] == 0:
            return []
        x = x.astype("float32", copy=False)
        same = np.array([np.array_equal(row, x[0], equal_nan=True) for row in x])
        if same.mean() < SAME:
            return []
        values = np.unique(x[0][np.isfinite(x[0])])[:3]
        return [self.finding(
            "data", True,
            f"The training inputs are the same in every row: {int(same.sum())} of {len(x)} "
            f"kept rows equal the first (which holds "
            f"{', '.join(f'{v:.4g}' for v in values)}{' ...' if len(values) == 3 else ''}). No "
            "model can tell the examples apart, so the loss can only reach the constant "
            "predictor's.", st.data_location(ctx), strength=0.95, decisive=True,
            rows=len(x), features=int(x.shape[1]), same_rows=int(same.sum()))]


def _inputs(ctx: ProbeContext):
    """The training inputs the model was fed, as a NumPy array; None when none were kept.

    The sampled batches' first input, else the kept arrays.
    """
    inputs = getattr(ctx.trainer, "inputs", None)
    if inputs:
        x = inputs[0]
        return x.detach().cpu().float().numpy() if hasattr(x, "detach") else np.asarray(x)
    return ctx.train_xy[0] if ctx.train_xy is not None else None
