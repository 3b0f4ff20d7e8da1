"""``late_onset``: a problem that shows only late in a long run cannot be settled by short probes."""

from __future__ import annotations

from .base import Probe, ProbeContext, register

PROBE_HORIZON = 500  # probes train copies for at most this many steps


@register
class LateOnset(Probe):
    """A failure that appears later than the steps a probe trains a copy for."""

    id = "late_onset"
    categories = ("gradient_instability", "memory_issue")

    def run(self, ctx: ProbeContext):
        """An unconfirmed finding when the first non-finite value or the OOM came after step 500."""
        bad = ctx.run.first("nonfinite")
        err = ctx.run.error
        onset, what = None, None
        if bad is not None and bad["step"] >= PROBE_HORIZON:
            onset, what = bad["step"], f"the first non-finite {bad['what']}"
        elif err is not None and err.get("kind") == "oom" and err.get("step", 0) >= PROBE_HORIZON:
            onset, what = err["step"], "the out-of-memory error"
        if onset is None:
            return []
        return [self.finding(
            "training_loop", False,
            f"{what.capitalize()} appeared only at step {onset}; the probes train copies for at "
            f"most {PROBE_HORIZON} steps, so they cannot reproduce it. Findings about its cause "
            "are not concludable from a short run: reproduce it with the full run (checkpoint "
            "shortly before the step and probe from there).",
            ctx.ref("backward"), onset_step=onset, probe_horizon=PROBE_HORIZON, strength=0.2)]
