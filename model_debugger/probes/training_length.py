"""``training_length``: whether the run stopped before it learned (too few optimizer updates).

A run of few optimizer steps (a batch holding most of the data, few epochs, few samples) ends
with the loss still far above what the model reaches. Signals cannot tell that from a model that
cannot learn; an experiment can: two fresh copies from the run's initial weights, with the user's
optimizer and settings and the run's batch size on 80% of the kept rows, one trained for as many
steps as the run made and one for :data:`EXTRA` times as many. When the longer copy ends clearly
lower on the other 20% (below :data:`CLEAR` x the shorter copy's held-out loss, so memorising
the rows cannot pass for it), the number of updates held the loss up.
"""

from __future__ import annotations

import math

import numpy as np

from ..provenance import batches_origin
from ..thresholds import FEW_STEPS, FLOOR_SHARE
from . import _numpy_stats as st
from ._passes import cut_passes
from .base import Probe, ProbeContext, register, setting_location

EXTRA = 8    # the longer copy makes this many times the run's optimizer steps
CLEAR = 0.75  # ... and must end below 3/4 of the shorter copy's held-out loss


def _batch_location(ctx: ProbeContext) -> dict | None:
    """Where the run's batches are sized.

    The loader, ``fit`` (followed to where a name passed as ``batch_size=`` was set), a
    trainer, else where a custom loop's batches are made.
    """
    fit = ctx.ref("fit")
    return ctx.ref("loader") or (setting_location(fit, "batch_size") if fit else None) or \
        ctx.ref("trainer") or batches_origin(st.data_location(ctx))


def run_batch_size(ctx: ProbeContext) -> int | None:
    """Rows per optimizer step in the run.

    The training loader's batch size, else the targets the loss saw per step (elements per row
    divided out).
    """
    loader = next((e for e in ctx.run.of("ref") if e.get("kind") == "loader"), {})
    if isinstance(loader.get("batch_size"), int) and loader["batch_size"] > 0:
        return loader["batch_size"]
    targets = ctx.run.of("targets")
    steps = len(ctx.run.steps)
    if not targets or not steps or not targets[-1].get("n"):
        return None
    tr = ctx.trainer
    per_row = int(np.prod(tr.targets.shape[1:])) if tr is not None and \
        tr.targets is not None and tr.targets.ndim > 1 else 1
    return max(1, round(targets[-1]["n"] / steps / max(per_row, 1)))


SMALL_BATCH = 32  # the batch of the copy that sees the same rows in more, smaller updates


