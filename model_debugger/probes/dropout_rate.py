"""``dropout_rate``: dropout so strong the model cannot fit the training data.

Measured on the live model (the largest drop rate), then tested by experiment: two fresh copies
trained on the same rows, one as set up and one without dropout; the finding is confirmed when
the copy without dropout reaches a clearly lower held-out loss.
"""

from __future__ import annotations

import re

from ._heldout import heldout_loss, source_line
from .base import Probe, ProbeContext, register

HIGH = 0.5      # a drop rate at or above this is suspect
BETTER = 0.8    # held-out loss without dropout below this share of the copy's with it: confirmed
_RATE = re.compile(r"Dropout\w*\(\s*(?:(?:p|rate)\s*=\s*)?0?\.[5-9]")  # a literal high rate
_ANY = re.compile(r"Dropout\w*\(")


@register
class DropoutRate(Probe):
    """A drop rate >= 0.5, and a copy without dropout learns clearly better."""

    id = "dropout_rate"
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution")
    needs_live = True
    fix = "Lower the dropout rate (0.1-0.3 is usual) or remove the layer."

    def applies(self, ctx: ProbeContext) -> bool:
        """With a trainer over the kept sample."""
        return super().applies(ctx) and ctx.trainer is not None and ctx.trainer.n >= 16

    def run(self, ctx: ProbeContext):
        """One finding for the strongest dropout; confirmed by the experiment."""
        tr = ctx.trainer
        rates = tr.dropout_rates()
        if not rates or max(rates.values()) < HIGH:
            return []
        layer, rate = max(rates.items(), key=lambda kv: kv[1])
        kept = heldout_loss(tr, ctx)
        dropped = heldout_loss(tr, ctx, change=tr.without_dropout)
        confirmed = dropped < BETTER * kept
        return [self.finding(
            "architecture", confirmed,
            f"Dropout drops {rate:.0%} of the units in '{layer}'. Two fresh copies trained on "
            f"the same rows reach a held-out loss of {dropped:.4g} without dropout and "
            f"{kept:.4g} with it"
            + (": the dropout keeps the model from fitting." if confirmed else
               ": no clearly better, so dropout is not what holds the loss up."),
            source_line(ctx, _RATE, ctx.ref("model")) or source_line(ctx, _ANY, ctx.ref("model"))
            or ctx.ref("model"), strength=0.75 if confirmed else 0.15,
            layer=layer, rate=rate, rates=rates, heldout_with=kept, heldout_without=dropped)]
