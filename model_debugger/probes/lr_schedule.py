"""``lr_schedule``: a learning-rate schedule that all but stops training early in the run.

Measured from the record (the ``lr`` events: the first parameter group's rate over the run):
the rate fell below 1% of its peak for at least half of the steps. Then tested by experiment:
two fresh copies trained on the same rows, one at the rate the schedule held for most of the run
(its median over the steps) and one at the schedule's peak; the finding is confirmed when the
copy at the peak reaches a clearly lower held-out loss (the decay, not the model or the data,
holds the loss up). PyTorch schedules, and a Keras optimizer's ``learning_rate`` (a schedule
or a callback that writes it).
"""

from __future__ import annotations

import numpy as np

from ..thresholds import LR_STALLED
from ._heldout import BETTER, heldout_loss
from .base import Probe, ProbeContext, register

COLLAPSED = LR_STALLED  # share of the run's steps spent below 1% of the peak rate


def rate_per_step(events: list[dict], steps: int) -> np.ndarray:
    """The first group's learning rate at every step, from the ``lr`` events."""
    out = np.full(steps, np.nan)
    for e in sorted(events, key=lambda e: e["step"]):
        if 0 <= e["step"] < steps:
            out[e["step"]:] = e["lr"]
    return out


@register
class LrSchedule(Probe):
    """The rate below 1% of its peak for most of the run, and a copy at the peak learns better."""

    id = "lr_schedule"
    cost = 2
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution")
    needs_live = True
    frameworks = ("torch", "keras")
    suggested_by = ("lr_collapsed_share",)
    fix = ("Slow the schedule down (a larger step_size, a gamma closer to 1, a decay over the "
           "whole run), or step it per epoch rather than per batch.")

    def applies(self, ctx: ProbeContext) -> bool:
        """With a trainer and a rate that collapsed for most of the run."""
        return super().applies(ctx) and ctx.trainer is not None and ctx.trainer.n >= 16 and \
            ctx.signals.get("lr_collapsed_share", 0.0) >= COLLAPSED

    def run(self, ctx: ProbeContext):
        """One finding; confirmed when the copy at the peak rate is clearly better."""
        steps = len(ctx.run.steps)
        rates = rate_per_step(ctx.run.of("lr"), steps)
        rates = rates[np.isfinite(rates)]
        peak = ctx.signals.get("lr_peak")
        if not len(rates) or not peak:
            return []
        typical = float(np.median(rates))
        share = ctx.signals["lr_collapsed_share"]
        held = heldout_loss(ctx.trainer, ctx, lr=typical, best=True)
        at_peak = heldout_loss(ctx.trainer, ctx, lr=peak, best=True)
        confirmed = at_peak < BETTER * held
        return [self.finding(
            "hyperparameter", confirmed,
            f"The learning rate fell below 1% of its peak ({peak:.3g}) for {share:.0%} of the "
            f"run's {steps} steps (median {typical:.3g}). Two fresh copies trained on the same "
            f"rows reach a held-out loss of {at_peak:.4g} at the peak rate and {held:.4g} at the "
            "median one"
            + (": the schedule's decay holds the loss up." if confirmed else
               ": no clearly better, so the decay is not what holds the loss up."),
            _decay_origin(ctx.ref("scheduler")) or rate_written(ctx.source_files) or
            ctx.ref("optimizer"), undone=confirmed,
            strength=0.8 if confirmed else 0.15, lr_peak=peak, lr_median=typical,
            lr_collapsed_share=share, heldout_median_lr=held, heldout_peak_lr=at_peak)]


DECAY_KEYWORDS = ("gamma", "decay_rate", "step_size", "milestones", "lr_lambda", "T_max")


def _decay_origin(location: dict | None) -> dict | None:
    """Where the scheduler's decay was set, else the scheduler's line.

    Its ``gamma=`` (or decay rate, step size, ...) traced to the line that set it: a config
    entry, an argparse default.
    """
    from .base import setting_location

    for keyword in DECAY_KEYWORDS:
        found = setting_location(location, keyword)
        if found is not location:
            return found
    return location


def rate_written(sources: dict) -> dict | None:
    """The user's line that writes the learning rate into the optimizer, when no scheduler does.

    ``g["lr"] = g["lr"] * warm`` over ``opt.param_groups``, or a Keras callback's
    ``self.model.optimizer.learning_rate = lr * factor``: a schedule written by hand is set
    there, not where the optimizer was built. The first such assignment of the code.
    """
    import ast

    for path, text in (sources or {}).items():
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in sorted((n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AugAssign))),
                           key=lambda n: n.lineno):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and
                   t.slice.value in ("lr", "learning_rate") or
                   isinstance(t, ast.Attribute) and t.attr in ("lr", "learning_rate") and
                   "optimizer" in ast.unparse(t.value) for t in targets):
                return {"file": path, "line": node.lineno}
    return None
