"""``overfit_small_batch``: whether a fresh copy of the model drives the loss to ~0 on 10 samples.

A model that cannot memorise 10 samples in 500 steps has a problem in the code (model, loss,
optimizer settings), not in the amount of data. Retrying with other learning rates tells a
hyperparameter apart from an architecture problem: smaller ones first when the loss blew up at
the user's rate, larger ones first otherwise, then the other direction.
"""

from __future__ import annotations

import math

from .base import Probe, ProbeContext, register, setting_location

SAMPLES = 10
STEPS = 500
REACHED = 0.05  # final loss <= 5% of the initial loss counts as "~zero"


def _fit_10(tr, lr=None, steps=STEPS) -> tuple[float, float, int, bool]:
    """Initial and best loss, steps run, and whether the loss blew up (non-finite or rising)."""
    inputs, target = tr.subset(slice(0, SAMPLES))
    model = tr.fresh_model()
    losses = tr.fit(model, inputs, target, steps, lr=lr, batch_size=SAMPLES, seed=0,
                    stop_below=None)
    initial = losses[0]
    finite = [v for v in losses if math.isfinite(v)]
    best = min(finite) if finite else initial
    unstable = len(finite) < len(losses) or (bool(finite) and max(finite) > 1.5 * initial)
    return initial, best, len(losses), unstable


@register
class OverfitSmallBatch(Probe):
    """A fresh copy trained on 10 samples, then with other learning rates if it cannot fit them."""

    id = "overfit_small_batch"
    cost = 5
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution")
    needs_live = True
    frameworks = ("torch", "keras")

    def run(self, ctx: ProbeContext):
        """One confirmed finding when the copy cannot fit the 10 samples.

        ``hyperparameter`` when another learning rate fits them, else ``architecture``.
        """
        tr = ctx.trainer
        if tr is None or tr.n < SAMPLES:
            return []
        budget = tr.steps_within(STEPS, batch_size=SAMPLES, floor=100)
        initial, best, steps, unstable = _fit_10(tr, steps=budget)
        if best <= REACHED * initial:
            return []
        tried = {}
        base_ratio = best / max(initial, 1e-12)
        up, down = (10, 100, 1000, 10000), (0.1, 0.01, 0.001)
        factors, base = (down + up) if unstable else (up + down), tr.lr
        if not tr.lr > 0:  # a rate of 0 (a floor division, a schedule at 0): no multiple of it
            # moves a weight; the retries start at the low end of the optimizer's usual range
            from ..pitfalls.optimization import typical_lr

            base, factors = (typical_lr(tr.opt_cls.__name__) or (1e-3,))[0], (1, 10, 100, 1000)
        for factor in factors:
            if ctx.time_left() < 5:
                break
            lr = base * factor
            i2, b2, _, _ = _fit_10(tr, lr=lr, steps=max(budget // 2, 30))
            ratio = b2 / max(i2, 1e-12)
            tried[f"{lr:g}"] = round(ratio, 4)
            if ratio <= REACHED or ratio <= 0.5 * base_ratio:
                why = ("The learning rate is 0: no update moves the weights." if not tr.lr > 0
                       else "The learning rate is too small for this model and loss scale."
                       if factor > 1 else "The learning rate is too large: at the user's rate "
                       "the updates overshoot" + (" and the loss blows up." if unstable else "."))
                return [self.finding(
                    "hyperparameter", True,
                    f"With lr={tr.lr:g} a fresh copy of the model cannot fit {SAMPLES} samples in "
                    f"{steps} steps (loss {initial:.4g} -> {best:.4g}); with lr={lr:g} the loss "
                    f"falls to {ratio:.1%} of its start in half the steps. {why}",
                    setting_location(ctx.ref("optimizer"), "lr"), lr=tr.lr, working_lr=lr,
                    unstable=unstable, lever=True,
                    best_over_initial=best / initial, tried=tried, strength=0.75)]
        if len(tried) < len(factors):  # the budget ended before the rates were ruled out
            return [self.finding(
                "architecture", False,
                f"A fresh copy of the model cannot fit {SAMPLES} samples: loss {initial:.4g} -> "
                f"{best:.4g} in {steps} steps. Only {len(tried)} of {len(factors)} other "
                f"learning rates could be tried within the time left ({tried or 'none'}), so a "
                "rate is not ruled out.",
                ctx.ref("model") or ctx.ref("loss_fn"), lr=tr.lr,
                best_over_initial=best / initial, tried=tried, strength=0.3)]
        return [self.finding(
            "architecture", True,
            f"A fresh copy of the model cannot fit {SAMPLES} samples: loss {initial:.4g} -> "
            f"{best:.4g} in {steps} steps, and other learning rates do not help "
            f"({tried}). The model or its loss cannot represent the targets.",
            ctx.ref("model") or ctx.ref("loss_fn"), lr=tr.lr,
            best_over_initial=best / initial, tried=tried, strength=0.7)]
