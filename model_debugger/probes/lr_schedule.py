"""``lr_schedule``: a schedule that stops training early, or raises the rate into divergence.

Measured from the record (the ``lr`` events: the first parameter group's rate over the run).
A decay: the rate fell below 1% of its peak for at least half of the steps. Then tested by
experiment: two fresh copies trained on the same rows, one at the rate the schedule held for
most of the run (its median over the steps) and one at the schedule's peak; the finding is
confirmed when the copy at the peak reaches a clearly lower held-out loss (the decay, not the
model or the data, holds the loss up). A rise: on an unstable run, the schedule had lifted the
rate to at least ``RAISED`` times the optimizer's own rate when the first non-finite value
appeared (or at its peak); confirmed when a copy at the optimizer's rate trains where one at
the raised rate diverges or ends clearly worse (a warm-up that climbs to the optimizer's rate
is no rise). A warm-up that never reached the optimizer's own rate (in Keras, the number it
was built with): a copy at that rate against one at the run's median; located where the rate is
written when the rate fell back to its start every epoch. PyTorch schedules, and a Keras
optimizer's ``learning_rate`` (a schedule, a callback or a loop that writes it).
"""

from __future__ import annotations

import numpy as np

from ..thresholds import LR_STALLED
from ._heldout import BETTER, heldout_loss
from .base import Probe, ProbeContext, register

COLLAPSED = LR_STALLED  # share of the run's steps spent below 1% of the peak rate
RAISED = 3.0  # the rate the schedule reached, over the optimizer's own, on an unstable run
OWN_PEAK = ("OneCycleLR", "CyclicLR")  # schedules that set their own peak, not the optimizer's


def rate_per_step(events: list[dict], steps: int) -> np.ndarray:
    """The first group's learning rate at every step, from the ``lr`` events."""
    out = np.full(steps, np.nan)
    for e in sorted(events, key=lambda e: e["step"]):
        if 0 <= e["step"] < steps:
            out[e["step"]:] = e["lr"]
    return out


