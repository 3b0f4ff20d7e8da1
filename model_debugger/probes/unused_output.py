"""``unused_output``: a layer the forward pass runs and then throws its output away.

``self.drop(x)`` written where ``x = self.drop(x)`` was meant (a dropout, an activation, a
normalisation): the layer runs, and the path to the model's output goes around it. The
model trains without what the layer was there for (no dropout: it overfits; no activation:
it is linear). Found on a fresh copy (one forward pass: the gradient of what the model returns
reaches the layer's input but none of its outputs), then tested by experiment: two fresh copies
trained on the same rows, one as written and one with the layer's output passed on to the
layers called after it with its input; confirmed when that copy reaches a clearly lower
held-out loss. On an overfitting run the copies train four times as long and are judged on
their last held-out loss (what the rise costs), not the best. Located at the call whose
result is dropped.
"""

from __future__ import annotations

from ._heldout import BETTER, COPY_STEPS, LONGER, SettingExperiment, heldout_loss
from .base import ProbeContext, register


@register
class UnusedOutput(SettingExperiment):
    """A layer whose output nothing uses, and a copy that uses it learns clearly better."""

    id = "unused_output"
    cost = 2
    categories = ("overfitting", "loss_not_decreasing", "convergence_to_wrong_solution",
                  "gradient_instability", "healthy")
    reveals = "loss_not_decreasing"  # a layer dropped from the path: a loss held above what
    # the model as meant reaches, on a run that looked healthy
    fix = ("Assign the layer's result where it is called (x = self.dropout(x), not "
           "self.dropout(x)): a layer whose output is not used does nothing.")

    def run(self, ctx: ProbeContext):
        """One finding for the layers whose output is dropped; nothing when there are none."""
        tr = ctx.trainer
        try:
            dropped = tr.discarded_outputs()
        except Exception:  # noqa: BLE001 - a model a copy cannot run: nothing to read
            return []
        if not dropped:
            return []
        names = {d["layer"] for d in dropped}
        try:
            as_written, used, confirmed = self._compare(ctx, tr.passing_on(names))
        except (ValueError, RuntimeError):  # the copy does not hold those layers, or their
            return []  # output does not fit where its input went: no experiment to run
        listed = ", ".join(f"'{d['layer']}' ({d['kind']})" for d in dropped)
        how = "last" if ctx.classification.primary == "overfitting" else "best"
        return [self.finding(
            "architecture", confirmed,
            f"The forward pass calls {listed} and never uses the result: the path to the "
            f"model's output goes around it. Two fresh copies trained on the same rows reach a "
            f"{how} held-out loss of {used:.4g} with the result passed on and {as_written:.4g} "
            f"as written"
            + (": the unused layer is what the model lacks." if confirmed else
               ": no clearly better, so the unused layer is not what goes wrong."),
            dropped[0]["where"] or ctx.ref("model"), undone=confirmed,
            strength=0.9 if confirmed else 0.2, decisive=confirmed,
            layers=sorted(names), heldout_as_written=as_written, heldout_passed_on=used)]

    @classmethod
    def _compare(cls, ctx: ProbeContext, change) -> tuple[float, float, bool]:
        """:meth:`SettingExperiment.compare`, or for overfitting the last loss of longer runs."""
        if ctx.classification.primary != "overfitting":
            return cls.compare(ctx, change)
        tr, longer = ctx.trainer, {"steps": LONGER * COPY_STEPS, "seconds": LONGER * 2.0}
        as_written = heldout_loss(tr, ctx, **longer)
        used = heldout_loss(tr, ctx, change=change, **longer)
        return as_written, used, used < BETTER * as_written
