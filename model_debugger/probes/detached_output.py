"""``detached_output``: no gradient reaches the weights because the prediction was detached."""

from __future__ import annotations

from ._lint import lint_hits, loc
from .base import Probe, ProbeContext, register


@register
class DetachedOutput(Probe):
    """Whether gradients reach the weights: the recorded gradient norms, and the lint's hint."""

    id = "detached_output"
    categories = ("loss_not_decreasing",)
    fix = ("Remove the .detach()/.data/no_grad on the path from the model's output to the loss, "
           "so gradients reach the weights.")

    def run(self, ctx: ProbeContext):
        """Confirmed when no optimizer step had a gradient; a lint hit alone is a hypothesis."""
        hits = lint_hits(ctx, "detached_output")
        steps = ctx.run.steps
        # a step without a "gn" key was not measured (a log); None means no gradient at all
        no_grad = sum(1 for s in steps if "gn" in s and s["gn"] in (None, 0, 0.0))
        measured = len(steps) > 1 and no_grad == len(steps)
        if not hits and not measured:
            return []
        where = loc(hits[0]) if hits else ctx.ref("backward")
        if measured:
            return [self.finding(
                "training_loop", True,
                f"In all {len(steps)} optimizer steps no parameter had a gradient: backward() "
                "never reaches the weights, so the optimizer has nothing to apply. The model "
                "output is cut from the graph (detach/.data/numpy round trip) before the loss.",
                where, steps=len(steps), steps_without_gradient=no_grad, strength=0.95,
                decisive=True)]
        return [self.finding("training_loop", False, hits[0].message + " (gradients did reach "
                             "some weights)", where, strength=0.3)]