@register
class LrSchedule(Probe):
    """The rate below 1% of its peak for most of the run, and a copy at the peak learns better."""

    id = "lr_schedule"
    cost = 2
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution",
                  "gradient_instability")
    needs_live = True
    frameworks = ("torch", "keras")
    suggested_by = ("lr_collapsed_share",)
    fix = ("Slow the schedule down (a larger step_size, a gamma closer to 1, a decay over the "
           "whole run), or step it per epoch rather than per batch; a warm-up should end at "
           "the optimizer's rate, not keep raising it, and be shorter than the run.")

    def applies(self, ctx: ProbeContext) -> bool:
        """With a trainer and a rate collapsed for most of the run, or raised far up.

        Raised: far above the optimizer's own on an unstable run (:func:`_raised`).
        """
        return super().applies(ctx) and ctx.trainer is not None and ctx.trainer.n >= 16 and (
            ctx.signals.get("lr_collapsed_share", 0.0) >= COLLAPSED or
            _raised(ctx) is not None or _starved(ctx) is not None)

    def run(self, ctx: ProbeContext):
        """One finding; confirmed when a copy at the rate the schedule missed is clearly better.

        A decay: the copy at the peak rate against the median's; a rise: the copy at the
        optimizer's rate against the raised one's.
        """
        raised = _raised(ctx)
        if raised is not None and ctx.signals.get("lr_collapsed_share", 0.0) < COLLAPSED:
            return self._rise(ctx, *raised)
        starved = _starved(ctx)
        if starved is not None and ctx.signals.get("lr_collapsed_share", 0.0) < COLLAPSED:
            return self._starve(ctx, *starved)
        steps = len(ctx.run.steps)
        rates = rate_per_step(ctx.run.of("lr"), steps)
        rates = rates[np.isfinite(rates)]
        peak = ctx.signals.get("lr_peak")
        if not len(rates) or not peak:
            return []
        typical = float(np.median(rates))
        share = ctx.signals["lr_collapsed_share"]
        held = heldout_loss(ctx.trainer, ctx, lr=typical, best=True)
        at_peak = heldout_loss(ctx.trainer, ctx, lr=peak, best=True)
        confirmed = at_peak < BETTER * held
        per_batch = _per_batch(ctx)  # the loop steps it too often, not its settings
        return [self.finding(
            "training_loop" if per_batch else "hyperparameter", confirmed,
            f"The learning rate fell below 1% of its peak ({peak:.3g}) for {share:.0%} of the "
            f"run's {steps} steps (median {typical:.3g}). Two fresh copies trained on the same "
            f"rows reach a held-out loss of {at_peak:.4g} at the peak rate and {held:.4g} at the "
            "median one"
            + (": the schedule's decay holds the loss up." if confirmed else
               ": no clearly better, so the decay is not what holds the loss up.")
            + (f" Its {_scheduler_cls(ctx)}, sized in epochs, is stepped "
               "after every batch (here): step it once per epoch." if per_batch else ""),
            per_batch or _decay_origin(ctx.ref("scheduler")) or
            rate_written(ctx.source_files, ctx.ref("optimizer")) or ctx.ref("optimizer"), undone=confirmed,
            strength=0.8 if confirmed else 0.15, lr_peak=peak, lr_median=typical,
            lr_collapsed_share=share, heldout_median_lr=held, heldout_peak_lr=at_peak)]


    def _rise(self, ctx: ProbeContext, base: float, reached: float, step: int):
        own = heldout_loss(ctx.trainer, ctx, lr=base, best=True)
        high = heldout_loss(ctx.trainer, ctx, lr=reached, best=True)
        confirmed = own < float("inf") and (high == float("inf") or own < BETTER * high)
        return [self.finding(
            "hyperparameter", confirmed,
            f"The schedule raised the learning rate to {reached:.3g} by step {step}, "
            f"{reached / base:.3g}x the optimizer's own rate {base:.3g}, where the run became "
            f"unstable. Two fresh copies trained on the same rows reach a held-out loss of "
            f"{own:.4g} at the optimizer's rate and {high:.4g} at the raised one"
            + (": the schedule's rise, not the base rate, drove it unstable." if confirmed else
               ": not clearly worse, so the rise is not what made it unstable."),
            _decay_origin(ctx.ref("scheduler")) or rate_written(ctx.source_files, ctx.ref("optimizer")) or
            ctx.ref("optimizer"), undone=confirmed, strength=0.85 if confirmed else 0.15,
            lr_base=base, lr_reached=reached, at_step=step, heldout_base_lr=own,
            heldout_reached_lr=high)]

    def _starve(self, ctx: ProbeContext, base: float, typical: float, share: float):
        """Copies at the optimizer's rate and at the run's median (a warm-up never ended)."""
        steps = len(ctx.run.steps)
        held = heldout_loss(ctx.trainer, ctx, lr=typical, best=True)
        own = heldout_loss(ctx.trainer, ctx, lr=base, best=True)
        confirmed = own < BETTER * held
        again = restarts(rate_per_step(ctx.run.of("lr"), steps))  # (where the rate is written
        # then: the step it is computed from starts again, not the warm-up's length)
        return [self.finding(
            "hyperparameter", confirmed,
            f"The schedule kept the learning rate below {STARVED:.0%} of the optimizer's own "
            f"rate {base:.3g} for {share:.0%} of the run's {steps} steps (median {typical:.3g}): "
            f"a warm-up longer than the run, or a schedule sized for far more steps. Two fresh "
            f"copies trained on the same rows reach a held-out loss of {own:.4g} at the "
            f"optimizer's rate and {held:.4g} at the median one"
            + (": the schedule never lets the model train." if confirmed else
               ": no clearly better, so the schedule is not what holds the loss up.")
            + (f" The rate fell back to its start {again} times: the schedule starts again "
               "(computed from the batch's index within the epoch, or built again every "
               "epoch), not from the global step." if again >= 2 else ""),
            (rate_written(ctx.source_files, ctx.ref("optimizer"))
             if again >= 2 and ctx.ref("scheduler") is None else None) or _warmup_origin(ctx) or
            _decay_origin(ctx.ref("scheduler")) or rate_written(ctx.source_files, ctx.ref("optimizer")) or
            ctx.ref("optimizer"), undone=confirmed, strength=0.8 if confirmed else 0.15,
            lr_base=base, lr_median=typical, lr_starved_share=share, heldout_base_lr=own,
            heldout_median_lr=held, restarts=again)]


