"""``data_volume``: too few training samples for the model's capacity.

Measured from the run: parameters per training sample (samples per epoch counted by the loss)
against the generalisation gap. Many parameters per sample and a widening gap mean the model
memorises the training set.
"""

from __future__ import annotations

import numpy as np

from ..thresholds import VAL_RISE
from .base import Probe, ProbeContext, register

PARAMS_PER_SAMPLE = 10.0


@register
class DataVolume(Probe):
    """Parameters per training sample, against a validation loss that rises."""

    id = "data_volume"
    categories = ("overfitting",)
    fix = ("Regularise the optimisation (weight decay, early stopping on the validation loss) or "
           "train on more data; a smaller model is an architecture change and needs an explicit "
           "override for a data cause.")

    def run(self, ctx: ProbeContext):
        """One confirmed finding when validation loss rose and parameters per sample are >= 10.

        Samples per epoch come from the record's ``targets`` event and the epochs observed; the
        parameter count from its ``model`` event.
        """
        model = ctx.run.first("model")
        targets = ctx.run.of("targets")
        sig = ctx.signals
        if not model or not targets or sig.get("val_loss_rise", 0) < VAL_RISE:
            return []
        per_sample = max(1, targets[-1]["n"] // max(1, len(ctx.run.steps) and ctx.run.epochs))
        if ctx.trainer is not None and ctx.trainer.targets is not None \
                and ctx.trainer.targets.ndim > 1:
            per_sample = max(1, per_sample // int(np.prod(ctx.trainer.targets.shape[1:])))
        ratio = model["params"] / per_sample
        if ratio < PARAMS_PER_SAMPLE:
            return []
        return [self.finding(
            "data", True,
            f"The model has {model['params']:,} parameters for about {per_sample:,} training "
            f"samples per epoch ({ratio:,.0f} per sample). It can memorise the training set: "
            f"validation loss rose {sig['val_loss_rise']:.0%} from its minimum while the train "
            "loss kept falling. More data, augmentation, a smaller model, weight decay or early "
            "stopping at the validation minimum address it.",
            ctx.ref("model"), params=model["params"], samples_per_epoch=per_sample,
            params_per_sample=ratio, val_loss_rise=sig["val_loss_rise"],
            val_loss_min_index=sig.get("val_loss_min_index"), strength=0.7)]
