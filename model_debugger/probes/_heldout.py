"""Held-out loss of a fresh copy trained on the kept sample: the A/B experiment several probes run.

A probe that suspects a setting (the rate, frozen layers, dropout) trains two fresh copies from
the initial weights on the same 70% of the sample, one as the user set it up and one with the
suspected setting undone, and compares their loss on the other 30%: an experiment on copies,
never on the user's model.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .base import Probe, ProbeContext

ROWS = 2048  # rows of the kept sample used (at most: the steps, not the rows, cost time)
SPLIT = 0.7
COPY_STEPS = 100  # training steps of each copy (heldout_loss's default)
LONGER = 4  # an inconclusive comparison is trained again this many times as long
BETTER = 0.8  # the changed copy's held-out loss below this share of the other's: confirmed


def heldout_loss(tr, ctx, lr: float | None = None, change: Callable | None = None,
                 steps: int = COPY_STEPS, seconds: float = 2.0, best: bool = False,
                 judge=None) -> float:
    """Held-out loss of a fresh copy (``change(copy)`` applied first) trained at ``lr``.

    Parameters
    ----------
    tr : Trainer
        The framework trainer over the kept sample.
    ctx : ProbeContext
        For the time left (the probe budget).
    lr : float, optional
        Learning rate (default: the user's).
    change : callable, optional
        ``change(model) -> model`` applied to the fresh copy before training.
    steps : int
        Training steps at most (fewer on a large model, see ``steps_within``).
    seconds : float
        Time the training may take at most (shortened when the budget runs low).
    best : bool
        The lowest held-out loss seen during training (read every eighth of it), not the
        last: what the copy could reach, stopped early, so a copy that overfits the small
        sample late is judged on what it learned first.
    judge : Trainer, optional
        The trainer whose loss measures the held-out rows (default ``tr``): copies trained on
        differently weighted losses are judged on one plain loss.

    Returns
    -------
    float
        The mean loss on the held-out rows; ``inf`` when training went non-finite.
    """
    n = min(tr.n, ROWS)
    idx = tr.randperm(tr.n, 1)[:n]
    inputs, target = tr.subset(idx)
    cut = int(SPLIT * n)
    steps = tr.steps_within(steps, seconds=min(seconds, ctx.time_left() / 10))
    model = tr.fresh_model()
    if change is not None:
        model = change(model)
    held = tuple(x[cut:] for x in inputs), target[cut:]
    seen: list[float] = []
    judge = judge or tr

    def check(m):
        seen.append(judge.evaluate(m, *held))

    losses = tr.fit(model, tuple(x[:cut] for x in inputs), target[:cut], steps, lr=lr, seed=0,
                    check=check if best else None, every=max(steps // 8, 1))
    value = judge.evaluate(model, *held)
    if best and losses and math.isfinite(losses[-1]):
        value = min([value, *seen])
    return value if math.isfinite(value) else float("inf")


def prior_loss(tr) -> float | None:
    """The constant predictor's loss on the rows :func:`heldout_loss` holds out.

    A copy whose held-out loss only reaches this learned nothing about the inputs, whatever it
    beats: an experiment that "resolves" a loss stuck at the prior must get clearly below it.
    None when the loss has no known constant baseline.
    """
    from .label_alignment import constant_loss

    kwargs = getattr(tr, "loss_kwargs", None) or {}
    smoothing = kwargs.get("label_smoothing")  # (nn.CrossEntropyLoss passes its 0.0)
    if kwargs.get("reduction", "mean") != "mean" or \
            any(kwargs.get(k) is not None for k in ("weight", "pos_weight")) or \
            smoothing not in (None, 0, 0.0):
        return None  # the held-out loss is on another scale than a plain mean's
    n = min(tr.n, ROWS)
    _, target = tr.subset(tr.randperm(tr.n, 1)[:n])
    try:
        return constant_loss(getattr(tr.loss_fn, "__name__", ""), target[int(SPLIT * n):],
                             tr.loss_kwargs.get("ignore_index", -100), tr.loss_kwargs)
    except (TypeError, ValueError, AttributeError):
        return None


def heldout_variants(ctx, variants, seed: int, steps: int = 150,
                     seconds: float = 3.0) -> tuple[list[tuple[float, object]], int]:
    """Held-out losses of fresh copies, one per variant of the same rows of the kept sample.

    Parameters
    ----------
    ctx : ProbeContext
        Its trainer and the time left.
    variants : list of callables
        ``variant(inputs, target, cut) -> (inputs, target)``: the data a copy trains on (rows
        ``[:cut]``) and is evaluated on (``[cut:]``), e.g. standardised with the training rows'
        statistics.
    seed : int
        Which rows of the sample (a seeded permutation).

    Returns
    -------
    list of (float, target), int
        Per variant the held-out loss (``inf`` when training went non-finite) and the target it
        used; the cut.
    """
    tr = ctx.trainer
    n = min(tr.n, ROWS)
    inputs, target = tr.subset(tr.randperm(tr.n, seed)[:n])
    cut = int(SPLIT * n)
    steps = tr.steps_within(steps, seconds=min(seconds, ctx.time_left() / 6))
    out = []
    for variant in variants:
        xs, t = variant(inputs, target, cut)
        model = tr.fresh_model()
        tr.fit(model, tuple(x[:cut] for x in xs), t[:cut], steps, seed=0)
        held = tr.evaluate(model, tuple(x[cut:] for x in xs), t[cut:])
        out.append((held if math.isfinite(held) else float("inf"), t))
    return out, cut


def as_is(inputs, target, cut):
    """The variant that changes nothing (for :func:`heldout_variants`)."""
    return inputs, target


def source_line(ctx, pattern, near: dict | None = None, run_start: bool = False) -> dict | None:
    """A line of the user's sources matching ``pattern`` (a compiled regex), or None.

    With ``near`` (a location, e.g. where the model was built), the match in that file closest
    to it; else the first match. With ``run_start``, the first of the consecutive matching lines
    around it (layers built one per line, each with the same setting: the first one).
    """
    hits = [{"file": path, "line": i}
            for path, text in (ctx.source_files or {}).items()
            for i, line in enumerate(text.splitlines(), 1)
            if pattern.search(line) and not line.lstrip().startswith("#")]
    if near and isinstance(near.get("line"), int):
        same = [h for h in hits if h["file"] == near.get("file")]
        if same:
            best = min(same, key=lambda h: abs(h["line"] - near["line"]))
            lines = {h["line"] for h in same}
            while run_start and best["line"] - 1 in lines:
                best = {**best, "line": best["line"] - 1}
            return best
    return hits[0] if hits else None


class SettingExperiment(Probe):
    """A probe that suspects one setting of the live model and tests it on two fresh copies.

    Subclasses measure the setting, then call :meth:`compare` with the change that undoes it.
    """

    categories = ("loss_not_decreasing", "convergence_to_wrong_solution")
    needs_live = True

    def applies(self, ctx: ProbeContext) -> bool:
        """With a trainer over the kept sample."""
        return super().applies(ctx) and ctx.trainer is not None and ctx.trainer.n >= 16

    @staticmethod
    def compare(ctx: ProbeContext, change: Callable) -> tuple[float, float, bool]:
        """``(held-out loss as set up, with the change, whether the change is clearly better)``.

        Each copy is judged on the best held-out loss it reached. When the change helps but not
        clearly, or does not help while the run itself trained longer than the copies did,
        both train again four times as long (a hard task shows what holds it up only once both
        have learned something: a model without its activations keeps up with one that has
        them over the first hundred steps of a nearly linear regression): widened, not flipped.
        """
        tr = ctx.trainer
        as_set = heldout_loss(tr, ctx, best=True)
        changed = heldout_loss(tr, ctx, change=change, best=True)
        longer_run = (ctx.signals or {}).get("steps", 0) > COPY_STEPS
        if BETTER * as_set <= changed and (changed < as_set or (
                longer_run and math.isfinite(as_set) and changed < as_set / BETTER)):
            # (a change far worse, or copies that went non-finite, are not trained again)
            longer = {"steps": LONGER * COPY_STEPS, "seconds": LONGER * 2.0, "best": True}
            as_set = heldout_loss(tr, ctx, **longer)
            changed = heldout_loss(tr, ctx, change=change, **longer)
        return as_set, changed, changed < BETTER * as_set
