"""``label_alignment``: whether the labels carry information about the inputs.

Fresh copies of the model are trained on real labels and on shuffled labels; on held-out rows, real
labels must do clearly better. No difference means X and y are not aligned (a sort or merge that
moved one without the other) or the labels are noise.

One train/held-out split is noisy: with uninformative labels, which rows land where and how far
each copy overfits move the real/shuffled ratio by a few percent either way. So the verdict uses
every row once as held-out (3-fold cross-validation) and two shuffles. One fold is tried first:
labels that clearly help there end the probe early, so a healthy run pays for two fits only.
"""

from __future__ import annotations

import math
import time

import numpy as np

from . import _numpy_stats as st
from .base import Probe, ProbeContext, register

ROWS = 1536
CONTROL_FEATURES = 4096  # input features the positive control's projection reads at most
STEPS = 150
FOLDS = 3
CHECKS = 10    # held-out loss read 10 times per fit; the best counts (overfitting adds noise)
SHUFFLES = 2
MARGIN = 0.97  # real held-out loss must be below 97% of the shuffled one
CLEAR = 0.9    # ... and below 90% on the first fold is clear enough to stop there
UNTRAINED = 1.1  # best held-out loss above 1.1x the constant predictor's: the copies did not
                 # learn even the label prior (too few steps for this data, or diverged): no verdict


def constant_loss(name: str, target, ignore_index: int = -100,
                  kwargs: dict | None = None) -> float | None:
    """Loss of the best constant prediction on ``target`` (a tensor or array) for ``name``.

    Class targets with more than one dimension (tokens, pixels) count every position, except
    ``ignore_index``. ``kwargs`` are the loss's own (Smooth-L1's ``beta``, Huber's ``delta``).
    """
    from .constant_baseline import baseline_from_targets

    if hasattr(target, "detach"):  # a torch tensor (bfloat16 has no NumPy dtype)
        target = target.detach().cpu()
        target = (target.double() if target.is_floating_point() else target).numpy()
    y = np.asarray(target)
    if name in ("cross_entropy", "nll_loss") and y.ndim >= 2 and \
            np.issubdtype(y.dtype, np.integer):
        y = y.reshape(-1)
        y = y[y != ignore_index]
        if not len(y):
            return None
    kwargs = kwargs or {}
    beta = kwargs.get("delta" if name == "huber_loss" else "beta", 1.0)
    got = baseline_from_targets(y, name, float(beta) if isinstance(beta, (int, float)) else 1.0)
    return None if got is None else got[0]


def learnable_labels(inputs, target, rng: np.random.Generator, ignore_index: int = -100):
    """Labels shaped and typed like ``target`` that are a linear function of the inputs.

    The first floating input is standardised and projected on random directions: class labels
    are equal-frequency bins of one projection over the target's own classes (balanced like
    nothing else), binary columns keep each column's rate, and continuous columns keep each
    column's mean and spread. None when no input is floating (token ids), when the inputs do
    not vary (no labels are a function of them: the verdict stands on its own), or when the
    target is none of these. Wide inputs (images) are projected from :data:`CONTROL_FEATURES` of their
    features, in float32.
    """
    x = next((v for v in inputs if _is_float(v)), None)
    if x is None:
        return None
    x = x.detach().cpu().float().numpy() if hasattr(x, "detach") else np.asarray(x)
    x = x.reshape(len(x), -1)
    if x.shape[1] > CONTROL_FEATURES:
        x = x[:, rng.choice(x.shape[1], CONTROL_FEATURES, replace=False)]
    x = x.astype(np.float32)
    x = (x - x.mean(0)) / np.where(x.std(0) > 1e-8, x.std(0), 1.0)
    torch_target = hasattr(target, "detach")
    if torch_target:  # bfloat16 has no NumPy dtype: floats go through float64
        t = target.detach().cpu()
        y = (t.double() if t.is_floating_point() else t).numpy()
    else:
        y = np.asarray(target)
    flat = y.reshape(len(y), -1) if y.ndim > 1 else y[:, None]
    if flat.shape[1] > 64 or not np.issubdtype(y.dtype, np.number) and y.dtype != bool:
        return None
    proj = x @ rng.standard_normal((x.shape[1], flat.shape[1]))
    if not (proj.std(0) > 1e-6).all():
        return None  # inputs with no spread (constant): nothing is a function of them
    ranks = np.argsort(np.argsort(proj, axis=0), axis=0) / len(proj)  # 0..1 per column
    binary = np.isin(flat, (0, 1)).all()
    if np.issubdtype(y.dtype, np.integer) or y.dtype == bool:
        if flat.shape[1] != 1:
            return None
        classes = np.unique(flat[flat != ignore_index])
        if len(classes) < 2:
            return None
        out = classes[np.minimum((ranks[:, 0] * len(classes)).astype(int), len(classes) - 1)]
        out = out.reshape(y.shape)
    elif binary and flat.shape[1] > 1 and np.allclose(flat.sum(1), 1.0):  # one-hot classes
        k = np.minimum((ranks[:, 0] * flat.shape[1]).astype(int), flat.shape[1] - 1)
        out = np.eye(flat.shape[1], dtype=y.dtype)[k].reshape(y.shape)
    elif binary:  # multi-label or a single binary column: each column keeps its rate
        out = (ranks >= 1.0 - flat.mean(0)).astype(y.dtype).reshape(y.shape)
    else:
        z = (proj - proj.mean(0)) / np.where(proj.std(0) > 1e-12, proj.std(0), 1.0)
        out = (flat.mean(0) + flat.std(0) * z).astype(y.dtype).reshape(y.shape)
    if torch_target:
        import torch

        return torch.as_tensor(out).to(target.dtype)
    return out


