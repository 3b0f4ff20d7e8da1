"""``unbounded_loss``: a training objective without a minimum, driven towards minus infinity.

A loss that falls to -1e6 and beyond, ten thousand times the untrained model's loss in size
(the ``loss_unbounded`` signal), has no minimum for the optimizer to reach: a log-likelihood
minimised instead of its negative, a ``-criterion(...)`` left in, a term that pays the model
for making a variance vanish. Every step pushes the weights further until the values overflow,
which reads as a learning rate too high, but a lower rate only slows the fall. The record
measures it directly (no bounded objective reads there), so the finding is decisive. Located
at the line that computes the differentiated value (``loss = ...`` before ``loss.backward()``
or ``tape.gradient(loss, ...)``, also inside a Keras model's own ``train_step``).
"""

from __future__ import annotations

from ._lint import objective_line
from .base import Probe, ProbeContext, register


@register
class UnboundedLoss(Probe):
    """The record's training loss, falling past any bounded objective's values."""

    id = "unbounded_loss"
    categories = ("gradient_instability", "convergence_to_wrong_solution")
    fix = ("Minimise a quantity with a minimum: the negative log-likelihood (loss = -log_lik), "
           "not the log-likelihood; check the sign of every term of a hand-written loss.")

    def run(self, ctx: ProbeContext):
        """One decisive finding when the loss fell past -1e6 and 1e4x its first value."""
        low = ctx.signals.get("loss_unbounded")
        if low is None:
            return []
        first = ctx.signals.get("loss_first")
        return [self.finding(
            "training_loop", True,
            f"The training loss fell from {first:.4g} to {low:.4g}: a bounded objective never "
            "reads there, so this one has no minimum and each step drives the weights further "
            "until the values overflow. The sign of the loss (or of one of its terms) is "
            "likely wrong: a log-likelihood minimised instead of its negative. A lower learning "
            "rate would only slow the fall.",
            objective_line(ctx) or ctx.ref("backward") or ctx.ref("loss_fn"), strength=0.95,
            decisive=True, loss_first=first, loss_min=low)]
