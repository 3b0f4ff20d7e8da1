"""``early_stopping_mode``: an ``EarlyStopping`` that keeps the worst weights, not the best.

``EarlyStopping(monitor="val_loss", mode="max", restore_best_weights=True)`` judges a higher
loss an improvement: it keeps the weights of the epoch whose validation loss was highest (and
stops once the loss has fallen for ``patience`` epochs), so the model the run ends with is
the one its curves show at their worst. The capture records each ``fit``'s callback (its
monitored quantity, the direction its mode compares in, the epoch it restored, where it was
made); the record holds the quantity per epoch. Decisive when the direction runs against the
quantity's own (a loss or an error is minimised, an accuracy or an AUC maximised) and the
epoch kept is clearly worse than the best. Located where the callback was made.
"""

from __future__ import annotations

from .base import Probe, ProbeContext, register


@register
class EarlyStoppingMode(Probe):
    """The restored epoch of an ``EarlyStopping`` whose mode runs against its quantity."""

    id = "early_stopping_mode"
    categories = ("convergence_to_wrong_solution", "overfitting", "loss_not_decreasing",
                  "healthy")
    reveals = "convergence_to_wrong_solution"
    frameworks = ("keras",)
    fix = ("Give EarlyStopping the direction of what it watches: mode='min' (or 'auto') for a "
           "loss or an error, mode='max' for an accuracy or an AUC.")

    def run(self, ctx: ProbeContext):
        """One decisive finding when the restored epoch is the wrong way's best."""
        sig = ctx.signals
        if "restored_wrong_way" not in sig:
            return []
        stopped = [e for e in ctx.run.of("early_stopped") if e.get("restores")][-1]
        name, kept, best = sig["restored_monitor"], sig["restored_value"], \
            sig["restored_best_value"]
        return [self.finding(
            "hyperparameter", True,
            f"EarlyStopping watches '{name}' with mode='{stopped.get('direction')}' and "
            f"restore_best_weights: it kept the weights of epoch {sig['restored_epoch'] + 1}, "
            f"where '{name}' was {kept:.4g}, its worst, while the fit reached {best:.4g}. The "
            "model the run ends with is not the one its curves show.",
            stopped.get("location") or ctx.ref("fit"), strength=0.95, decisive=True,
            monitor=name, direction=stopped.get("direction"), restored_value=kept,
            best_value=best, restored_epoch=sig["restored_epoch"])]