def _is_float(v) -> bool:
    if hasattr(v, "is_floating_point"):
        return bool(v.is_floating_point())
    return np.issubdtype(np.asarray(v).dtype, np.floating)


@register
class LabelAlignment(Probe):
    """Fresh copies trained on real and on shuffled labels, compared on held-out rows."""

    id = "label_alignment"
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution", "overfitting")
    needs_live = True
    frameworks = ("torch", "keras")
    fix = ("Keep inputs and labels aligned: apply the same index/permutation to both (sort or "
           "shuffle them together).")

    def run(self, ctx: ProbeContext):
        """One confirmed finding when real labels do no better than shuffled ones.

        Held-out losses are pooled over the folds. No verdict when a copy diverges, when the copies
        never reach the constant predictor's loss, or when the fits do not fit the probe budget.
        """
        tr = ctx.trainer
        if tr is None or tr.n < 64:
            return []
        n = min(ROWS, tr.n)
        rng = np.random.default_rng(0)
        inputs, target = tr.subset(rng.permutation(tr.n)[:n])
        folds = np.array_split(np.arange(n), FOLDS)
        steps = tr.steps_within(STEPS, floor=60, seconds=min(2.0, ctx.time_left() / 20))
        targets = [target] + [target[rng.permutation(n)] for _ in range(SHUFFLES)]

        def heldout(labels, k: int) -> tuple[float, float]:
            """(best held-out loss, final training-fit loss) of a copy trained off fold ``k``."""
            test = folds[k]
            train = np.concatenate([f for j, f in enumerate(folds) if j != k])
            held = []
            model = tr.fresh_model()
            tr.fit(model, tuple(x[train] for x in inputs), labels[train], steps, lr=1e-3,
                   seed=k, opt_cls=tr.adam, every=max(steps // CHECKS, 1),
                   check=lambda m: held.append(
                       tr.evaluate(m, tuple(x[test] for x in inputs), labels[test])))
            best = min((h for h in held if math.isfinite(h)), default=math.inf)
            return best, tr.evaluate(model, tuple(x[train] for x in inputs), labels[train])

        started = time.monotonic()
        done = {(i, 0): heldout(targets[i], 0) for i in (0, 1)}
        first = (done[0, 0][0], done[1, 0][0])
        if not all(map(math.isfinite, first)) or first[0] < CLEAR * first[1]:
            return []  # a copy diverged, or the labels clearly help on the first fold
        base = constant_loss(tr.loss_fn.__name__, target,
                             tr.loss_kwargs.get("ignore_index", -100), tr.loss_kwargs)
        if base is None or min(first) > UNTRAINED * base:
            return []  # no baseline, or the copies never reach the prior: no verdict
        if ctx.time_left() < 4 * (time.monotonic() - started):
            return []  # the other 7 fits do not fit in the probe budget
        for k in range(FOLDS):
            for i, labels in enumerate(targets):
                if (i, k) not in done:
                    done[i, k] = heldout(labels, k)

        def pooled(i: int, which: int = 0) -> float:
            return sum(done[i, k][which] * len(f) for k, f in enumerate(folds)) / n

        real, shuffled = pooled(0), [pooled(i) for i in range(1, len(targets))]
        mean_shuffled = sum(shuffled) / len(shuffled)
        if not math.isfinite(real + mean_shuffled) or real < MARGIN * mean_shuffled:
            return []  # a copy diverged on a later fold, or the labels help
        if not real <= UNTRAINED * base:
            return []  # the copies never reached the prior: inconclusive about the labels
        # the positive control: labels that are a simple function of the inputs, which a
        # copy that can learn at all learns; a copy crippled by its initialisation or its
        # optimizer's settings fails it, and then real ~ shuffled says nothing about the labels
        ignore = tr.loss_kwargs.get("ignore_index", -100)
        control = learnable_labels(inputs, target, rng, ignore)  # None for token ids
        control_loss = control_base = None
        if control is not None:
            if ctx.time_left() < 1.5 * (time.monotonic() - started) / len(done):
                return []  # the control does not fit in the probe budget: no verdict
            try:
                control_loss = heldout(control, 0)[0]
                control_base = constant_loss(tr.loss_fn.__name__, control, ignore,
                                             kwargs=tr.loss_kwargs)
            except Exception:  # noqa: BLE001 - a loss that refuses the control: no verdict
                return []
            if control_base is None or not control_loss < CLEAR * control_base:
                return []  # the copies cannot learn even a linear function of the inputs
        return [self.finding(
            "data", True,
            f"Trained on real labels, fresh copies of the model do no better on held-out rows "
            f"than with shuffled labels (loss {real:.4g} vs {mean_shuffled:.4g}, every row held "
            f"out once over {FOLDS} folds). The labels carry no information about the inputs: "
            "X and y are misaligned (a sort, merge or shuffle that moved one without the other) "
            "or the labels are noise.",
            st.data_location(ctx), heldout_loss_real=real,
            heldout_loss_shuffled=mean_shuffled, heldout_loss_each_shuffle=shuffled,
            control_heldout_loss=control_loss, control_constant_loss=control_base,
            train_fit_loss=pooled(0, 1), constant_loss=base, rows=n, folds=FOLDS,
            strength=0.85)]