STARVED = 0.1  # a rate below this share of the optimizer's own ...


def _starved(ctx: ProbeContext) -> tuple[float, float, float] | None:
    """``(the optimizer's rate, the run's median rate, share of steps far below it)``.

    When the schedule rose towards the optimizer's own rate and never reached
    :data:`STARVED` of it, below it for at least :data:`COLLAPSED` of the steps (a warm-up of
    10000 steps in a run of 400); None otherwise: a decay from the optimizer's rate, a group
    given a lower rate of its own, schedules that set their own peak, a Keras optimizer built
    with a schedule (its rate is the schedule: no number of its own).
    """
    own = _own_rate(ctx)
    if own is None:
        return None
    base, rates = own
    rates = rates[np.isfinite(rates)]
    if not base > 0 or len(rates) < 2:
        return None
    if not rates.max() < STARVED * base or rates[-1] <= rates[0]:
        return None  # it reached the rate at some point, or never rose (a decay, a group's
        # own lower rate): not a warm-up that never ended
    share = float(np.mean(rates < STARVED * base))
    return (base, float(np.median(rates)), share) if share >= COLLAPSED else None


WARMUP_KEYWORDS = ("warmup_steps", "num_warmup_steps", "warmup_ratio", "warmup_epochs")


def _warmup_origin(ctx: ProbeContext) -> dict | None:
    """Where a warm-up's length was set, or None.

    A keyword of the scheduler (or of the trainer's arguments), traced to the line that set
    it; else a line of the code that writes one.
    """
    import re

    from ._heldout import source_line
    from .base import setting_location

    for near in (ctx.ref("scheduler"), ctx.ref("trainer")):
        for keyword in WARMUP_KEYWORDS:
            found = setting_location(near, keyword)
            if near is not None and found is not near:
                return found
    return source_line(ctx, re.compile(r"\bwarm_?up\w*[\"']?\s*(?:=(?!=)|:\s*[\d.])", re.I),
                       near=ctx.ref("scheduler") or ctx.ref("trainer") or ctx.ref("optimizer"))


def _scheduler_cls(ctx: ProbeContext) -> str | None:
    """The class of the first learning-rate scheduler the capture saw built."""
    return next((e.get("cls") for e in ctx.run.of("ref") if e.get("kind") == "scheduler"),
                None)


EPOCH_SIZED = ("StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR")


def _per_batch(ctx: ProbeContext) -> dict | None:
    """Where an epoch-sized scheduler is stepped per batch.

    Beside the optimizer step in the batch loop, or the ``"interval": "step"`` entry that
    hands it to Lightning.

    ``StepLR(step_size=8)`` meant 8 epochs; stepped after every batch it decays 8 batches in.
    Only when the same schedule stepped once per epoch would not have collapsed (a gamma of
    0.02 each step collapses either way: its setting is the cause). None for schedules written
    per step (``LambdaLR``, ``OneCycleLR``) or stepped per epoch.
    """
    from ..provenance import dict_setting, sibling_step
    from ..signals import LR_COLLAPSE

    if _scheduler_cls(ctx) not in EPOCH_SIZED:
        return None
    # a loop of the user's, or a trainer told to (Lightning's ``"interval": "step"``)
    where = sibling_step(ctx.ref("step")) or dict_setting(ctx.ref("scheduler"), "interval",
                                                          "step", beside="scheduler")
    steps, epochs = len(ctx.run.steps), ctx.run.epochs
    rates = rate_per_step(ctx.run.of("lr"), steps)
    if where is None or not 2 <= epochs < steps or not np.isfinite(rates[:epochs]).all():
        return None
    # stepped once per epoch, it would have held the rates it held at steps 0..epochs-1: when
    # those do not collapse, stepping per batch is what did
    per_epoch = rates[:epochs]
    collapsed = float(np.mean(per_epoch < LR_COLLAPSE * np.nanmax(rates)))
    return where if collapsed < COLLAPSED else None