@register
class TrainingLength(Probe):
    """A fresh copy trained as long as the run, against one trained much longer."""

    id = "training_length"
    cost = 2
    suggested_by = ("steps",)  # cited when a run was short (fewer than 100 updates)
    # a short run's metric below the majority's is as undertrained as a loss near the prior's
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution")
    needs_live = True
    frameworks = ("torch", "keras")
    fix = ("Make more optimizer updates: a smaller batch size or more epochs (the run stopped "
           "while the loss was still far above what the model reaches).")

    def run(self, ctx: ProbeContext):
        """One confirmed finding when training longer lowers the held-out loss by a quarter.

        Only for runs of fewer than ``FEW_STEPS`` optimizer steps whose loss ended at
        ``FLOOR_SHARE`` or more of the constant predictor's; the longer copy is shortened to
        what the probe budget affords.
        """
        tr = ctx.trainer
        steps = len(ctx.run.steps)
        if tr is None or tr.n < 40 or not 0 < steps < FEW_STEPS or \
                ctx.signals.get("loss_floor_share", 0.0) < FLOOR_SHARE:
            return []  # (a loss well below the prior's learned: nothing held it up)
        order = np.random.default_rng(0).permutation(tr.n)  # held-out rows: not memorised
        cut = tr.n - max(tr.n // 5, 8)
        (train_x, train_y), (held_x, held_y) = tr.subset(order[:cut]), tr.subset(order[cut:])
        batch = min(run_batch_size(ctx) or 64, cut)
        longer = tr.steps_within(EXTRA * steps, batch_size=batch, floor=2 * steps,
                                 seconds=min(6.0, ctx.time_left() / 4))
        if longer < 2 * steps:
            return []
        losses = []
        for count in (steps, longer):
            model = tr.fresh_model()
            tr.fit(model, train_x, train_y, count, batch_size=batch, seed=0)
            losses.append(tr.evaluate(model, held_x, held_y))
        short, long = losses
        if not (math.isfinite(short) and math.isfinite(long)) or not long < CLEAR * short:
            return self._smaller_batch(ctx, steps, batch, short, (train_x, train_y),
                                       (held_x, held_y))
        measured = (f"Fresh copies from the same initial weights with the same optimizer and "
                    f"batch size reach held-out loss {short:.4g} after {steps} steps and "
                    f"{long:.4g} after {longer}: the loss was held up by the number of updates, "
                    "not by the model or the data.")
        cut = cut_passes(ctx)
        if cut is not None:  # the loop, not the settings, made the updates few
            return [self.finding(
                "training_loop", True,
                f"Each pass over the training loader drew {cut['drawn']} of its "
                f"{cut['batches']} batches: the batch loop is left early "
                f"({'a break or return' if cut['exit'] else 'the loop stops drawing'}), so the "
                f"run made only {steps} optimizer updates. {measured} Let every pass run to the "
                "loader's end.",
                cut["exit"] or cut["loop"], run_steps=steps, batch_size=batch,
                longer_steps=longer, loss_as_run=short, loss_longer=long,
                batches_per_pass=cut["batches"], drawn_per_pass=cut["drawn"], strength=0.85)]
        where = _batch_location(ctx)
        return [self.finding(
            "hyperparameter", True,
            f"The run made only {steps} optimizer updates (about {batch} rows each). {measured} "
            "Use a smaller batch or more epochs.",
            where, run_steps=steps, batch_size=batch, longer_steps=longer,
            loss_as_run=short, loss_longer=long, strength=0.8)]

    def _smaller_batch(self, ctx: ProbeContext, steps: int, batch: int, short: float,
                       train: tuple, held: tuple):
        """The same passes over the rows in batches of :data:`SMALL_BATCH`: more updates.

        A batch holding most of the data makes one update a pass whatever the epochs; longer
        training at that batch may still crawl (plain SGD on a full batch), while the same rows
        seen in small batches learn. Confirmed when that copy ends below :data:`CLEAR` x the
        run-length copy's held-out loss.
        """
        tr = ctx.trainer
        if batch < 4 * SMALL_BATCH:
            return []
        wanted = steps * (batch // SMALL_BATCH)
        count = tr.steps_within(wanted, batch_size=SMALL_BATCH, floor=2 * steps,
                                seconds=min(6.0, ctx.time_left() / 4))
        if count < 2 * steps:
            return []
        model = tr.fresh_model()
        tr.fit(model, *train, count, batch_size=SMALL_BATCH, seed=0)
        small = tr.evaluate(model, *held)
        if not math.isfinite(small) or not small < CLEAR * short:
            return []
        return [self.finding(
            "hyperparameter", True,
            f"The run made only {steps} optimizer updates of about {batch} rows each. Fresh "
            f"copies from the same initial weights with the same optimizer reach held-out loss "
            f"{short:.4g} as run and {small:.4g} when the same rows come in batches of "
            f"{SMALL_BATCH} ({count} updates{'' if count >= wanted else ', what the budget allowed'}"
            "): the batch size left too few updates. Use a smaller batch.",
            _batch_location(ctx), run_steps=steps, batch_size=batch, small_batch=SMALL_BATCH,
            small_batch_steps=count, loss_as_run=short, loss_small_batch=small, strength=0.8)]
