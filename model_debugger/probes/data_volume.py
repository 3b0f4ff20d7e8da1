"""``data_volume``: too few training samples for the model's capacity.

Two measurements. First, distinct rows: the kept training batches (input rows with their
targets) hold only a few distinct examples, each repeated many times (a sampling or indexing
step that repeats a handful of rows: the epoch looks large, the data is not); that is direct and
decisive, located where the inputs were made. Second, from the run: parameters per training
sample (samples per epoch counted by the loss) against the generalisation gap. Many parameters
per sample and a widening gap mean the model memorises the training set.
"""

from __future__ import annotations

import numpy as np

from ..thresholds import VAL_RISE
from .base import Probe, ProbeContext, register

PARAMS_PER_SAMPLE = 10.0
DISTINCT_SHARE = 0.1  # distinct rows at most this share of the kept rows ...
MIN_ROWS = 256        # ... of at least this many rows


@register
class DataVolume(Probe):
    """Parameters per training sample, against a validation loss that rises."""

    id = "data_volume"
    data_role = "inputs"
    categories = ("overfitting",)
    fix = ("Regularise the optimisation (weight decay, early stopping on the validation loss) or "
           "train on more data; a smaller model is an architecture change and needs an explicit "
           "override for a data cause.")

    def run(self, ctx: ProbeContext):
        """One confirmed finding when validation loss rose and parameters per sample are >= 10.

        Samples per epoch come from the record's ``targets`` event and the epochs observed; the
        parameter count from its ``model`` event.
        """
        repeated = _repeated_rows(ctx)
        if repeated is not None:
            return [repeated]
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


def _repeated_rows(ctx: ProbeContext):
    """A confirmed finding when the kept training rows are a few distinct rows repeated."""
    from . import _numpy_stats as st
    from .constant_inputs import _inputs

    x = _inputs(ctx)
    if x is None or len(x) < MIN_ROWS:
        return None
    rows = np.ascontiguousarray(np.asarray(x).reshape(len(x), -1), dtype=np.float64) + 0.0
    distinct = len({r.tobytes() for r in rows})
    if distinct > DISTINCT_SHARE * len(rows) or distinct < 2:  # one row: constant_inputs
        return None
    probe = DataVolume()
    return probe.finding(
        "data", True,
        f"The {len(rows)} kept training rows hold only {distinct} distinct examples, each seen "
        f"about {len(rows) / distinct:.0f} times: the model learns from {distinct} examples, "
        "whatever the length of an epoch, and memorises them (a sampling or indexing step "
        "repeats a handful of rows).", st.data_location(ctx), strength=0.85, decisive=True,
        rows=len(rows), distinct_rows=distinct)
