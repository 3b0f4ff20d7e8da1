"""``data_order``: the training batches follow an order of the targets (sorted, grouped by class).

A loader that never shuffles a training set sorted by its target (a CSV sorted by label, classes
concatenated one after another, rows in order of price) feeds batches that are each a narrow
slice of the targets: every step pulls the model toward the current slice, it forgets the
earlier ones, and the loss does not settle (or blows up when the slices' scales differ).

Measured on the kept training batches, in the order the loop fed them: the share of the targets'
variance that lies *between* batches (one-hot classes for a classification loss). Batches drawn
at random keep it near ``(batches - 1) / (rows - 1)``; the measured share must reach
:data:`BETWEEN` and exceed every one of :data:`PERMUTATIONS` shuffles of the same rows. Then an
experiment: two fresh copies with the user's optimizer train on the same rows (a random 30% held
out), one in the order seen, one on shuffled batches, for the same steps; confirmed when the
shuffled copy's held-out loss is clearly lower. Located at the loader (or ``fit``) that feeds
the batches in that order, where ``shuffle`` is set.
"""

from __future__ import annotations

import math

import numpy as np

from ..provenance import batches_origin
from . import _numpy_stats as st
from ._heldout import BETTER, SPLIT
from .base import Probe, ProbeContext, register

BETWEEN = 0.25      # share of the target variance between batches that reads as an order
PERMUTATIONS = 200  # shuffles of the same rows the measured share must beat, every one
MIN_BATCHES = 4
MAX_COLUMNS = 64    # one-hot classes or regression outputs, at most


def between_share(y: np.ndarray, sizes: list[int]) -> float:
    """Share of the total variance of ``y`` (rows x columns) that lies between the batches.

    ``sizes`` are the batch sizes, in order (they sum to ``len(y)``).
    """
    centred = y - y.mean(axis=0)
    total = float((centred ** 2).sum())
    if not total > 0:
        return 0.0
    bounds = np.cumsum([0, *sizes])
    between = sum(n * float((centred[a:b].mean(axis=0) ** 2).sum())
                  for a, b, n in zip(bounds[:-1], bounds[1:], sizes))
    return between / total


def target_matrix(y, loss: str | None) -> np.ndarray | None:
    """The targets as a float (rows x columns) matrix.

    One-hot classes, or the regression outputs; None for sequence targets or too many columns.
    """
    labels = st.as_labels(y, loss)
    if labels is not None:
        classes, codes = np.unique(labels, return_inverse=True)
        if len(classes) > MAX_COLUMNS:
            return None
        return np.eye(len(classes))[codes.reshape(-1)]
    y = np.asarray(y)
    if y.ndim >= 2 and np.issubdtype(y.dtype, np.integer):
        return None  # class indices per position (tokens): a sequence target
    y = y.astype(np.float64).reshape(len(y), -1) if y.ndim != 1 else \
        y.astype(np.float64)[:, None]
    if y.shape[1] > MAX_COLUMNS or not np.isfinite(y).all():
        return None
    return y


def _numpy(t) -> np.ndarray:
    return t.detach().cpu().float().numpy() if hasattr(t, "detach") else np.asarray(t)


@register
class DataOrder(Probe):
    """Batches ordered by their targets, and a copy on shuffled batches learns clearly better."""

    id = "data_order"
    cost = 2
    data_role = "targets"
    traces_origin = False
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution",
                  "gradient_instability", "overfitting")
    needs_live = True
    fix = ("Shuffle the training data every epoch: `DataLoader(..., shuffle=True)` (or a "
           "random sampler), `model.fit(..., shuffle=True)`, `dataset.shuffle(buffer)` before "
           "`.batch()` with a buffer as large as the data; or shuffle the arrays once before "
           "splitting them into batches.")

    def intervention(self, finding):
        """The training loader (or ``fit``) shuffles in the re-run.

        None when the batches came from neither (a ``tf.data`` pipeline, slices of an array):
        the re-run could not change their order.
        """
        from ..records import Intervention

        return Intervention("shuffle") if finding.evidence.get("shufflable") else None

    def applies(self, ctx: ProbeContext) -> bool:
        """With a trainer over at least :data:`MIN_BATCHES` kept training batches."""
        tr = ctx.trainer
        return super().applies(ctx) and tr is not None and tr.targets is not None and \
            len(ctx.train_batches) >= MIN_BATCHES

    def run(self, ctx: ProbeContext):
        """One finding when the batches follow the targets' order; confirmed by the copies."""
        tr = ctx.trainer
        sizes = [int(b[1].shape[0]) for b in ctx.train_batches]
        if sum(sizes) != tr.n:
            return []
        y = target_matrix(_numpy(tr.targets), st.loss_name(ctx))
        if y is None:
            return []
        share = between_share(y, sizes)
        if share < BETWEEN:
            return []
        rng = np.random.default_rng(0)
        shuffled = max(between_share(y[rng.permutation(len(y))], sizes)
                       for _ in range(PERMUTATIONS))
        if share <= shuffled:
            return []
        in_order, at_random = self._copies(ctx, int(np.median(sizes)))
        confirmed = math.isfinite(at_random) and at_random < BETTER * in_order
        # where the order is set: the loader, fit's data, else what a custom loop draws its
        # batches from (``train_ds = tf.data.Dataset...batch(64)``, where a shuffle belongs)
        where = ctx.ref("loader") or ctx.ref("fit") or batches_origin(st.data_location(ctx))
        return [self.finding(
            "data", confirmed,
            f"The training batches follow the order of their targets: {share:.0%} of the "
            f"targets' variance lies between batches (at most {shuffled:.0%} in {PERMUTATIONS} "
            f"shuffles of the same rows). Two fresh copies trained on the same rows reach a "
            f"held-out loss of {_shown(in_order)} in that order and {_shown(at_random)} on "
            "shuffled batches"
            + (": the order of the data holds the training back." if confirmed else
               ": no clearly better, so the order is not what holds it back."),
            where, undone=confirmed, strength=0.9 if confirmed else 0.2,
            shufflable=bool(ctx.ref("loader") or ctx.ref("fit")),
            between_batch_share=share, between_batch_share_shuffled_max=shuffled,
            batches=len(sizes), heldout_loss_in_order=in_order,
            heldout_loss_shuffled=at_random)]

    @staticmethod
    def _copies(ctx: ProbeContext, batch_size: int) -> tuple[float, float]:
        """Held-out losses of two copies: batches in the order seen, and shuffled batches."""
        tr = ctx.trainer
        n = tr.n
        perm = [int(i) for i in tr.randperm(n, 3)]
        held = sorted(perm[int(SPLIT * n):])
        train = sorted(perm[:int(SPLIT * n)])  # still in the order the loop fed them
        inputs, target = tr.subset(train)
        held_inputs, held_target = tr.subset(held)
        passes = max(2 * len(train) // max(batch_size, 1), 60)
        steps = tr.steps_within(passes, batch_size=batch_size,
                                seconds=min(3.0, ctx.time_left() / 6))
        out = []
        for shuffle in (False, True):
            model = tr.fresh_model()
            tr.fit(model, inputs, target, steps, batch_size=batch_size, seed=0,
                   shuffle=shuffle)
            value = tr.evaluate(model, held_inputs, held_target)
            out.append(value if math.isfinite(value) else float("inf"))
        return out[0], out[1]


def _shown(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else "a non-finite value"
