"""``missing_zero_grad``: gradients accumulate across steps because they are never cleared."""

from __future__ import annotations

from ._lint import lint_hits, loc
from .base import Probe, ProbeContext, register


@register
class MissingZeroGrad(Probe):
    """The ``zero_grad`` calls counted during the run, and the lint's hint."""

    id = "missing_zero_grad"
    categories = ("gradient_instability", "loss_not_decreasing", "convergence_to_wrong_solution")
    frameworks = ("torch", "none")  # Keras clears gradients itself
    fix = ("Call optimizer.zero_grad() once per step, before loss.backward(), so gradients do "
           "not accumulate across steps.")

    def run(self, ctx: ProbeContext):
        """Confirmed when ``zero_grad`` was never called over several optimizer steps.

        A lint hit alone is a hypothesis.
        """
        hits = lint_hits(ctx, "missing_zero_grad")
        calls = ctx.run.first("calls") or {}
        steps = len(ctx.run.steps)
        zero = calls.get("zero_grad")
        measured = zero == 0 and steps > 1
        if not hits and not measured:
            return []
        where = loc(hits[0]) if hits else ctx.ref("backward")
        growth = ctx.signals.get("grad_norm_growth")
        if measured:
            return [self.finding(
                "training_loop", True,
                f"zero_grad() was called {zero} times in {steps} optimizer steps: every "
                "backward() adds to the gradients of all previous steps, so the update grows "
                "with the step count and points at the sum of old gradients.",
                where, zero_grad_calls=zero, steps=steps, grad_norm_growth=growth, strength=0.95)]
        return [self.finding("training_loop", False, hits[0].message + " (zero_grad calls were "
                             "not counted in this run)", where, strength=0.4)]
