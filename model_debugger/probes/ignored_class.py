"""``ignored_class``: a cross-entropy told to ignore a class the targets really hold.

``ignore_index`` marks padding or unlabelled positions (PyTorch's default is -100, no class).
Set to a real class id (``ignore_index=0`` where 0 is "no churn"), every row of that class is
dropped from the loss: the model never pays for calling
such a row anything else, and learns to name the other classes everywhere. The loss falls,
toward zero even, while the metric sits at a wrong solution.

Measured directly on the kept training targets, one class per row (token or pixel targets,
where an ignored id marks padding, are not read): the share of rows whose class is the ignored
id, among the class ids the model's output has (``0 <= ignore_index < C``). A share of at
least :data:`MIN_SHARE` of a class that the output names is decisive: those rows are not in the
loss, by definition. Located where the value is set (``IGNORE_INDEX = 0``), else where it is
passed (``ignore_index=``).
"""

from __future__ import annotations

import re

import numpy as np

from . import _numpy_stats as st
from ._heldout import source_line
from .base import Probe, ProbeContext, register, setting_location

MIN_SHARE = 0.02  # of the training rows in the ignored class
_PASSED = re.compile(r"\bignore_index\s*=")


@register
class IgnoredClass(Probe):
    """A cross-entropy's ``ignore_index`` that is one of the output's classes."""

    id = "ignored_class"
    cost = 1
    categories = ("healthy", "convergence_to_wrong_solution", "loss_not_decreasing",
                  "overfitting")
    reveals = "convergence_to_wrong_solution"
    needs_live = True
    frameworks = ("torch",)
    fix = ("Leave ignore_index at its default (-100) unless a target value really marks rows "
           "to skip, and never set it to a class id the model predicts.")

    def applies(self, ctx: ProbeContext) -> bool:
        """A live PyTorch cross-entropy (or NLL) with an ``ignore_index`` of 0 or more."""
        kwargs = getattr(ctx.trainer, "loss_kwargs", None) or {}
        index = kwargs.get("ignore_index")
        return super().applies(ctx) and ctx.trainer is not None and \
            isinstance(index, int) and index >= 0 and \
            getattr(ctx.trainer.loss_fn, "__name__", "") in ("cross_entropy", "nll_loss")

    def run(self, ctx: ProbeContext):
        """Decisive when the ignored id is an output class holding a share of the rows."""
        tr = ctx.trainer
        index = int(tr.loss_kwargs["ignore_index"])
        try:
            y = np.asarray(st.host(tr.targets))
            out = tr.predict(tr.model, tuple(x[:2] for x in tr.inputs))
        except Exception:  # noqa: BLE001 - a model the probe cannot call on these rows
            return []
        out = np.asarray(out)
        classes = int(out.shape[1]) if out.ndim == 2 else 0  # one score per class and row
        if y.ndim != 1 or y.dtype.kind not in "iu" or not 0 <= index < classes or not y.size:
            return []  # (token or pixel targets: an ignored id there is padding, by design)
        share = float((y == index).mean())
        if share < MIN_SHARE:
            return []
        passed = source_line(ctx, _PASSED, near=ctx.ref("loss_fn") or ctx.ref("backward"))
        where = setting_location(passed, "ignore_index") if passed else \
            ctx.ref("loss_fn") or ctx.ref("backward")
        return [self.finding(
            "training_loop", True,
            f"The loss ignores target {index} (ignore_index={index}), which is one of the "
            f"{classes} classes the model outputs: {share:.0%} of the training rows hold it, "
            "and none of them reaches the loss. The model never pays for calling those rows "
            "another class.",
            where, strength=0.9, decisive=True, ignore_index=index, classes=classes,
            ignored_share=share)]
