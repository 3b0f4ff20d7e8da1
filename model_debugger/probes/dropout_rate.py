"""``dropout_rate``: dropout so strong the model cannot fit the training data.

Measured on the live model (the largest drop rate), then tested by experiment: two fresh copies
trained on the same rows, one as set up and one without dropout; the finding is confirmed when
the copy without dropout reaches a clearly lower held-out loss.
"""

from __future__ import annotations

import re

from ..records import Intervention
from ._heldout import SettingExperiment, source_line
from .base import ProbeContext, register

HIGH = 0.7      # a drop rate at or above this is suspect (0.5 is a common, healthy choice)
_RATE = re.compile(r"Dropout\w*\(\s*(?:(?:p|rate)\s*=\s*)?0?\.[5-9]")  # a literal high rate
_ANY = re.compile(r"Dropout\w*\(")


@register
class DropoutRate(SettingExperiment):
    """A drop rate >= 0.7, and a copy without dropout learns clearly better."""

    id = "dropout_rate"
    cost = 2
    fix = "Lower the dropout rate (0.1-0.3 is usual) or remove the layer."

    def intervention(self, finding):
        """Every dropout drops nothing in the re-run."""
        return Intervention("dropout_off")

    def run(self, ctx: ProbeContext):
        """One finding for the strongest dropout; confirmed by the experiment."""
        tr = ctx.trainer
        rates = tr.dropout_rates()
        if not rates or max(rates.values()) < HIGH:
            return []
        layer, rate = max(rates.items(), key=lambda kv: kv[1])
        kept, dropped, confirmed = self.compare(ctx, tr.without_dropout)
        return [self.finding(
            "architecture", confirmed,
            f"Dropout drops {rate:.0%} of the units in '{layer}'. Two fresh copies trained on "
            f"the same rows reach a held-out loss of {dropped:.4g} without dropout and "
            f"{kept:.4g} with it"
            + (": the dropout keeps the model from fitting." if confirmed else
               ": no clearly better, so dropout is not what holds the loss up."),
            source_line(ctx, _RATE, ctx.ref("model")) or source_line(ctx, _ANY, ctx.ref("model"))
            or ctx.ref("model"), undone=confirmed, strength=0.75 if confirmed else 0.15,
            layer=layer, rate=rate, rates=rates, heldout_with=kept, heldout_without=dropped)]
