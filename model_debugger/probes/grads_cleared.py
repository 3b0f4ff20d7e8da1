"""``grads_cleared``: gradients cleared between ``backward()`` and the optimizer step.

``loss.backward(); optimizer.zero_grad(); optimizer.step()``: every step applies a zero (or
missing) gradient, so the weights never move and the loss stays where the initial model put it
(momentum and weight decay aside). The capture sees the order of the calls (the
``grads_cleared`` event: a ``zero_grad()`` after a ``backward()`` and before the step that was
to apply it, counted per step), so the finding is decisive when most steps do it. Located at
that ``zero_grad()``, which belongs before the backward.
"""

from __future__ import annotations

from .base import Probe, ProbeContext, register

MOST = 0.5  # of the optimizer steps


@register
class GradsCleared(Probe):
    """The capture's count of optimizer steps whose gradients were cleared just before."""

    id = "grads_cleared"
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution", "overfitting",
                  "gradient_instability", "healthy")
    reveals = "loss_not_decreasing"  # a run that looked healthy hardly trained
    frameworks = ("torch",)
    fix = ("Clear the gradients before the backward pass, not between it and the step: "
           "optimizer.zero_grad(); loss.backward(); optimizer.step().")

    def run(self, ctx: ProbeContext):
        """One decisive finding when most optimizer steps had their gradients cleared first."""
        seen = ctx.run.first("grads_cleared")
        if not seen or not seen.get("of"):
            return []
        share = seen["steps"] / seen["of"]
        if share < MOST:
            return []
        return [self.finding(
            "training_loop", True,
            f"In {seen['steps']} of {seen['of']} optimizer steps the gradients were cleared "
            "(zero_grad) after backward() and before the step: each step applies a zero "
            "gradient, so the weights do not learn from the loss.",
            seen.get("location") or ctx.ref("zero_grad"), strength=0.95, decisive=True,
            cleared_steps=seen["steps"], optimizer_steps=seen["of"])]
