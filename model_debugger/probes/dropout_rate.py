"""``dropout_rate``: dropout so strong the model cannot fit the training data.

Measured on the live model (the largest drop rate), then tested by experiment: two fresh copies
trained on the same rows, one as set up and one without dropout; the finding is confirmed when
the copy without dropout reaches a clearly lower held-out loss.
"""

from __future__ import annotations

import re

from ..records import Intervention
from ._heldout import SettingExperiment, source_line
from .base import ProbeContext, register, setting_location

HIGH = 0.7      # a drop rate at or above this is suspect (0.5 is a common, healthy choice)
# a literal high rate: a layer's (``Dropout(0.9)``) or a config's (``hidden_dropout_prob=0.9``,
# ``"dropout": 0.8``)
_RATE = re.compile(r"""(?:Dropout\w*\(\s*(?:(?:p|rate)\s*=\s*)?|\b\w*dropout\w*["']?\s*[=:]\s*|"""
                   r"""\bdropout\([^)]*?\b(?:p|rate)\s*=\s*)"""
                   r"0?\.[7-9]", re.IGNORECASE)  # (at HIGH or above)
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
            _where(ctx), undone=confirmed, strength=0.75 if confirmed else 0.15,
            layer=layer, rate=rate, rates=rates, heldout_with=kept, heldout_without=dropped)]


def _where(ctx: ProbeContext) -> dict | None:
    """The line that set the high rate near the model.

    A literal in a layer, a functional call or a config entry; else a dropout layer, followed
    to where the name it is given was set (``Dropout(DROP)``).
    """
    found = source_line(ctx, _RATE, ctx.ref("model"))
    if found is not None:
        return found
    layer = source_line(ctx, _ANY, ctx.ref("model"))
    if layer is None:
        return ctx.ref("model")
    for keyword in ("p", "rate"):
        traced = setting_location(layer, keyword)
        if traced is not layer:
            return traced
    return layer