def _own_rate(ctx: ProbeContext) -> tuple[float, np.ndarray] | None:
    """The optimizer's own rate and the first group's rate at every step, or None.

    A Keras optimizer's own rate is the number it was built with, when the loop wrote another
    before its first step (``optimizer.learning_rate.assign(...)``); None for other Keras
    optimizers (their rate is the schedule: no rate of their own), schedules that set their
    own peak, and a run without a trainer.
    """
    if _scheduler_cls(ctx) in OWN_PEAK or ctx.trainer is None:
        return None
    key = "lr" if ctx.framework == "torch" else "lr_built"
    try:
        base = float(ctx.trainer.hyper[key])
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    return base, rate_per_step(ctx.run.of("lr"), len(ctx.run.steps))


RESTART = 4.0  # a rate this many times its first that falls back to it restarts its schedule


def restarts(rates: np.ndarray) -> int:
    """How many times the rate, having risen ``RESTART``-fold over its first value, fell back.

    A warm-up indexed by the step within the epoch (``enumerate(batches)``) instead of the
    global step starts again every epoch: a saw-tooth that never reaches the rate it ramps to.
    """
    rates = rates[np.isfinite(rates) & (rates > 0)]
    if len(rates) < 3:
        return 0
    first, count, high = rates[0], 0, False
    for r in rates[1:]:
        if r >= RESTART * first:
            high = True
        elif high and r <= 1.5 * first:
            count, high = count + 1, False
    return count


def _raised(ctx: ProbeContext) -> tuple[float, float, int] | None:
    """``(the optimizer's rate, the rate reached, its step)`` of a schedule that raised it.

    When an unstable run's schedule lifted the rate ``RAISED`` times above the optimizer's
    own (at the first non-finite step, else at its peak); None otherwise.
    """
    unstable = ctx.classification is not None and "gradient_instability" in (
        ctx.classification.primary, *ctx.classification.secondary)
    own = _own_rate(ctx) if unstable else None
    if own is None:
        return None
    base, rates = own
    steps = len(rates)
    if not base or not steps or not np.isfinite(rates).any():
        return None
    bad = ctx.signals.get("first_nonfinite_step")
    step = int(bad) if isinstance(bad, int) and 0 <= bad < steps and np.isfinite(rates[bad]) \
        else int(np.nanargmax(rates))
    reached = float(rates[step])
    return (float(base), reached, step) if reached >= RAISED * base else None


DECAY_KEYWORDS = ("gamma", "decay_rate", "step_size", "milestones", "lr_lambda", "T_max")


def _decay_origin(location: dict | None) -> dict | None:
    """Where the scheduler's decay was set, else the scheduler's line.

    Its ``gamma=`` (or decay rate, step size, ...) traced to the line that set it: a config
    entry, an argparse default.
    """
    from .base import setting_location

    for keyword in DECAY_KEYWORDS:
        found = setting_location(location, keyword)
        if found is not location:
            return found
    return _schedule_function(location) or location


