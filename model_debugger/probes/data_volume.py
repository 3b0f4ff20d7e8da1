"""``data_volume``: too few training samples for the model's capacity.

Two measurements. First, distinct rows: the kept training batches (input rows with their
targets) hold only a few distinct examples, each repeated many times (a sampling or indexing
step that repeats a handful of rows: the epoch looks large, the data is not); that is direct and
decisive, located where the inputs were made. Second, from the run: parameters per training
sample (samples per epoch counted by the loss) against the generalisation gap. Many parameters
per sample and a generalisation gap (a validation loss that rose from its minimum, or a
training accuracy far above the validation accuracy) mean the model memorises the training set.
Located where the number of training rows was set when a split or slice chose them
(``train_test_split(..., train_size=0.04)``, ``X[:200]``), else at the model.

Third, for a training set of at most :data:`FEW_ROWS` rows whose run ended far from learning it
(a loss settled at the prior's, or a generalisation gap), an experiment: a learning curve. Fresh
copies trained on every other fold and on a third of those rows, the same steps each, are compared
on the held-out fold; when the held-out loss still falls steeply from a third of the rows to all of
them, more rows are what the model lacks (the task is data-limited at this size), and neither a
longer run nor other settings would replace them.
"""

from __future__ import annotations

import time

import numpy as np

from ..provenance import ROWS, batches_origin, data_origin, fit_call_at, selects_rows
from ..thresholds import ACC_GAP, FEW_STEPS, FLOOR_SHARE, VAL_RISE
from . import _numpy_stats as st
from ._passes import cut_passes
from .base import Probe, ProbeContext, register

PARAMS_PER_SAMPLE = 10.0
DISTINCT_SHARE = 0.1  # distinct rows at most this share of the kept rows ...
MIN_ROWS = 256        # ... of at least this many rows
REPEAT_STEPS = 3      # the data came round within this many steps: the same rows every step
GAP_RATIO = 3.0       # a validation loss this many times the training loss at the end
FEW_ROWS = 100        # a training set this small is tested with a learning curve ...
CURVE_FOLDS = 4
CURVE_REPEATS = 3  # fold draws pooled (a few rows per fold: one draw is noisy) ...
MIN_REPEATS = 2    # ... at least this many within half the budget left
CURVE_STEPS = 150
CURVE_PART = 3     # the smaller copies train on a third of the rows
STEEP = 0.85          # ... all rows' held-out loss below this share of a third's
MIN_ALLOWANCE = 2.0   # seconds of budget the curve needs at least


