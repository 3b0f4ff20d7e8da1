"""``label_alignment``: whether the labels carry information about the inputs.

Fresh copies of the model are trained on real labels and on shuffled labels; on held-out rows, real
labels must do clearly better (every parameter of the copies trains: frozen layers would hide
what the labels carry). No difference means X and y are not aligned (a sort or merge that
moved one without the other) or the labels are noise.

One train/held-out split is noisy: with uninformative labels, which rows land where and how far
each copy overfits move the real/shuffled ratio by a few percent either way. So the verdict uses
every row once as held-out (3-fold cross-validation) and two shuffles (one, when the budget
left cannot pay for the second on a slow model). One fold is tried first: labels that clearly
help there end the probe early, so a healthy run pays for two fits only.
"""

from __future__ import annotations

import math
import time

import numpy as np

from . import _numpy_stats as st
from .base import Probe, ProbeContext, register

ROWS = 1536
MEMO_ROWS = 64    # the positive control: a fresh copy memorises this many rows ...
MEMO_STEPS = 300  # ... in this many full-batch steps,
MEMORISED = 0.75  # ... to below this share of the constant predictor's loss (planted labels too)
STEPS = 150
FOLDS = 3
CHECKS = 10    # held-out loss read 10 times per fit; the best counts (overfitting adds noise)
SHUFFLES = 2   # (1 when the budget cannot afford the second on every fold)
CONTROL_FITS = 1.5  # what the positive control costs, in fits
MARGIN = 0.97  # real held-out loss must be below 97% of the shuffled one
CLEAR = 0.9    # ... and below 90% on the first fold is clear enough to stop there
GENERALISED = 0.8      # the run's best validation loss at most this share of the prior's, or
GENERALISED_ACC = 0.1  # its best validation accuracy this far above the majority rate
WITNESS_MARGIN = 0.05  # a k-NN's held-out accuracy (or R^2) this far above shuffled labels'
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


def memorises(tr, inputs, target, rng: np.random.Generator, ignore_index: int = -100):
    """The positive control: ``(loss, constant loss)`` of a fresh copy fitted to a few rows.

    :data:`MEMO_ROWS` training rows with their real labels, :data:`MEMO_STEPS` full-batch
    Adam steps: any copy that can learn at all memorises them (whatever the labels mean),
    while one crippled by its initialisation or its optimizer's settings stays at the
    constant predictor's loss. None when the control says nothing: the rows do not vary
    (constant inputs are the data's fault) or there is no baseline.
    """
    idx = rng.permutation(len(target))[:MEMO_ROWS]
    x, y = tuple(v[idx] for v in inputs), target[idx]
    first = x[0]
    spread = first.float().std(0).max() if hasattr(first, "float") else \
        np.asarray(first, dtype=np.float64).std(0).max()
    if not float(spread) > 1e-8:
        return None
    base = constant_loss(tr.loss_fn.__name__, y, ignore_index, tr.loss_kwargs)
    if base is None or not base > 0:
        return None
    model = tr.unfreeze(tr.fresh_model())
    tr.fit(model, x, y, MEMO_STEPS, lr=1e-3, seed=0, opt_cls=tr.adam, batch_size=MEMO_ROWS)
    return tr.evaluate(model, x, y), base


def planted(inputs, target, rng: np.random.Generator, loss: str | None = None):
    """The user's labels re-dealt so that they follow the inputs: a task known to be learnable.

    Rows are ordered along a random direction of the (standardised, flattened) first input and
    given the labels in sorted order: every label value and its share is kept (the constant
    predictor scores the same), but each label now depends on one linear feature of the
    inputs. None when the inputs do not vary.
    """
    first = inputs[0]
    x = st.as_matrix(first.detach().cpu().double().numpy() if hasattr(first, "detach")
                     else first)
    spread = x.std(0)
    if not np.isfinite(x).all() or not float(spread.max(initial=0.0)) > 1e-8:
        return None
    keep = spread > 1e-8
    score = ((x[:, keep] - x[:, keep].mean(0)) / spread[keep]) @ \
        rng.standard_normal(int(keep.sum()))
    y = target.detach().cpu().numpy() if hasattr(target, "detach") else np.asarray(target)
    key = st.as_labels(y, loss)
    if key is None:
        key = np.asarray(y, dtype=np.float64).reshape(len(y), -1)[:, 0]
    order = np.empty(len(score), dtype=np.int64)
    order[np.argsort(score, kind="stable")] = np.argsort(key, kind="stable")
    if hasattr(target, "detach"):
        import torch

        return target[torch.from_numpy(order)]
    return target[order]


