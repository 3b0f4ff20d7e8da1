"""``label_alignment``: do the labels carry information about the inputs?

A fresh copy of the model is trained on real labels and on shuffled labels; on held-out rows, real
labels must do clearly better. No difference means X and y are not aligned (a sort or merge that
moved one without the other) or the labels are noise.
"""

from __future__ import annotations

from .base import Probe, ProbeContext, register

ROWS = 768
STEPS = 150
MARGIN = 0.97  # real held-out loss must be below 97% of the shuffled one


@register
class LabelAlignment(Probe):
    id = "label_alignment"
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution", "overfitting")
    needs_live = True
    frameworks = ("torch",)

    def _holdout_loss(self, tr, inputs, target, train_idx, test_idx, seed) -> float:
        import torch

        model = tr.fresh_model()
        tr.fit(model, tuple(x[train_idx] for x in inputs), target[train_idx], STEPS, lr=1e-3,
               seed=seed, opt_cls=torch.optim.Adam)
        return tr.evaluate(model, tuple(x[test_idx] for x in inputs), target[test_idx])

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
        real = self._holdout_loss(tr, inputs, target, train_idx, test_idx, 0)
        shuffled_target = target[torch.randperm(n, generator=g)]
        shuffled = self._holdout_loss(tr, inputs, shuffled_target, train_idx, test_idx, 0)
        if real < MARGIN * shuffled:
            return []
        return [self.finding(
            "data", True,
            f"Trained on real labels, a fresh copy of the model does no better on held-out rows "
            f"than with shuffled labels (loss {real:.4g} vs {shuffled:.4g}). The labels carry no "
            "information about the inputs: X and y are misaligned (a sort, merge or shuffle that "
            "moved one without the other) or the labels are noise.",
            ctx.ref("loss_fn") or ctx.ref("backward"), heldout_loss_real=real,
            heldout_loss_shuffled=shuffled, rows=n, strength=0.85)]
