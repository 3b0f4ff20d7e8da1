"""Probe ``minority_ignored``: an imbalanced classifier that learned to skip the rare class.

The accuracy paradox: with 98% of one class, always predicting it scores 98%, so a run whose
accuracy looks fine (even classified ``healthy``) may never find the class that matters. The
probe reads the trained model's predictions on the kept validation rows (else the training
rows) per class, and when the rarest class is mostly missed, tests the cause by experiment:
pairs of fresh copies trained from the initial weights on the same rows, one on the sample as
it is and one on a class-balanced resample of it (each class drawn equally often), then
compared on held-out rows by balanced accuracy (the mean recall over classes). Confirmed when,
on every seed, the plain copy misses the rare class as the user's model did and the balanced
copy's balanced accuracy is clearly higher: the imbalance, left unweighted (or weighted in a
way that does not balance it: the model still skips the class), is the cause. On a
``healthy`` run it re-classifies the run ``convergence_to_wrong_solution``
(:attr:`~model_debugger.probes.base.Probe.reveals`).
"""

from __future__ import annotations

import numpy as np

from ..provenance import callee_made
from . import _numpy_stats as st
from ._heldout import ROWS, SPLIT
from .base import Probe, ProbeContext, register, setting_location
from .class_imbalance import MAJORITY, RARE

MISSED = 0.5  # the rarest class's recall below this: the model mostly skips it
GAIN = 0.1  # balanced accuracy a class-balanced copy gains over the plain one, on every seed
MIN_RARE = 8  # rows of the rarest class needed among the rows a recall is read on
SEEDS = (0, 1)
_THRESHOLD = {"binary_cross_entropy": 0.5, "binary_cross_entropy_with_logits": 0.0}
_CLASSES = ("cross_entropy", "nll_loss")


def predicted_labels(out, loss: str | None) -> np.ndarray | None:
    """Class labels from a model's outputs under ``loss`` (None: not a single-label output).

    A binary loss thresholds a one-column output (0.5 on probabilities, 0 on logits); a
    multi-class loss takes the arg-max over the class axis (axis 1).
    """
    out = np.asarray(out, dtype=np.float64)
    if out.ndim == 0 or not len(out):
        return None
    if loss in _THRESHOLD:
        flat = out.reshape(len(out), -1)
        return (flat[:, 0] > _THRESHOLD[loss]).astype(np.int64) if flat.shape[1] == 1 else None
    if loss in _CLASSES and out.ndim == 2 and out.shape[1] > 1:
        return out.argmax(axis=1)
    return None


def recalls(labels: np.ndarray, predicted: np.ndarray) -> dict[int, float]:
    """Recall of each class present in ``labels``."""
    return {int(c): float((predicted[labels == c] == c).mean()) for c in np.unique(labels)}


def _numpy(a) -> np.ndarray:
    return a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)


def _labels(target, loss: str | None) -> np.ndarray | None:
    """Class labels of ``target`` rows, -1 for rows in no class.

    A cross-entropy ignores negative ids (``ignore_index=-100``): they count in no class.
    """
    labels = st.as_labels(_numpy(target), loss)
    if labels is None:
        return None
    return np.where(labels < 0, -1, labels)