def learns_planted(tr, inputs, target, folds, steps: int, rng: np.random.Generator,
                   ignore_index: int = -100):
    """The positive control: ``(held-out loss, constant loss)`` of a copy fitted to planted labels.

    A fresh copy is trained as the probe trains its copies (same rows, steps and optimizer) on
    :func:`planted` labels and read on the first fold: any copy that can learn at all learns a
    label that follows one direction of its inputs, while one crippled by its
    initialisation or its optimizer's settings stays at the constant predictor's loss. None
    when the control says nothing (inputs without spread, no baseline).
    """
    labels = planted(inputs, target, rng, getattr(tr.loss_fn, "__name__", None))
    if labels is None:
        return None
    base = constant_loss(tr.loss_fn.__name__, labels, ignore_index, tr.loss_kwargs)
    if base is None or not base > 0:
        return None
    test = folds[0]
    train = np.concatenate(folds[1:])
    model = tr.unfreeze(tr.fresh_model())
    tr.fit(model, tuple(x[train] for x in inputs), labels[train], steps, lr=1e-3, seed=0,
           opt_cls=tr.adam)
    return tr.evaluate(model, tuple(x[test] for x in inputs), labels[test]), base


@register
class LabelAlignment(Probe):
    """Fresh copies trained on real and on shuffled labels, compared on held-out rows."""

    id = "label_alignment"
    cost = 10
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution", "overfitting")
    needs_live = True
    frameworks = ("torch", "keras")
    fix = ("Keep inputs and labels aligned: apply the same index/permutation to both (sort or "
           "shuffle them together).")
    traces_origin = False  # located by :func:`_pairing_location` (the half that lost its pair)

    def pointed_at(self, ctx: ProbeContext, measured: dict) -> bool:
        """When nearest neighbours on the inputs predict the labels no better than chance.

        The reference learner's score (``learnable``): an accuracy that closes at most
        :data:`WITNESS_MARGIN` of the gap between the majority rate and 1, or an R^2 at most
        that above zero. Aligned
        labels of most data are told from the inputs by their neighbours; this probe's many
        fits then get the budget before the cheaper probes of other causes.
        """
        got = measured.get("learnable") or {}
        score = got.get("score")
        if not isinstance(score, (int, float)):
            return False
        if got.get("metric") == "accuracy":  # of the room above chance (imbalanced classes)
            chance = (ctx.signals or {}).get("majority_rate")
            return isinstance(chance, (int, float)) and 0 <= chance < 1 and \
                (score - chance) / (1 - chance) <= WITNESS_MARGIN
        return score <= WITNESS_MARGIN

    def run(self, ctx: ProbeContext):
        """One confirmed finding when real labels do no better than shuffled ones.

        Held-out losses are pooled over the folds. No verdict when a copy diverges, when the copies
        never reach the constant predictor's loss, or when the fits do not fit the probe budget.
        """
        tr = ctx.trainer
        if tr is None or tr.n < 64 or _run_generalised(getattr(ctx, "signals", None)):
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
            model = tr.unfreeze(tr.fresh_model())  # (a question about the data, not what trains)
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
        per_fit = (time.monotonic() - started) / 2
        if ctx.time_left() < (FOLDS * (1 + SHUFFLES) - 2 + CONTROL_FITS) * per_fit:
            targets = targets[:2]  # one shuffle: 4 more fits, not 7 (a slow model's budget)
            if ctx.time_left() < (FOLDS * 2 - 2 + CONTROL_FITS) * per_fit:
                return []  # not even those fit in the probe budget
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
        control = self._control(ctx, tr, inputs, target, folds, steps, rng,
                                (time.monotonic() - started) / len(done))
        if control is False:
            return []  # the copies cannot learn even a planted label: the learner, not the labels
        kind, control_loss, control_base = control or (None, None, None)
        witness = _witness(ctx, inputs, target, rng)
        if witness is not None and witness[0] >= witness[1] + max(WITNESS_MARGIN, witness[2]):
            return []  # another learner tells the labels from the inputs: they are aligned
        return [self.finding(
            "data", True,
            f"Trained on real labels, fresh copies of the model do no better on held-out rows "
            f"than with shuffled labels (loss {real:.4g} vs {mean_shuffled:.4g}, every row held "
            f"out once over {FOLDS} folds). The labels carry no information about the inputs: "
            "X and y are misaligned (a sort, merge or shuffle that moved one without the other) "
            "or the labels are noise.",
            _pairing_location(st.data_location(ctx)), heldout_loss_real=real,
            heldout_loss_shuffled=mean_shuffled, heldout_loss_each_shuffle=shuffled,
            control=kind, control_loss=control_loss, control_constant_loss=control_base,
            train_fit_loss=pooled(0, 1), constant_loss=base, rows=n, folds=FOLDS,
            knn_real=witness[0] if witness else None,
            knn_shuffled=witness[1] if witness else None, shuffles=len(shuffled),
            strength=0.85 if len(shuffled) > 1 else 0.75, decisive=True)]

    @staticmethod
    def _control(ctx, tr, inputs, target, folds, steps: int, rng, fit_seconds: float):
        """The positive control: ``(kind, loss, constant loss)`` it passed with, False, or None.

        Real ~ shuffled says something about the labels only if the copies can learn at all.
        Two tasks known to be learnable, the cheaper first: labels planted along one direction
        of the inputs, learned on held-out rows (:func:`learns_planted`), else a few rows
        memorised (:func:`memorises`; random labels on low-dimensional inputs, such as two
        coordinates, are not memorisable in its steps, planted ones are). False when neither
        passes (a copy crippled by its initialisation or its optimizer's settings, whose
        tie between real and shuffled labels says nothing), or when they do not fit the budget;
        None when neither can say (inputs without spread).
        """
        ignore = tr.loss_kwargs.get("ignore_index", -100)
        said = False
        for kind, check in (
                ("planted", lambda: learns_planted(tr, inputs, target, folds, steps, rng, ignore)),
                ("memorised", lambda: memorises(tr, inputs, target, rng, ignore))):
            if ctx.time_left() < CONTROL_FITS * fit_seconds:
                return False  # the control does not fit in the probe budget: no verdict
            try:
                got = check()
            except Exception:  # noqa: BLE001 - a control that cannot run: no verdict
                return False
            if got is None:
                continue
            said = True
            if got[0] < MEMORISED * got[1]:
                return kind, got[0], got[1]
        return False if said else None


