"""``missing_zero_grad``: gradients accumulate across steps because they are never cleared."""

from __future__ import annotations

from ..records import Intervention
from ..thresholds import NOT_RESET
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

    def intervention(self, finding):
        """The gradients are cleared after every optimizer step in the re-run."""
        return Intervention("zero_grad")

    def run(self, ctx: ProbeContext):
        """Confirmed when the gradients were measured not reset between steps.

        That is: ``zero_grad`` never called over several optimizer steps (and no other reset
        seen), or >= 90% of the steps checked began their backward with the last step's
        gradients (``grad_reset``). A lint hit alone is a hypothesis.
        """
        hits = lint_hits(ctx, "missing_zero_grad")
        calls = ctx.run.first("calls") or {}
        steps = len(ctx.run.steps)
        zero = calls.get("zero_grad")
        stale = ctx.signals.get("grad_not_reset_share")
        reset = ctx.run.first("grad_reset") or {}
        never_called = zero == 0 and steps > 1 and (stale is None or stale > 0)
        not_reset = stale is not None and stale >= NOT_RESET
        if not hits and not never_called and not not_reset:
            return []
        where = loc(hits[0]) if hits else ctx.ref("backward")
        called = ctx.ref("zero_grad")
        if zero and not_reset and called and (not hits or _inside(called, hits[0])):
            where = called  # called, but not between the steps (once an epoch): move it there
        growth = ctx.signals.get("grad_norm_growth")
        if never_called or not_reset:
            seen = []
            if never_called:
                seen.append(f"zero_grad() was called {zero} times in {steps} optimizer steps")
            if not_reset:
                seen.append(f"{reset.get('not_reset')} of {reset.get('checked')} steps checked "
                            "began their backward with the previous step's gradients still "
                            "there" + (f" (zero_grad() was called {zero} times: not on these "
                                       "parameters, or not between the steps)" if zero else ""))
            return [self.finding(
                "training_loop", True,
                "; ".join(seen)[:1].upper() + "; ".join(seen)[1:] + ": every backward() adds "
                "to the gradients of all previous steps, so the update grows with the step "
                "count and points at the sum of old gradients.",
                where, zero_grad_calls=zero, steps=steps, grad_not_reset_share=stale,
                grad_norm_growth=growth, strength=0.95, decisive=True)]
        return [self.finding("training_loop", False, hits[0].message + " (zero_grad calls were "
                             "not counted in this run)", where, strength=0.4)]


def _inside(ref: dict, hit) -> bool:
    """True when the ``zero_grad`` call is in the training loop the lint hit names.

    Then the call is the line to move (before the batch loop, not in it); a call in another
    loop (a first loop that clears, a second that never does) leaves the hit's line.
    """
    span = hit.loop
    return (span is not None and ref.get("file") == hit.file
            and span[0] <= ref.get("line", 0) <= span[1])
