"""``tape_kept``: one ``GradientTape`` kept and entered again every step.

A persistent tape made once (``self.tape = tf.GradientTape(persistent=True)``) and entered in
each step (``with self.tape:``) resumes the same tape: it keeps every operation of every step
it recorded, so the memory it holds grows for the whole run (and each gradient walks a longer
tape). Measured by the capture (the ``tape_kept`` event: entries that resumed a tape still
holding its records), a direct measurement; confirmed when it happened on at least half of
the steps, at least :data:`MIN_RESUMED` times. Located where the capture saw the tape made
(its ``GradientTape(persistent=True)`` line), else at the ``with`` that resumes it.
"""

from __future__ import annotations

from .base import Probe, ProbeContext, register

MIN_RESUMED = 10
SHARE = 0.5


@register
class TapeKept(Probe):
    """A gradient tape resumed, records and all, on most steps."""

    id = "tape_kept"
    categories = ("memory_issue", "performance_issue", "healthy")
    reveals = "memory_issue"  # a short run may end before its growth passes the thresholds
    frameworks = ("keras", "none")  # (a loop that updates by hand names no model)
    fix = ("Make the tape inside each step (with tf.GradientTape() as tape: ...), or delete a "
           "persistent tape after its gradients are taken; never keep one across steps.")

    def applies(self, ctx: ProbeContext) -> bool:
        """When the capture saw a tape resumed (the ``tape_kept`` event)."""
        return super().applies(ctx) and ctx.run.first("tape_kept") is not None

    def run(self, ctx: ProbeContext):
        """One confirmed finding when the tape was resumed on most steps."""
        e = ctx.run.first("tape_kept")
        resumed, steps = int(e.get("resumed") or 0), int(e.get("steps") or 0)
        if resumed < MIN_RESUMED or not steps or resumed < SHARE * steps:
            return []
        grew = ctx.signals.get("rss_growth_mb")
        return [self.finding(
            "training_loop", True,
            f"One GradientTape was entered again on {resumed} of {steps} steps while it still "
            "held what it recorded before: it keeps every operation of every step"
            + (f" (the process grew by {grew:.0f} MB over the run)"
               if isinstance(grew, (int, float)) and grew > 0 else "")
            + ". Make the tape inside each step, or delete a persistent tape after its "
            "gradients are taken.",
            e.get("made") or e.get("entered") or ctx.ref("backward"), resumed=resumed,
            steps=steps, persistent=e.get("persistent"), rss_growth_mb=grew, strength=0.9,
            decisive=True)]
