"""``seed_variance``: how much the result moves with the seed alone.

Three short trainings of a fresh copy, differing only in the seed (data order, dropout), give the
noise band Verify compares against. A band wider than the effect being chased is itself a finding:
single runs cannot settle the question.
"""

from __future__ import annotations

import numpy as np

from .base import Probe, ProbeContext, register
from .report import ProbeResult

SEEDS, STEPS, NOISY_CV = 3, 60, 0.25


@register
class SeedVariance(Probe):
    """Fresh copies trained under 3 seeds; the spread of their final losses."""

    id = "seed_variance"
    cost = 3
    categories = ("overfitting", "loss_not_decreasing", "convergence_to_wrong_solution")
    needs_live = True
    frameworks = ("torch", "keras")
    fix = "Lower the learning rate or enlarge the batch, and judge changes across seeds."

    def run(self, ctx: ProbeContext):
        """The seed noise band, with a finding when it is wide.

        The finding is a hypothesis, never confirmed: seed noise measures how far single runs
        can be trusted, it does not cause the category (nothing undone removes the symptom).

        Returns a :class:`~model_debugger.probes.report.ProbeResult` sharing ``seed_noise`` (mean,
        std, cv and the final losses); the finding when the coefficient of variation is >= 0.25.
        """
        tr = ctx.trainer
        if tr is None or tr.n < 16:
            return []
        finals = []
        steps = tr.steps_within(STEPS, floor=20, seconds=min(1.5, ctx.time_left() / 10))
        for seed in range(SEEDS):
            model = tr.fresh_model()
            losses = tr.fit(model, tr.inputs, tr.targets, steps, seed=seed)
            finals.append(float(np.mean(losses[-10:])))
        finals = np.array(finals)
        mean, std = float(finals.mean()), float(finals.std(ddof=1))
        cv = std / abs(mean) if mean else float("inf")
        noise = {"mean": mean, "std": std, "cv": cv, "finals": finals.tolist()}
        if not np.isfinite(cv) or cv < NOISY_CV:
            return ProbeResult(seed_noise=noise)
        return ProbeResult(seed_noise=noise, findings=(self.finding(
            "hyperparameter", False,
            f"The loss after {steps} steps varies by {cv:.0%} across {SEEDS} seeds "
            f"({finals.round(4).tolist()}); with this much seed noise a single run cannot show "
            "whether a change helps. Lower the learning rate or enlarge the batch, and compare "
            "changes across seeds.",
            ctx.ref("optimizer"), finals=finals.tolist(), cv=cv, strength=0.3),))