@register
class MinorityIgnored(Probe):
    """The rarest class mostly missed, and a class-balanced copy finds it: the imbalance."""

    id = "minority_ignored"
    cost = 2
    categories = ("healthy", "convergence_to_wrong_solution")
    reveals = "convergence_to_wrong_solution"
    needs_live = True
    frameworks = ("torch", "keras")
    traces_origin = False  # the fix goes where the loss is weighted (or the rows sampled)
    fix = ("Weight the loss by inverse class frequency (Keras: fit(class_weight=...); PyTorch: "
           "CrossEntropyLoss(weight=...) / BCEWithLogitsLoss(pos_weight=...)) or sample the "
           "classes evenly (WeightedRandomSampler), and judge with recall, F1 or balanced "
           "accuracy rather than plain accuracy.")

    def applies(self, ctx: ProbeContext) -> bool:
        """With a trainer over a kept sample under a single-label classification loss."""
        tr = ctx.trainer
        return super().applies(ctx) and tr is not None and tr.n >= 64 and \
            (st.loss_name(ctx) in _THRESHOLD or st.loss_name(ctx) in _CLASSES)

    def run(self, ctx: ProbeContext):
        """One finding when the user's model misses the rarest class of an imbalanced sample."""
        tr, loss = ctx.trainer, st.loss_name(ctx)
        weighted = bool(ctx.signals.get("loss_weighted"))  # weights given that do not balance
        labels = _labels(tr.targets, loss)
        if labels is None:
            return []
        classes, counts = np.unique(labels[labels >= 0], return_counts=True)
        if len(classes) < 2:
            return []
        shares = counts / counts.sum()
        if shares.max() < MAJORITY and shares.min() > RARE:
            return []
        rare = int(classes[int(np.argmin(counts))])
        read = None
        for split, inputs, target in (("validation", tr.val_inputs, tr.val_targets),
                                      ("training", tr.inputs, tr.targets)):
            truth = _labels(target, loss) if target is not None else None
            if truth is not None and int((truth == rare).sum()) >= MIN_RARE:
                read = split, inputs, truth
                break
        if read is None:
            return []
        split, inputs, truth = read
        seen = predicted_labels(tr.predict(tr.model, inputs), loss)
        if seen is None or len(seen) != len(truth):
            return []
        mine = recalls(truth[truth >= 0], seen[truth >= 0])
        if mine.get(rare, 1.0) >= MISSED:
            return []
        trials = []
        for seed in SEEDS:
            if ctx.time_left() < 2.0:
                break
            pair = self._pair(ctx, seed)
            if pair is None:
                break
            trials.append(pair)
        confirmed = len(trials) == len(SEEDS) and all(
            plain["recall"] < MISSED and balanced["balanced"] - plain["balanced"] >= GAIN
            for plain, balanced in trials)
        share = float(shares[list(classes).index(rare)])
        user = float(np.mean(list(mine.values())))
        text = (f"The model misses the rare class: class {rare} ({share:.1%} of the training "
                f"targets) is found in {mine[rare]:.0%} of its {split} rows (balanced accuracy "
                f"{user:.2f}), while plain accuracy rewards predicting the frequent class.")
        if trials:
            plain = np.mean([p["balanced"] for p, _ in trials])
            balanced = np.mean([b["balanced"] for _, b in trials])
            text += (f" Fresh copies trained on the same rows reach a held-out balanced "
                     f"accuracy of {plain:.2f} as the data is and {balanced:.2f} on a "
                     f"class-balanced resample ({len(trials)} seeds)")
            text += ((": the class weights given do not make the model find it, a balanced "
                      "sample does; check them (each class weighted by its inverse "
                      "frequency)." if weighted else
                      ": the unweighted imbalance is the cause; weight the loss or resample.")
                     if confirmed else
                     f": the experiment was cut short ({len(trials)} of {len(SEEDS)} seeds)."
                     if len(trials) < len(SEEDS) else
                     ": balancing does not clearly help, so the imbalance alone does not "
                     "explain it.")
        fit = ctx.ref("fit")
        location = (setting_location(fit, "class_weight") if weighted and fit else fit) or \
            callee_made(ctx.ref("loss_fn")) or st.data_location(ctx)
        return [self.finding(  # under weights: the experiment did not test the user's own
            "data", confirmed, text, location, strength=0.8 if confirmed else 0.2,
            decisive=confirmed and not weighted, weighted=weighted, rare_class=rare, rare_share=share, split=split,
            recall=mine, balanced_accuracy=user,
            trials=[{"plain": p, "balanced": b} for p, b in trials])]

    @staticmethod
    def _pair(ctx: ProbeContext, seed: int) -> tuple[dict, dict] | None:
        """A plain and a class-balanced fresh copy on the same rows: their held-out scores."""
        tr, loss = ctx.trainer, st.loss_name(ctx)
        n = min(tr.n, ROWS)
        idx = _numpy(tr.randperm(tr.n, seed))[:n]
        labels = _labels(tr.targets, loss)[idx]
        cut = int(SPLIT * n)
        rng = np.random.default_rng(seed)
        fit_rows, held_rows = idx[:cut], idx[cut:]
        fit_labels = labels[:cut]
        classes = np.unique(fit_labels[fit_labels >= 0])
        if len(classes) < 2:
            return None
        each = max(cut // len(classes), 1)  # as many rows as the plain copy, each class equally
        balanced_rows = rng.permutation(np.concatenate([
            rng.choice(fit_rows[fit_labels == c], each, replace=True) for c in classes]))
        held_inputs, held_target = tr.subset(held_rows)
        truth = _labels(held_target, loss)
        rare = int(classes[int(np.argmin([(fit_labels == c).sum() for c in classes]))])
        if truth is None or int((truth == rare).sum()) < 2:
            return None
        steps = tr.steps_within(200, seconds=min(3.0, ctx.time_left() / 8))
        scores = []
        for rows in (fit_rows, balanced_rows):
            model = tr.fresh_model()
            tr.fit(model, *tr.subset(rows), steps, seed=seed)
            got = predicted_labels(tr.predict(model, held_inputs), loss)
            if got is None:
                return None
            r = recalls(truth[truth >= 0], got[truth >= 0])
            scores.append({"recall": r.get(rare, 0.0), "balanced": float(np.mean(list(
                r.values())))})
        return scores[0], scores[1]
