"""``batchnorm_stats``: batch-norm running statistics that do not describe the data.

In training mode a ``BatchNorm`` layer normalises each batch by that batch's own mean and
variance; in eval mode by running averages gathered over the training batches. With batches
of one or a few rows each sample is normalised by (nearly) itself, and the model learns to rely
on that: judged with the running averages, validation falls far below training although
nothing is memorised. The experiment, on a copy of the trained model: its validation loss in
eval mode, then with its batch-norm layers normalising each validation batch of the training
batch size by its own statistics, as in training (the other layers in eval mode). When that
lowers the validation loss by at least :data:`GAIN` of it (and lifts an accuracy by
:data:`ACC_LIFT`), and does as much on the kept training rows (the control: validation rows
shifted from training's, an affine shift batch statistics renormalise away, improve alone),
the model depends on batch statistics its running averages do not give.
With training batches of at most :data:`SMALL` rows the batch size is the cause (a
hyperparameter, located where it is set: decisive); otherwise a hypothesis on the layers.
"""

from __future__ import annotations

import numpy as np

from .base import Probe, ProbeContext, register, setting_location

SMALL = 8               # training batches of at most this many rows are too small for batch norm
GAIN = 0.25             # the validation loss falls by at least this share of it ...
ACC_LIFT = 0.05         # ... and a validation accuracy rises by this much (when there is one)
MAX_ROWS = 4096


@register
class BatchNormStats(Probe):
    """The trained model's validation loss in eval mode and with batch statistics."""

    id = "batchnorm_stats"
    categories = ("overfitting", "convergence_to_wrong_solution", "loss_not_decreasing")
    needs_live = True
    frameworks = ("torch",)
    fix = ("Train with batches of at least 16-32 rows where batch norm is used (or accumulate "
           "gradients over small batches and use GroupNorm/LayerNorm, which do not depend on "
           "the batch); keep BatchNorm's momentum near its default 0.1.")

    def applies(self, ctx: ProbeContext) -> bool:
        """A live PyTorch model with batch norm, kept training and validation rows."""
        tr = ctx.trainer
        return super().applies(ctx) and tr is not None and ctx.model is not None and \
            tr.targets is not None and getattr(tr, "val_targets", None) is not None and \
            bool(_norms(ctx.model))

    def run(self, ctx: ProbeContext):
        """One finding when batch statistics, as in training, close much of the gap."""
        from ..trainers.torch import copy_model

        tr = ctx.trainer
        if not ctx.train_batches:
            return []
        batch = int(np.median([int(b[1].shape[0]) for b in ctx.train_batches]))
        model = copy_model(ctx.model).to("cpu")
        before, acc_before, after, acc_after = _both_ways(tr, model, tr.val_inputs,
                                                          tr.val_targets, batch)
        if not _relies(before, acc_before, after, acc_after):
            return []
        # the control: the training rows lose as much in eval mode (else the validation rows
        # are what differs, a shift batch statistics renormalise away, not the batch norm)
        train = _both_ways(tr, copy_model(ctx.model).to("cpu"), tr.inputs, tr.targets, batch)
        if not _relies(*train):
            return []
        small = batch <= SMALL
        where = setting_location(ctx.ref("loader") or ctx.ref("fit"), "batch_size") \
            if small else ctx.ref("model")
        accs = "" if acc_before is None or acc_after is None else \
            f" (accuracy {acc_before:.1%} -> {acc_after:.1%})"
        return [self.finding(
            "hyperparameter" if small else "architecture", small,
            f"The trained model scores validation at loss {before:.4g} in eval mode, and "
            f"{after:.4g}{accs} when its batch-norm layers normalise each batch of {batch} "
            f"row{'s' if batch > 1 else ''} by its own statistics, as in training: the model "
            "learned to rely on statistics its running averages do not give." + (
                f" Batches of {batch} row{'s' if batch > 1 else ''} are too small for batch "
                "norm: raise the batch size." if small else ""),
            where, strength=0.85, undone=True, val_loss_eval_mode=before,
            val_loss_batch_statistics=after, val_accuracy_eval_mode=acc_before,
            val_accuracy_batch_statistics=acc_after, train_loss_eval_mode=train[0],
            train_loss_batch_statistics=train[2], batch_size=batch,
            norm_layers=[name for name, _ in _norms(model)][:8])]


def _both_ways(tr, model, inputs, targets, batch: int) -> tuple:
    """``(loss, accuracy)`` of ``model`` on the rows in eval mode, then with batch statistics.

    With batch statistics: its batch norms normalise each batch of ``batch`` rows by its own
    statistics. An accuracy is None when the output is not class scores.
    """
    import torch

    n = min(len(targets), MAX_ROWS)
    rows_in, rows_y = tuple(x[:n] for x in inputs), targets[:n]
    before = tr.evaluate(model, rows_in, rows_y)
    acc_before = _accuracy(tr, model, rows_in, rows_y)
    model.eval()
    for _, m in _norms(model):
        m.train()  # normalise by each batch's own statistics, as training did
        m.momentum = 0.0  # (and leave the copy's running averages as they are)
    losses, hits, rows = [], [], 0
    with torch.no_grad():
        for i in range(0, n, batch):
            chunk = tuple(x[i:i + batch] for x in rows_in)
            if len(chunk[0]) < min(batch, 2):
                break  # (a last row alone: a variance of one value)
            target = rows_y[i:i + batch]
            losses.append(float(tr.loss(model, chunk, target)) * len(target))
            acc = _accuracy(tr, model, chunk, target, train_mode=True)
            hits.append(None if acc is None else acc * len(target))
            rows += len(target)
    if not rows:
        return before, acc_before, float("nan"), None
    return before, acc_before, sum(losses) / rows, \
        None if None in hits else sum(hits) / rows


def _relies(before, acc_before, after, acc_after) -> bool:
    """Batch statistics lower the loss by :data:`GAIN` of it (and lift an accuracy)."""
    return bool(np.isfinite(before) and np.isfinite(after) and after <= (1 - GAIN) * before
                and (acc_before is None or acc_after is None or
                     acc_after - acc_before >= ACC_LIFT))


def _norms(model) -> list:
    """``(name, module)`` of the batch-norm layers that keep running statistics."""
    from torch import nn

    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]


def _accuracy(tr, model, inputs, target, train_mode: bool = False) -> float | None:
    """Accuracy of ``model`` on the rows when the output has a column per class.

    ``train_mode``: the model as it is (its batch norms normalising by the batch), else
    :meth:`predict`'s eval mode.
    """
    try:
        if train_mode:
            out = tr.forward(model, inputs)
            out = np.asarray((out if hasattr(out, "detach") else out[0]).detach().float())
        else:
            out = np.asarray(tr.predict(model, inputs))
        truth = np.asarray(target.cpu() if hasattr(target, "cpu") else target)
    except Exception:  # noqa: BLE001 - an output that is not class scores: no accuracy
        return None
    if out.ndim != 2 or out.shape[1] < 2 or truth.ndim != 1 or len(truth) != len(out) or \
            truth.dtype.kind not in "iu":
        return None
    return float(np.mean(out.argmax(axis=1) == truth))
