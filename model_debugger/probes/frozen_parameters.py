"""``frozen_parameters``: part of the model does not train (frozen, or left out of the optimizer).

Frozen: ``requires_grad``/``trainable`` off; copies also train only what the user's optimizer
trains. Measured on the live model, then tested by experiment: two fresh copies trained on the
same rows, one as set up and one with every parameter training; the finding is confirmed when
the unfrozen copy reaches a clearly lower held-out loss. Most of the model frozen is a finding
either way (a hypothesis when the experiment does not confirm it); a smaller frozen part (a
first block whose weights and normalisation never train) is reported only when the experiment
shows it holds the loss up: its share says little, the experiment decides.
"""

from __future__ import annotations

import re

from ..records import Intervention
from ._heldout import SettingExperiment, source_line
from .base import ProbeContext, register

FROZEN = 0.5    # share of the parameters that do not train: a finding, confirmed or not
SOME_FROZEN = 0.01  # a smaller frozen part: tested, reported only when confirmed
_FREEZE = re.compile(r"requires_grad\s*=\s*False|requires_grad_\(\s*False|trainable\s*=\s*False")


@register
class FrozenParameters(SettingExperiment):
    """Most parameters frozen, and a copy with them training learns clearly better."""

    id = "frozen_parameters"
    cost = 2
    suggested_by = ("untrained_share",)
    fix = ("Let the frozen layers train (remove the requires_grad=False / trainable=False, and "
           "give the optimizer every parameter), or unfreeze them after a few epochs when "
           "fine-tuning.")

    def intervention(self, finding):
        """Every parameter trains in the re-run.

        None for trainable parameters left out of the optimizer: unfreezing would also train
        what is frozen on purpose (the copies' experiment tells).
        """
        return None if finding.evidence.get("left_out") else Intervention("unfreeze")

    def run(self, ctx: ProbeContext):
        """A finding when most parameters are frozen, or a smaller frozen part holds the loss up.

        Confirmed by the experiment; at >= 50% frozen a hypothesis when it does not confirm.
        """
        tr = ctx.trainer
        share = tr.frozen_share()
        if share < SOME_FROZEN:
            return []
        missing = _trainable_left_out(tr)
        if missing:  # trainable parameters the optimizer does not hold (a layer replaced
            # after the optimizer was built): the loop's doing, whatever else is frozen
            return self._left_out(ctx, tr, share, missing)
        frozen, unfrozen, confirmed = self.compare(ctx, tr.unfreeze)
        if share < FROZEN and not confirmed:
            return []  # a small frozen part that the experiment does not blame: by design
        left_out = getattr(tr, "trained_names", None) is not None
        flagged = tr.framework != "torch" or any(not p.requires_grad
                                                 for p in tr.model.parameters())
        how = ("frozen, or left out of the optimizer" if flagged else
               "left out of the optimizer") if left_out else "frozen"
        where = (source_line(ctx, _FREEZE, ctx.ref("model")) if flagged else None) or \
            (ctx.ref("optimizer") if left_out else None) or ctx.ref("model")
        root = "training_loop" if left_out and not flagged else "architecture"
        return [self.finding(
            root, confirmed,
            f"{share:.0%} of the model's parameters do not train ({how}). Two fresh copies "
            "trained on "
            f"the same rows reach a held-out loss of {unfrozen:.4g} with every parameter "
            f"training and {frozen:.4g} as set up"
            + (": the weights that do not train hold the loss up." if confirmed else
               ": no clearly better, so they are not what holds the loss up."),
            where, undone=confirmed, strength=0.8 if confirmed else 0.15,
            frozen_share=share, heldout_frozen=frozen, heldout_unfrozen=unfrozen)]

    def _left_out(self, ctx: ProbeContext, tr, share: float, missing: list[str]):
        """Copies whose optimizer holds every trainable parameter, against the run's."""
        left, given, confirmed = self.compare(ctx, tr.all_in_optimizer)
        if share < FROZEN and not confirmed:
            return []  # (a teacher kept beside the model, never meant to train: by design)
        return [self.finding(
            "training_loop", confirmed,
            f"{share:.0%} of the model's parameters do not train, among them "
            f"{len(missing)} that could ({', '.join(missing[:4])}"
            f"{', ...' if len(missing) > 4 else ''}): they require gradients but are left out "
            "of the optimizer (built before they were made, or over another part of the "
            f"model). Two fresh copies trained on the same rows reach a held-out loss of "
            f"{given:.4g} with the optimizer over every trainable parameter and {left:.4g} as set "
            "up" + (": the parameters left out hold the loss up." if confirmed else
                    ": no clearly better, so they are not what holds the loss up."),
            ctx.ref("optimizer") or ctx.ref("model"), undone=confirmed,
            strength=0.85 if confirmed else 0.15, frozen_share=share, left_out=missing[:20],
            heldout_left_out=left, heldout_all_trainable=given)]


def _trainable_left_out(tr) -> list[str]:
    """Names of parameters that require gradients but the run's optimizer does not hold."""
    names = getattr(tr, "trained_names", None)
    if tr.framework != "torch" or names is None:
        return []
    return [n for n, p in tr.model.named_parameters() if p.requires_grad and n not in names]
