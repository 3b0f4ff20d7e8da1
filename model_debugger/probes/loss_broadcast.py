"""``loss_broadcast``: the training loss compared every prediction with every target.

Measured by the capture (the ``loss_broadcast`` event): an elementwise loss (MSE, L1, Huber,
binary cross-entropy) was given a prediction and a target of different shapes that broadcast,
typically ``(B, 1)`` against ``(B,)``, so it averaged ``B x B`` differences. That loss is minimised
by predicting the targets' mean for every row: the model converges to a constant whatever its
inputs. A direct measurement of the shapes, located at the loss call.
"""

from __future__ import annotations

from .base import Probe, ProbeContext, register


@register
class LossBroadcast(Probe):
    """The shapes the training loss was given, from the record."""

    id = "loss_broadcast"
    categories = ("convergence_to_wrong_solution", "loss_not_decreasing", "gradient_instability")
    needs_live = False
    frameworks = ("torch",)
    fix = ("Give the loss a prediction and a target of the same shape: squeeze the (B, 1) output "
           "(output.squeeze(-1)) or view the target as (B, 1).")

    def run(self, ctx: ProbeContext):
        """One confirmed finding when the capture saw a broadcasting training loss."""
        event = ctx.run.first("loss_broadcast")
        if not event or not isinstance(event.get("factor"), (int, float)) or event["factor"] < 2:
            return []
        where = event.get("location") or ctx.ref("loss_fn") or ctx.ref("backward")
        return [self.finding(
            "training_loop", True,
            f"The training loss {event.get('loss')} was given predictions of shape "
            f"{tuple(event.get('input') or ())} and targets of shape "
            f"{tuple(event.get('target') or ())}; they broadcast to {tuple(event.get('shape') or ())}, "
            f"{event['factor']:.3g} terms per element, so every prediction is compared with every "
            "target. That loss is minimised by predicting the targets' mean for every row: the "
            "model converges to a constant. Make both the same shape.",
            where, input_shape=event.get("input"), target_shape=event.get("target"),
            broadcast_shape=event.get("shape"), factor=event["factor"], strength=0.95)]