@register
class DataVolume(Probe):
    """Parameters per training sample, against a validation loss that rises."""

    id = "data_volume"
    data_role = "inputs"
    traces_origin = False  # located by :func:`_rows_location` (the rows, not their values)
    categories = ("overfitting", "loss_not_decreasing", "healthy")  # (lnd: the learning curve)
    # healthy: only a handful of rows repeated, with
    # a gap (a regression has no accuracy gap to classify by, and its validation loss can
    # still be falling slowly, far above a training set it memorised)
    reveals = "overfitting"
    fix = ("Regularise the optimisation (weight decay, early stopping on the validation loss) or "
           "train on more data; a smaller model is an architecture change and needs an explicit "
           "override for a data cause.")

    def applies(self, ctx: ProbeContext) -> bool:
        """On a healthy-looking run only with kept training rows to count (its one check)."""
        healthy = ctx.classification is not None and ctx.classification.primary == "healthy"
        return super().applies(ctx) and (not healthy or ctx.train_xy is not None or
                                         bool(getattr(ctx.trainer, "inputs", None)))

    def run(self, ctx: ProbeContext):
        """One confirmed finding on a generalisation gap when parameters per sample are >= 10.

        Samples are the distinct rows when the training data came round within its first
        steps (the capture's ``rows_repeat``): the same batch fed at every step.

        Samples per epoch come from the record's ``targets`` event and the epochs observed; the
        parameter count from its ``model`` event (not for a stuck loss). Otherwise a small
        training set is tested with a learning curve (:func:`_learning_curve`).
        """
        primary = ctx.classification.primary if ctx.classification is not None else None
        healthy = primary == "healthy"
        # (inputs that repeat with other targets, a few categorical features, are other
        # examples: paired, unless the run overfits)
        repeated = _repeated_rows(ctx, paired=primary != "overfitting")
        if healthy:
            return [repeated] if repeated is not None and _memorised(ctx.signals) else []
        if repeated is not None:
            return [repeated]
        found = [] if primary == "loss_not_decreasing" else self._capacity(ctx)
        if not found:
            curve = _learning_curve(ctx)
            found = [] if curve is None else [curve]
        return found

    def _capacity(self, ctx: ProbeContext) -> list:
        """Parameters per training sample against a generalisation gap (the second measurement)."""
        model = ctx.run.first("model")
        targets = ctx.run.of("targets")
        sig = ctx.signals
        rose = sig.get("val_loss_rise", 0) >= VAL_RISE
        gap = sig.get("acc_gap", 0) >= ACC_GAP
        if not model or not targets or not (rose or gap):
            return []
        per_sample = max(1, targets[-1]["n"] // max(1, len(ctx.run.steps) and ctx.run.epochs))
        if ctx.trainer is not None and ctx.trainer.targets is not None \
                and ctx.trainer.targets.ndim > 1:
            per_sample = max(1, per_sample // int(np.prod(ctx.trainer.targets.shape[1:])))
        # the training data came round after a few rows: every step feeds those again (a loop
        # taking the first batch each time), whatever an "epoch" counts
        # (or within the first pass of a loop that leaves each pass early: the same rows)
        repeat, cut = ctx.run.first("rows_repeat") or {}, cut_passes(ctx)
        fed_again = isinstance(repeat.get("distinct"), int) and repeat["distinct"] > 0 and \
            repeat.get("step", REPEAT_STEPS) < (REPEAT_STEPS if cut is None else
                                                max(REPEAT_STEPS, cut["drawn"] + 1)) and \
            len(ctx.run.steps) >= 10 * max(repeat["step"], 1)
        if fed_again:
            per_sample = min(per_sample, repeat["distinct"])
        counted = _distinct_rows(ctx, paired=True) if ctx.run.epochs <= 1 else None
        if counted is not None and counted[1] <= counted[0] / 2 and not fed_again:
            # no epoch is visible (a hand-written loop) and the kept sample came round (each
            # row at least twice on average): the data holds that many rows
            per_sample = min(per_sample, counted[1])
        ratio = model["params"] / per_sample
        if ratio < PARAMS_PER_SAMPLE:
            return []
        shown = (f"validation loss rose {sig['val_loss_rise']:.0%} from its minimum while the "
                 "train loss kept falling" if rose else
                 f"training accuracy ends {sig['acc_gap']:.0%} above validation accuracy")
        if fed_again:
            where, split = (cut["exit"] or cut["loop"]) if cut else \
                batches_origin(st.data_location(ctx)), False
            said = (f"The training data came round after {repeat['distinct']:,} rows (at step "
                    f"{repeat['step']} of {len(ctx.run.steps)}): every step feeds the same rows "
                    "again, so the model trains on "
                    f"{repeat['distinct']:,} examples with {model['params']:,} parameters "
                    f"({ratio:,.0f} per example) and memorises them: {shown}. " + (
                        f"Each pass over the training data drew {cut['drawn']} of its "
                        f"{cut['batches']} batches: the batch loop is left here; let every pass "
                        "run to the end." if cut else
                        "The batches are made here: draw a new batch each step (iterate the "
                        "dataset once per epoch)."))
        else:
            where, split = _rows_location(ctx)
            said = (f"The model has {model['params']:,} parameters for about {per_sample:,} "
                    f"training samples per epoch ({ratio:,.0f} per sample). It can memorise "
                    f"the training set: {shown}. "
                    + ("The training rows were chosen here: more of the data for training, "
                       if split else "More data, ")
                    + "augmentation, a smaller model, weight decay or early stopping at the "
                    "validation minimum address it.")
        return [self.finding(
            "training_loop" if fed_again else "data", True, said,
            where, params=model["params"], samples_per_epoch=per_sample,
            params_per_sample=ratio, val_loss_rise=sig.get("val_loss_rise"),
            acc_gap=sig.get("acc_gap"), val_loss_min_index=sig.get("val_loss_min_index"),
            strength=0.7)]


def _learning_curve(ctx: ProbeContext):
    """A confirmed finding when a small training set is what holds the run back.

    Only for at most :data:`FEW_ROWS` training rows (kept, and per epoch when epochs are seen)
    whose run either settled at ``FLOOR_SHARE`` or more of the constant predictor's loss or ended
    with a generalisation gap. Over :data:`CURVE_FOLDS` folds, fresh copies (the user's optimizer
    and settings) train the same steps on all the other folds' rows and on a third of them;
    their best held-out losses, pooled, must fall below :data:`STEEP` from a third to all.
    """
    tr, sig = ctx.trainer, ctx.signals or {}
    # a loss settled high over the few steps that few rows make (a loss held up over many
    # steps is not what fewer rows do: they make the training loss lower), or a gap
    settled = sig.get("loss_floor_share", 0.0) >= FLOOR_SHARE and \
        0 < len(ctx.run.steps) < FEW_STEPS
    gap = sig.get("val_loss_rise", 0) >= VAL_RISE or sig.get("acc_gap", 0) >= ACC_GAP
    if tr is None or tr.n < 2 * CURVE_FOLDS or not (settled or gap):
        return None
    distinct = _distinct_index(tr)  # (the kept batches repeat each row once per epoch)
    if distinct is None or not 2 * CURVE_FOLDS <= len(distinct) <= FEW_ROWS:
        return None
    targets = ctx.run.of("targets")
    epochs = ctx.run.epochs if ctx.run.steps else 0
    per_row = int(np.prod(tr.targets.shape[1:])) if getattr(tr, "targets", None) is not None \
        and tr.targets.ndim > 1 else 1  # (the event counts target values)
    came_round = len(distinct) < tr.n  # the kept batches repeat rows: that is all the data
    if not came_round and targets and \
            targets[-1].get("n", 0) // max(epochs, 1) // per_row > FEW_ROWS:
        return None  # a sample of a larger training set
    n = len(distinct)
    folds = np.array_split(np.arange(n), CURVE_FOLDS)
    allowance = ctx.time_left() / 2  # the curve never takes all the budget of the probes after it
    if allowance < MIN_ALLOWANCE:
        return None
    fits = 2 * CURVE_FOLDS * CURVE_REPEATS
    steps = tr.steps_within(CURVE_STEPS, floor=40, seconds=min(1.0, allowance / fits))
    pooled = {"all": 0.0, "part": 0.0}
    started, done = time.monotonic(), 0
    for r in range(CURVE_REPEATS):  # each row held out once per repeat, folds drawn anew
        spent = time.monotonic() - started
        if r and spent / r > allowance - spent:
            break  # another draw would overrun the curve's share of the budget
        order = distinct[np.random.default_rng(r).permutation(n)]
        for k, fold in enumerate(folds):
            rest = np.concatenate([f for j, f in enumerate(folds) if j != k])
            held = tr.subset(order[fold])
            for name, rows in (("all", rest), ("part", rest[:max(len(rest) // CURVE_PART, 2)])):
                inputs, target = tr.subset(order[rows])
                seen: list[float] = []
                model = tr.fresh_model()
                tr.fit(model, inputs, target, steps, batch_size=min(64, len(rows)), seed=k,
                       check=lambda m, held=held, seen=seen: seen.append(tr.evaluate(m, *held)),
                       every=max(steps // 8, 1))
                best = min((v for v in seen if np.isfinite(v)), default=float("inf"))
                pooled[name] += best * len(fold) / n
            if not r and (time.monotonic() - started) / (k + 1) * MIN_REPEATS * CURVE_FOLDS \
                    > allowance:
                return None  # a slow model: the draws a verdict needs do not fit
        done += 1
    if done < MIN_REPEATS:
        return None  # one draw of a few rows per fold is too noisy for a verdict
    full, part = pooled["all"] / done, pooled["part"] / done
    if not (np.isfinite(full) and np.isfinite(part)) or not full < STEEP * part:
        return None
    where, split = _rows_location(ctx)
    return DataVolume().finding(
        "data", True,
        f"The model trains on {n} rows. Fresh copies trained the same {steps} steps reach a "
        f"held-out loss of {full:.4g} on all of them and {part:.4g} on a third (every row held out "
        f"once over {CURVE_FOLDS} folds, {done} draws): the loss still falls steeply with more rows, so the "
        "task needs more data than this; more epochs or other settings cannot replace it. "
        + ("The training rows were chosen here: use more of the data for training."
           if split else "Collect more rows, or augment them."),
        where, rows=n, heldout_all_rows=full, heldout_third_rows=part, curve_steps=steps,
        folds=CURVE_FOLDS, repeats=done, loss_floor_share=sig.get("loss_floor_share"), strength=0.7,
        decisive=True)


def _distinct_index(tr) -> np.ndarray | None:
    """Positions of the first copy of each distinct kept row (inputs with their target).

    Read one row at a time (a sample of images as one float64 array would be gigabytes), and
    given up past ``FEW_ROWS`` distinct rows: None then, as when the rows cannot be read.
    """
    seen: dict[bytes, int] = {}
    try:
        for i in range(tr.n):
            inputs, target = tr.subset(np.arange(i, i + 1))
            key = b"".join((np.asarray(x.detach().cpu().float().numpy() if hasattr(x, "detach")
                                       else x, dtype=np.float64) + 0.0).tobytes()
                           for x in (*inputs, target))
            if key not in seen:
                seen[key] = i
                if len(seen) > FEW_ROWS:
                    return None
    except (TypeError, ValueError, AttributeError, RuntimeError):
        return None
    return np.array(sorted(seen.values()), dtype=np.int64)


def _rows_location(ctx: ProbeContext) -> tuple[dict | None, bool]:
    """Where the number of training rows was set: ``(location, chosen by a split)``.

    The training inputs traced back from their use for their rows (a scaling is seen through);
    when that ends at a split or slice, it chose how few rows there are. Otherwise the data is
    what it is and the model's capacity is what to change: the model's line.
    """
    origin = data_origin(st.data_location(ctx), ROWS)
    # (the use line itself when it is a ``fit(X[:24], y[:24])``; a loss on ``out[:-1]`` is not)
    if origin and selects_rows(origin) and (origin.get("used_at") is not None or
                                            fit_call_at(origin)):
        return origin, True
    return ctx.ref("model"), False


def _memorised(sig: dict) -> bool:
    """Whether the run ended fitting its training set far better than its validation set.

    The validation loss at least ``GAP_RATIO`` times the training loss at the end, with a
    positive gap; or a training accuracy ``ACC_GAP`` above the validation accuracy.
    """
    val, train = sig.get("val_loss_final"), sig.get("train_loss_final")
    if isinstance(val, float) and isinstance(train, float) and train >= 0 and \
            sig.get("gap_final", 0.0) > 0 and val >= GAP_RATIO * train:
        return True
    return sig.get("acc_gap", 0.0) >= ACC_GAP


def _distinct_rows(ctx: ProbeContext, paired: bool = False) -> tuple[int, int] | None:
    """``(kept rows, distinct rows)`` of the kept training sample, or None without one.

    With ``paired``, a row is its inputs with its target: inputs that repeat with other targets
    (a few categorical features, noisy labels) are not the same example.
    """
    from .constant_inputs import _inputs

    x = _inputs(ctx)
    if x is None or not len(x):
        return None
    rows = np.asarray(x).reshape(len(x), -1)
    y = getattr(ctx.trainer, "targets", None) if getattr(ctx.trainer, "inputs", None) else \
        (ctx.train_xy[1] if ctx.train_xy is not None else None)  # the inputs' own targets
    ys = None
    if paired:
        if y is None or len(y) != len(rows):
            return None
        y = y.detach().cpu().float().numpy() if hasattr(y, "detach") else np.asarray(y)
        ys = np.asarray(y, dtype=np.float64).reshape(len(rows), -1) + 0.0
    # one row at a time (a batch of images as float64 at once would be gigabytes); + 0.0
    # makes -0.0 and 0.0 the same bytes
    seen = {(rows[i].astype(np.float64) + 0.0).tobytes()
            + (b"" if ys is None else ys[i].tobytes()) for i in range(len(rows))}
    return len(rows), len(seen)


def _repeated_rows(ctx: ProbeContext, paired: bool = False):
    """A confirmed finding when the kept training rows are a few distinct rows repeated."""
    counted = _distinct_rows(ctx, paired)
    if counted is None or counted[0] < MIN_ROWS:
        return None
    kept, distinct = counted
    if distinct > DISTINCT_SHARE * kept or distinct < 2:  # one row: constant_inputs
        return None
    probe = DataVolume()
    said = (f"The {kept} kept training rows hold only {distinct} distinct examples, each "
            f"seen about {kept / distinct:.0f} times: the model learns from {distinct} "
            "examples, whatever the length of an epoch, and memorises them")
    cut = cut_passes(ctx)
    if cut is not None:  # the loop takes the loader's first batches and leaves
        return probe.finding(
            "training_loop", True,
            f"{said}. Each pass over the training loader drew {cut['drawn']} of its "
            f"{cut['batches']} batches: the batch loop is left early, so every epoch trains on "
            "the same first rows. Let every pass run to the loader's end.",
            cut["exit"] or cut["loop"], strength=0.85, decisive=True, rows=kept,
            distinct_rows=distinct, batches_per_pass=cut["batches"],
            drawn_per_pass=cut["drawn"])
    where, chosen = _rows_location(ctx)  # a slice or split chose that few: there
    return probe.finding(
        "data", True, f"{said}" + (
            ". The training rows were chosen here: train on more of the data." if chosen
            else " (a sampling or indexing step repeats a handful of rows)."),
        where if chosen else data_origin(st.data_location(ctx), probe.data_role),
        strength=0.85, decisive=True,
        rows=kept, distinct_rows=distinct)
