"""``label_alignment``: do the labels carry information about the inputs?

A fresh copy of the model is trained on real labels and on shuffled labels; on held-out rows, real
labels must do clearly better. No difference means X and y are not aligned (a sort or merge that
moved one without the other) or the labels are noise.
"""

from __future__ import annotations

import math

from .base import Probe, ProbeContext, register

ROWS = 768
STEPS = 150
MARGIN = 0.97  # real held-out loss must be below 97% of the shuffled one
FAILED = 1.5   # held-out loss above 1.5x the constant predictor's: training failed, no verdict


def constant_loss(name: str, target) -> float | None:
    """Loss of the best constant prediction on ``target`` for the loss ``name``."""
    import torch

    t = target.detach()
    if name in ("cross_entropy", "nll_loss") and not t.is_floating_point():
        p = torch.bincount(t.flatten().clamp(min=0)).double()
        p = p[p > 0] / p.sum()
        return float(-(p * p.log()).sum())
    t = t.double()
    if name.startswith("binary_cross_entropy"):
        m = float(t.mean())
        return 0.0 if m in (0.0, 1.0) else -(m * math.log(m) + (1 - m) * math.log(1 - m))
    if name == "mse_loss":
        return float(t.var(unbiased=False))
    if name in ("l1_loss", "smooth_l1_loss", "huber_loss"):
        return float((t - t.median()).abs().mean())
    return None


@register
class LabelAlignment(Probe):
    id = "label_alignment"
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution", "overfitting")
    needs_live = True
    frameworks = ("torch",)

    def _holdout_loss(self, tr, inputs, target, train_idx, test_idx, seed, steps) -> float:
        import torch

        model = tr.fresh_model()
        tr.fit(model, tuple(x[train_idx] for x in inputs), target[train_idx], steps, lr=1e-3,
               seed=seed, opt_cls=torch.optim.Adam)
        fit = tr.evaluate(model, tuple(x[train_idx] for x in inputs), target[train_idx])
        return tr.evaluate(model, tuple(x[test_idx] for x in inputs), target[test_idx]), fit

    def run(self, ctx: ProbeContext):
        import torch

        tr = ctx.trainer
        if tr is None or tr.n < 64:
            return []
        n = min(ROWS, tr.n)
        g = torch.Generator().manual_seed(0)
        perm = torch.randperm(tr.n, generator=g)[:n]
        inputs, target = tr.subset(perm)
        cut = int(0.7 * n)
        train_idx, test_idx = torch.arange(cut), torch.arange(cut, n)
        steps = tr.steps_within(STEPS, floor=60, seconds=min(3.0, ctx.time_left() / 8))
        real, fit = self._holdout_loss(tr, inputs, target, train_idx, test_idx, 0, steps)
        shuffled_target = target[torch.randperm(n, generator=g)]
        shuffled, _ = self._holdout_loss(tr, inputs, shuffled_target, train_idx, test_idx, 0,
                                         steps)
        if real < MARGIN * shuffled:
            return []
        base = constant_loss(tr.loss_fn.__name__, target[test_idx])
        if base is None or not real <= FAILED * base:
            return []  # the copy trained into nonsense (diverged): inconclusive about labels
        return [self.finding(
            "data", True,
            f"Trained on real labels, a fresh copy of the model does no better on held-out rows "
            f"than with shuffled labels (loss {real:.4g} vs {shuffled:.4g}). The labels carry no "
            "information about the inputs: X and y are misaligned (a sort, merge or shuffle that "
            "moved one without the other) or the labels are noise.",
            ctx.ref("loss_fn") or ctx.ref("backward"), heldout_loss_real=real,
            heldout_loss_shuffled=shuffled, train_fit_loss=fit, constant_loss=base, rows=n,
            strength=0.85)]
