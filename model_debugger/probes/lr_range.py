"""``lr_range``: a short learning-rate sweep from the initial weights.

The loss is tracked while the learning rate grows geometrically; the rate where the loss is lowest
and the rate where it diverges bracket a safe learning rate. The user's rate outside that bracket
is a confirmed hyperparameter problem.
"""

from __future__ import annotations

import math

import numpy as np

from ..records import Intervention
from ..thresholds import FLOOR_SHARE, GRAD_GROWTH
from ._heldout import heldout_loss, prior_loss
from ._lint import summed_loss_line
from .base import Probe, ProbeContext, register, setting_location
from .report import ProbeResult

LR_MIN, LR_MAX, STEPS = 1e-7, 10.0, 120
TOO_LOW = 100.0  # user lr this many times below the best rate
UNSAFE = 3.0  # an unstable run at this many times the safe rate: the rate is a hypothesis
PRIOR_SHARE = 0.95  # a copy at the safe rate must end below this share of the prior's loss


def sweep(tr) -> tuple[np.ndarray, np.ndarray]:
    """Return (learning rates, smoothed losses) of one geometric sweep on the trainer.

    The sweep reaches at least ten times the user's rate: a rate above the usual range is
    judged inside the bracket, never beyond its end.
    """
    user = float(tr.hyper.get("lr") or 0.0)
    top = max(LR_MAX, 10 * user) if math.isfinite(user) else LR_MAX
    return tr.sweep(LR_MIN, top, STEPS)