def _pairing_location(used: dict | None) -> dict | None:
    """Where the pairing of inputs and labels was broken, traced from where training used them.

    A statement that pairs the two halves after reordering only one of them (a ``zip`` of a
    shuffled features dataset with the labels) is that place.
    The labels' origin (a shuffle, shift or read that moved them is the usual fault), unless
    only the inputs' trace ends on a line that moves rows (``X = X[perm]`` alone); an origin
    that calls the user's helper which moves rows is located inside it.
    """
    from ..provenance import data_origin, one_side_moved, reorder_within, reorders_rows

    paired = one_side_moved(used)  # ``zip((features.shuffle(n), labels))``: the pairing itself
    if paired is not None:
        return paired
    labels, inputs = data_origin(used, "targets"), data_origin(used, "inputs")
    if reorders_rows(inputs) and not reorders_rows(labels):
        return inputs
    # (a helper that moves rows, ``X, y = shuffle_in_unison(X, y)``: the line inside it)
    if labels and "used_at" in labels and not reorders_rows(labels):
        return reorder_within(labels, last=True) or labels
    return labels


def _run_generalised(sig: dict | None) -> bool:
    """Whether the run itself predicted held-out rows clearly better than the prior.

    The run is a witness too: a model trained on misaligned labels cannot generalise to
    validation rows (its validation accuracy or loss stays at the prior's), so a validation
    score well beyond the prior's (an accuracy at its best and at its end) says the labels
    carry information, whatever fresh copies
    learn within the probe's budget (an embedding model needs more steps than it affords).
    """
    sig = sig or {}
    base, low = sig.get("constant_predictor_loss"), sig.get("val_loss_min")
    if isinstance(base, (int, float)) and isinstance(low, (int, float)) and base > 0 and \
            low <= GENERALISED * base:
        return True
    # at its best and at its end, by a run that fitted its own labels (training loss clearly
    # below the prior's): a model that learned nothing maps clusters of inputs to arbitrary
    # classes, and with 10 classes a few of them land right by chance (a CNN on shuffled
    # digits labels, its training loss at the prior's, read 0.05-0.26 on the test rows)
    best, end, prior = sig.get("val_acc_max"), sig.get("val_acc_final"), sig.get("majority_rate")
    fitted = sig.get("loss_floor_share")
    return all(isinstance(v, (int, float)) for v in (best, end, prior)) and \
        min(best, end) >= prior + GENERALISED_ACC and \
        (not isinstance(fitted, (int, float)) or fitted <= GENERALISED)


