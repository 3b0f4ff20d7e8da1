"""``hooks_accumulate``: a module hook registered again every step and never removed.

``model[3].register_forward_hook(save)`` inside the training loop, its handle dropped: each step
adds one more hook, every forward runs all of them, and whatever they keep (activations
appended to a list) grows with the run, as does the time of each step. Measured by the capture
(the ``hooks`` event: registrations per line of your code, and how many are still registered at
the end), a direct measurement; confirmed when at least :data:`MIN_LIVE` hooks of one line are
still registered and they number at least :data:`SHARE` of the optimizer steps. Located at the
line that registers them.
"""

from __future__ import annotations

from .base import Probe, ProbeContext, register

MIN_LIVE = 10
SHARE = 0.5


@register
class HooksAccumulate(Probe):
    """One line registering a module hook per step, none of them removed."""

    id = "hooks_accumulate"
    categories = ("memory_issue", "performance_issue", "healthy")
    reveals = "memory_issue"  # a short run may end before its growth passes the thresholds
    frameworks = ("torch",)
    fix = ("Register the hook once, before the loop, or keep its handle and call "
           "handle.remove() once it has run.")

    def applies(self, ctx: ProbeContext) -> bool:
        """When the capture saw a line of your code register hooks more than once."""
        return super().applies(ctx) and bool(ctx.run.of("hooks"))

    def run(self, ctx: ProbeContext):
        """One confirmed finding for the line leaving the most hooks registered."""
        e = max(ctx.run.of("hooks"), key=lambda h: h.get("live") or 0)
        live, steps = int(e.get("live") or 0), int(e.get("steps") or 0)
        if live < MIN_LIVE or live < SHARE * steps:
            return []
        grew = ctx.signals.get("rss_growth_mb")
        return [self.finding(
            "training_loop", True,
            f"This line registered a module hook {e.get('registered')} times in {steps} "
            f"optimizer steps and {live} of them are still registered at the end: every "
            "forward pass runs them all, and what they keep grows with the run"
            + (f" (the process grew by {grew:.0f} MB)"
               if isinstance(grew, (int, float)) and grew > 0 else "")
            + ". Register the hook once, before the loop, or remove it with its handle.",
            {"file": e["file"], "line": e["line"]}, registered=e.get("registered"),
            live=live, steps=steps, rss_growth_mb=grew, strength=0.9, decisive=True)]