def _schedule_function(location: dict | None) -> dict | None:
    """The ``return`` of the file's function a scheduler at ``location`` was given.

    ``LambdaLR(opt, lr_lambda=warmup)`` (or positionally) with ``def warmup(step): return
    ...``: the schedule is computed there.
    """
    import ast

    from ..provenance import _statements_at, _tree_of

    tree = _tree_of(location)
    if tree is None:
        return None
    funcs = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}
    for stmt in _statements_at(tree, location["line"]):
        for call in (n for n in ast.walk(stmt) if isinstance(n, ast.Call)):
            name = call.func.attr if isinstance(call.func, ast.Attribute) else \
                getattr(call.func, "id", "")
            given = [k.value for k in call.keywords if k.arg in ("lr_lambda", "schedule")] + \
                list(call.args[:1] if name == "LearningRateScheduler" else call.args[1:2])
            for arg in given:
                if isinstance(arg, ast.Name) and arg.id in funcs:
                    ret = [r for r in ast.walk(funcs[arg.id]) if isinstance(r, ast.Return)]
                    line = max(r.lineno for r in ret) if ret else funcs[arg.id].lineno
                    return {"file": location["file"], "line": line}
    return None


def rate_written(sources: dict, near: dict | None = None) -> dict | None:
    """The user's line that writes the learning rate into the optimizer, when no scheduler does.

    ``g["lr"] = g["lr"] * warm`` over ``opt.param_groups``, a Keras callback's
    ``self.model.optimizer.learning_rate = lr * factor``, ``optimizer.learning_rate.assign(r)``
    or ``K.set_value(optimizer.lr, r)``: a schedule written by hand is set there, not where the
    optimizer was built. The optimizer is an object named ``optimizer`` (``self.optimizer``,
    ``model.optimizer``) or by the name it was given where it was built (``near``); a group is
    a subscript of ``param_groups`` or a loop variable over them (``stats["lr"] = ...`` and an
    argparse ``args.lr`` are not the optimizer). The first such write after ``near`` in its
    file, else the first of the code.
    """
    import ast

    owners = {"optimizer", "optimiser"}
    built = _assigned_name(sources, near)
    if built:
        owners.add(built)

    def rate(t, groups: set) -> bool:
        if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and \
                t.slice.value in ("lr", "learning_rate"):
            return isinstance(t.value, ast.Name) and t.value.id in groups or \
                "param_groups" in ast.unparse(t.value)
        return isinstance(t, ast.Attribute) and t.attr in ("lr", "learning_rate") and \
            ast.unparse(t.value).split(".")[-1] in owners

    def writes(node, groups: set) -> bool:
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            return any(rate(t, groups) for t in (node.targets if isinstance(node, ast.Assign)
                                                 else [node.target]))
        if not isinstance(node, ast.Call):
            return False
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "assign":
            return rate(func.value, groups)  # optimizer.learning_rate.assign(r)
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        return name == "set_value" and bool(node.args) and rate(node.args[0], groups)

    found = []
    for path, text in (sources or {}).items():
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        groups = {n.target.id for n in ast.walk(tree)  # ``for g in opt.param_groups:``
                  if isinstance(n, (ast.For, ast.comprehension)) and
                  isinstance(n.target, ast.Name) and "param_groups" in ast.unparse(n.iter)}
        found += [(path, n.lineno) for n in sorted(
            (n for n in ast.walk(tree) if writes(n, groups)), key=lambda n: n.lineno)]
    if near and isinstance(near.get("line"), int):
        after = [w for w in found if w[0] == near.get("file") and w[1] > near["line"]]
        found = after or found
    return {"file": found[0][0], "line": found[0][1]} if found else None


def _assigned_name(sources: dict, at: dict | None) -> str | None:
    """The name (or attribute) assigned on the line ``at`` (``opt = Adam(...)``: ``opt``)."""
    import ast

    text = (sources or {}).get((at or {}).get("file"))
    if not isinstance(text, str) or not isinstance(at.get("line"), int):
        return None
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and node.lineno == at["line"]:
            for t in node.targets:
                if isinstance(t, ast.Name):
                    return t.id
                if isinstance(t, ast.Attribute):
                    return t.attr
    return None