def _witness(ctx: ProbeContext, inputs, target, rng: np.random.Generator):
    """``(score on real labels, on shuffled ones, noise)`` of a k-NN, or None when it cannot say.

    A second, independent learner: when the copies of the user's model learn nothing from the
    real labels but nearest neighbours predict them from the inputs, the labels are aligned and
    the model is what fails (a stack it cannot train, an output it cannot move). Scores are
    accuracy for class labels, R^2 for a regression target. Several numeric inputs (a model
    taking a dict of named inputs) are read as one row of all their columns; each column is
    standardised, so a feature in the millions does not drown the others. Token ids are not
    read (distances between ids mean nothing). ``noise``: two standard errors of the
    difference of two accuracies at the shuffled score (0 for R^2).
    """
    raw = [np.asarray(a.detach().cpu().numpy() if hasattr(a, "detach") else a) for a in inputs]
    if any(np.issubdtype(a.dtype, np.integer) and a.ndim >= 2 for a in raw):
        return None  # token ids (and their masks): distances between ids mean nothing
    try:
        parts = [a.astype(np.float64) for a in raw]
        y = np.asarray(target.detach().cpu().numpy() if hasattr(target, "detach") else target)
        x = np.concatenate([p.reshape(len(p), -1) for p in parts], axis=1)
    except (TypeError, ValueError):
        return None
    if not np.isfinite(x).all():
        return None
    labels = st.as_labels(y, getattr(ctx.trainer.loss_fn, "__name__", None))
    classes = labels is not None
    if classes and (labels < 0).any():
        return None  # ignored positions (-100): not one class label per row
    try:
        y = labels if classes else y.astype(np.float64).reshape(len(y), -1)[:, 0]
    except (TypeError, ValueError):
        return None
    if not np.isfinite(y).all():
        return None
    shuffled = y[rng.permutation(len(y))]
    real, chance = st.knn_score(x, y, classes), st.knn_score(x, shuffled, classes)
    rows = min(len(y), 1536)  # (knn_score's cap)
    noise = 2 * math.sqrt(2 * max(chance * (1 - chance), 0.0) / rows) if classes else 0.0
    return real, chance, noise