@register
class LRRange(Probe):
    """A learning-rate sweep from the initial weights; the user's rate placed in its bracket."""

    id = "lr_range"
    cost = 3
    lever = True  # a rate raised far enough makes most training losses fall
    categories = ("gradient_instability", "loss_not_decreasing")
    frameworks = ("torch", "keras", "none")

    def suggestion(self, finding) -> str:
        """The safe rate the sweep found, when it ran; else the default suggestion."""
        ev = finding.evidence or {}
        if ev.get("safe_lr"):
            return (f"Set the learning rate to about {ev['safe_lr']:.3g} (now {ev.get('lr', '?')}), "
                    "the rate the sweep from the initial weights found safe.")
        return super().suggestion(finding)

    def intervention(self, finding):
        """Scale the learning rate to the safe rate the sweep found (None without one)."""
        ev = finding.evidence or {}
        try:
            safe, lr = float(ev["safe_lr"]), float(ev["lr"])
        except (KeyError, TypeError, ValueError):
            return None
        if not (safe > 0 and lr > 0) or math.isclose(safe, lr, rel_tol=0.5):
            return None
        return Intervention("lr_scale", {"factor": safe / lr})

    def run(self, ctx: ProbeContext):
        """The sweep's bracket and the findings on the user's rate.

        Returns a :class:`~model_debugger.probes.report.ProbeResult` sharing ``lr_range`` (the best,
        diverging and safe rates). Without a trainer, the recorded rate is compared with the
        optimizer's typical range (a hypothesis).
        """
        tr = ctx.trainer
        if tr is None:
            return self._from_record(ctx)
        if tr.n < 16 or "lr" not in tr.hyper:
            return []
        lrs, losses = sweep(tr)
        lowest = int(np.argmin(losses))
        bad = np.flatnonzero(~np.isfinite(losses) | (losses > 4 * losses[lowest]))
        bad = bad[bad > lowest]
        diverge_lr = float(lrs[bad[0]]) if len(bad) else None
        # where the loss falls fastest (steepest descent per decade), before it diverges
        stop = bad[0] if len(bad) else len(losses)
        fin = np.where(np.isfinite(losses[:stop]), losses[:stop], np.nan)
        slope = np.gradient(fin, np.log10(lrs[:stop])) if stop >= 3 else np.array([0.0])
        best_lr = float(lrs[int(np.nanargmin(slope))]) if np.isfinite(slope).any() \
            else float(lrs[lowest])
        safe_lr = min(best_lr / 3, diverge_lr / 10) if diverge_lr else best_lr / 3
        band = {"best_lr": best_lr, "diverge_lr": diverge_lr, "safe_lr": safe_lr}
        return ProbeResult(lr_range=band,
                           findings=tuple(self._judge(ctx, tr, best_lr, diverge_lr, safe_lr)))

    def _judge(self, ctx: ProbeContext, tr, best_lr: float, diverge_lr: float | None,
               safe_lr: float) -> list:
        """The user's rate against the swept bracket: too high, too low, or no finding."""
        user = tr.lr
        common = dict(lr=user, best_lr=best_lr, diverge_lr=diverge_lr, safe_lr=safe_lr)
        sig = ctx.signals
        unstable_run = ctx.classification is not None and \
            ctx.classification.primary == "gradient_instability"
        unstable = unstable_run or "first_nonfinite_step" in sig or \
            sig.get("loss_relative_drop", 0) < 0 or sig.get("grad_norm_growth", 0) >= GRAD_GROWTH
        stuck = sig.get("loss_relative_drop", 1.0) < 0.2
        # a rate too high for a loss summed over the batch: the sum made each step that large
        summed = summed_loss_line(ctx)
        where_high = summed or setting_location(ctx.ref("optimizer"), "lr")
        summed_text = (" The loss sums over the batch (reduction='sum'): every step is the "
                       "batch size times the mean's, so the rate is too high for it; average "
                       "instead (reduction='mean') or divide the rate.") if summed else ""
        if diverge_lr is not None and user >= diverge_lr and unstable:
            from ..pitfalls.optimization import typical_lr

            typical = typical_lr(tr.opt_cls.__name__)
            if typical and diverge_lr < typical[0] / 100:
                # even tiny rates diverge: the scale of the inputs/targets, not the rate, is off
                return [self.finding(
                    "hyperparameter", True,
                    f"The loss diverges in a sweep from the initial weights already at lr "
                    f"{diverge_lr:.3g}, far below the usual range of {tr.opt_cls.__name__} "
                    f"({typical[0]:g}-{typical[1]:g}); the learning rate {user:g} overshoots, "
                    "but so would any usual rate: look at the scale of inputs and targets first."
                    + summed_text, where_high, strength=0.5, **common)]
            return [self.finding(
                "hyperparameter", True,
                f"The learning rate {user:g} is above the rate where the loss diverges in a sweep "
                f"from the initial weights ({diverge_lr:.3g}); updates overshoot, the loss and "
                f"gradients grow until they overflow. A safe rate is about {safe_lr:.3g}."
                + summed_text, where_high, strength=0.8, **common)]
        if unstable_run and user >= UNSAFE * safe_lr:
            # the run blew up although a short sweep from the initial weights did not: a
            # hypothesis only; a re-run at the safe rate (the intervention) tells
            return [self.finding(
                "hyperparameter", False,
                f"The run was unstable at a learning rate of {user:g}, {user / safe_lr:.3g}x the "
                f"safe rate of a sweep from the initial weights ({safe_lr:.3g}; it diverged "
                f"{'at ' + format(diverge_lr, '.3g') if diverge_lr else 'nowhere in the sweep'}"
                "). A short sweep can miss a blow-up that builds over many steps; a re-run at the "
                "safe rate would confirm it." + summed_text, where_high, strength=0.45,
                **common)]
        settled_high = sig.get("loss_floor_share", 0.0) >= FLOOR_SHARE and \
            ctx.classification is not None and \
            ctx.classification.primary == "loss_not_decreasing"
        if (user * TOO_LOW <= best_lr and stuck) or (settled_high and UNSAFE * user <= safe_lr):
            slow, fast = _heldout_at(tr, ctx, user), _heldout_at(tr, ctx, safe_lr)
            prior = prior_loss(tr)
            # the faster copy must learn something: only reaching the constant predictor's
            # loss (the user's copy overfitting above it) does not undo a stuck loss
            learned = prior is None or not math.isfinite(prior) or fast < PRIOR_SHARE * prior
            confirmed = fast < 0.9 * slow and learned
            return [self.finding(
                "hyperparameter", confirmed,
                (f"The learning rate {user:g} is {best_lr / user:.3g}x below the rate where the "
                 f"loss falls fastest in a sweep ({best_lr:.3g}); each update barely moves the "
                 "weights, so the loss plateaus." if user > 0 else
                 f"The learning rate is {user:g}: no update moves the weights (the loss falls "
                 f"fastest in a sweep at {best_lr:.3g}).") +
                f" Trained at {safe_lr:.3g} instead, a copy reaches a "
                f"held-out loss of {fast:.4g} vs {slow:.4g} at {user:g}"
                + ("." if confirmed else
                   f", no lower than the constant predictor's {prior:.4g}: it learns nothing "
                   "more at that rate, so the rate is not what holds it back." if not learned
                   else ": no better, so the rate is not what holds it back."),
                setting_location(ctx.ref("optimizer"), "lr"), strength=0.75 if confirmed else 0.2,
                heldout_at_user_lr=slow, heldout_at_safe_lr=fast, heldout_prior=prior,
                **common)]
        return []

    def _from_record(self, ctx: ProbeContext):
        """No live model: compare the recorded learning rate with typical ranges (a hypothesis)."""
        from ..pitfalls.optimization import lr_outside_typical, typical_lr

        opt = ctx.run.first("optimizer")
        lr = (opt or {}).get("hyper", {}).get("lr")
        if not opt or not isinstance(lr, (int, float)):
            return []
        side = lr_outside_typical(opt["cls"], lr)
        if side is None:
            return []
        lo, hi = typical_lr(opt["cls"])
        return [self.finding(
            "hyperparameter", False,
            f"{opt['cls']} with lr={lr:g} is far {'above' if side == 'high' else 'below'} its "
            f"typical range ({lo:g}-{hi:g}); a sweep from the initial weights would confirm it.",
            setting_location(ctx.ref("optimizer"), "lr"), lr=lr, typical=[lo, hi], strength=0.4)]


def _heldout_at(tr, ctx: ProbeContext, lr: float) -> float:
    """Held-out loss of a fresh copy trained at ``lr`` on 70% of the sample."""
    return heldout_loss(tr, ctx, lr=lr)
