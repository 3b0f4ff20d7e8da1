"""``small_batches``: steps of a few rows each, so the fixed cost of a step dominates the run.

Every optimizer step pays a fixed cost (Python, kernel launches, the optimizer's pass over every
parameter) whatever its batch holds; with a handful of rows per step (``batch_size=1`` to ``8``)
that cost is most of the step, and the run takes many times longer than the hardware needs. The
batch size comes from the kept training batches (their median, at most :data:`SMALL` rows). Then
an experiment on fresh copies with the user's optimizer and loss, without the capture's hooks:
rows per second at the run's batch size and at :data:`FACTOR` times it. Confirmed when the larger
batch trains :data:`GAIN` times as many rows per second and would save at least
:data:`MIN_SAVED_SECONDS` of the run's steps (a run of a second is not worth shortening:
a 1.1 s run of batch-8 steps on 150 rows is a healthy script). On a run that looked healthy
the confirmed finding re-classifies it ``performance_issue``. Located where the batch size is
set (the loader, ``fit``, ``.batch()``).
"""

from __future__ import annotations

import math
import re

import numpy as np

from . import _numpy_stats as st
from ._heldout import source_line
from .base import Probe, ProbeContext, register, setting_location

SMALL = 8              # rows per step at most
FACTOR = 16            # the larger batch the copy is timed at
GAIN = 4.0             # rows per second at FACTOR x the batch, against the run's batch
MIN_RUN_SECONDS = 1.0  # the run's steps took at least this long ...
MIN_SAVED_SECONDS = 1.5  # ... and the larger batch would save at least this much of them
_BATCH = re.compile(r"batch_size\s*=|\.batch\(")


@register
class SmallBatches(Probe):
    """A batch of a few rows, and copies at a larger batch train several times faster."""

    id = "small_batches"
    cost = 2
    categories = ("healthy", "performance_issue")  # the time, not another category's cause
    reveals = "performance_issue"
    needs_live = True
    fix = ("Raise the batch size (to 32-256 rows, as memory allows) and scale the learning rate "
           "with it (about linearly for SGD, by its square root for Adam); each step then does "
           "more work for the same fixed cost.")

    def applies(self, ctx: ProbeContext) -> bool:
        """With a trainer, and kept training batches of at most :data:`SMALL` rows."""
        tr = ctx.trainer
        return super().applies(ctx) and tr is not None and tr.targets is not None and \
            len(ctx.train_batches) >= 2 and self._batch(ctx) <= SMALL and \
            tr.n >= 2 * self._batch(ctx)

    @staticmethod
    def _batch(ctx: ProbeContext) -> int:
        return int(np.median([int(b[1].shape[0]) for b in ctx.train_batches]))

    def run(self, ctx: ProbeContext):
        """One finding when a larger batch trains many more rows per second."""
        sig = ctx.signals
        run_seconds = sig.get("steps", 0) * sig.get("step_ms", 0.0) / 1000.0
        if run_seconds < MIN_RUN_SECONDS:
            return []
        tr = ctx.trainer
        batch = self._batch(ctx)
        larger = min(FACTOR * batch, tr.n)
        small_rate = tr.throughput(batch)
        large_rate = tr.throughput(larger)
        gain = large_rate / small_rate if small_rate > 0 else math.inf
        if not gain >= GAIN or run_seconds * (1 - 1 / gain) < MIN_SAVED_SECONDS:
            return []  # not much faster, or a run too short for the saving to matter
        where = setting_location(ctx.ref("loader") or ctx.ref("fit"), "batch_size") or \
            source_line(ctx, _BATCH, near=ctx.ref("backward")) or st.data_location(ctx)
        return [self.finding(
            "hyperparameter", True,
            f"Each step trains on {batch} row{'s' if batch > 1 else ''}: the fixed cost of a "
            f"step dominates. A fresh "
            f"copy with your optimizer trains {small_rate:,.0f} rows/s at a batch of {batch} "
            f"and {large_rate:,.0f} rows/s at {larger} ({gain:.1f}x); the run's "
            f"{sig.get('steps', 0)} steps took {run_seconds:.1f} s, about "
            f"{run_seconds / gain:.1f} s at the larger batch for the same rows.",
            where, strength=0.8, undone=True, decisive=True, batch_size=batch,
            larger_batch=larger,
            rows_per_second=small_rate, rows_per_second_larger=large_rate, gain=gain,
            run_step_seconds=run_seconds)]
