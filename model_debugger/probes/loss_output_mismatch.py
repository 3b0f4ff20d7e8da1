"""``loss_output_mismatch``: the model's output is not what the loss expects.

e.g. probabilities (softmax) fed to ``CrossEntropyLoss``, which applies log-softmax itself and
expects logits: the gradient shrinks and training stalls.
"""

from __future__ import annotations

import re

from ..thresholds import MIN_STEPS
from ._lint import lint_hits, loc
from ._made import head_location, output_location
from .base import Probe, ProbeContext, register

# loss -> the kinds of input it must not receive (the capture's ``loss_input`` kinds)
_EXPECTS_LOGITS = {"cross_entropy": ("probabilities", "log_probabilities"),
                   "binary_cross_entropy_with_logits": ("unit_interval",),
                   "nll_loss": ("logits", "probabilities"),  # expects log-probabilities
                   "binary_cross_entropy": ("logits",),     # expects probabilities
                   "cross_entropy_on_probabilities": ("logits", "log_probabilities")}
_EXPECTED = {"cross_entropy": "raw scores (logits)", "nll_loss": "log-probabilities",
             "binary_cross_entropy_with_logits": "raw scores (logits)",
             "binary_cross_entropy": "probabilities",
             "cross_entropy_on_probabilities": "probabilities"}
ROWS = 256
# losses whose input must be able to go negative: raw scores, and regression on signed targets
_SIGNED = ("binary_cross_entropy_with_logits", "mse_loss", "l1_loss", "smooth_l1_loss",
           "huber_loss")
_SQUASH = re.compile(r"\b(relu|relu6|softplus|abs|clamp|clip|sigmoid|exp)\s*\(")
_PROBABILITIES = re.compile(r"\b(softmax|sigmoid|exp)\s*\(")  # (log_softmax is not one)


def output_kind(out) -> dict:
    """What a model output is: logits, probabilities, log-probabilities or values in [0, 1]."""
    import numpy as np

    x = np.asarray(out, dtype=np.float64).reshape(len(out), -1)
    lo, hi = float(x.min()), float(x.max())
    dev = None
    if x.shape[1] > 1:
        dev = float(np.abs(x.sum(1) - 1).max())
        if lo >= 0 and dev < 1e-3:
            return {"kind": "probabilities", "min": lo, "max": hi, "row_sum_dev": dev}
        m = x.max(1, keepdims=True)
        dev_log = float(np.abs(m[:, 0] + np.log(np.exp(x - m).sum(1))).max())
        if hi <= 0 and dev_log < 1e-3:
            return {"kind": "log_probabilities", "min": lo, "max": hi, "row_sum_dev": dev_log}
        kind = _single_kind(lo, hi)  # multi-label sigmoids
    else:
        kind = _single_kind(lo, hi)
    return {"kind": kind, "min": lo, "max": hi, "row_sum_dev": dev,
            "zero_share": float((x == 0).mean()),
            "pressed": {"1": float((x >= 0.98).mean()), "-1": float((x <= -0.98).mean()),
                        "0": float(((x >= 0) & (x <= 0.02)).mean())}}


def _single_kind(lo: float, hi: float) -> str:
    """The kind of a one-score output: ``unit_interval``, ``constant`` or ``logits``.

    ``unit_interval`` for outputs that vary inside [0, 1]; ``constant`` for one value (a dead or
    collapsed model says nothing about an output activation).
    """
    if hi - lo <= 1e-6 * max(1.0, abs(hi)):
        return "constant"
    return "unit_interval" if lo >= 0 and hi <= 1 else "logits"


def _keras_seen(ctx: ProbeContext) -> dict:
    """The Keras model's output on kept rows, from its initial weights.

    Named by what its loss expects.
    """
    tr, loss = ctx.trainer, ctx.loss or {}
    if ctx.framework != "keras" or tr is None or tr.inputs is None or not loss.get("name"):
        return {}
    name = loss["name"]
    if name == "cross_entropy" and not loss.get("from_logits"):
        name = "cross_entropy_on_probabilities"
    if name not in _EXPECTS_LOGITS and name not in _SIGNED:
        return {}
    model = tr.fresh_model()  # as built: the trained model may have collapsed to a constant
    out = model(tr._x(tuple(x[:ROWS] for x in tr.inputs)), training=False)
    if isinstance(out, (list, tuple, dict)):  # several outputs: which one the loss reads is unknown
        return {}
    return {"name": name, **output_kind(out)}


@register
class LossOutputMismatch(Probe):
    """What the loss received on the first batch, against what it expects."""

    id = "loss_output_mismatch"
    cost = 1
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution", "gradient_instability",
                  "overfitting")
    fix = ("Remove the Softmax/LogSoftmax (or sigmoid) before a loss that expects raw logits "
           "(CrossEntropyLoss, BCEWithLogitsLoss), or switch to the loss that matches the output "
           "(NLLLoss after LogSoftmax).")

    def run(self, ctx: ProbeContext):
        """Confirmed when the recorded loss input is of a kind the loss does not expect.

        E.g. probabilities fed to ``cross_entropy``; a lint hit alone is a hypothesis.
        """
        hits = lint_hits(ctx, "loss_output_mismatch")
        seen = ctx.run.first("loss_input") or _keras_seen(ctx)
        name, kind = seen.get("name"), seen.get("kind")
        floored = self._floored(ctx, seen) or _targets_outside(self, ctx)
        if floored is not None:
            return [floored]
        measured = kind in _EXPECTS_LOGITS.get(name, ()) and _held_all_run(ctx, kind)
        if not hits and not measured:
            return []
        where = loc(hits[0]) if hits else output_location(ctx) \
            or ctx.ref("model") or ctx.ref("loss_fn")
        owner = _owner(ctx, where)
        if measured:  # made at the loss call (``crit(torch.softmax(out, 1), y)``), or the model
            squashed = _squashed_at_loss(ctx, _PROBABILITIES)
            where = squashed or where
            owner = "architecture" if squashed else _owner(ctx, where)
            return [self.finding(
                owner, True,
                f"{name.replace('_on_probabilities', '')} expects {_EXPECTED[name]} but "
                f"receives {kind.replace('_', ' ')} (measured: min {seen.get('min'):.3g}, max "
                f"{seen.get('max'):.3g}"
                + (f", rows summing to 1 within {seen['row_sum_dev']:.2g}"
                   if seen.get("row_sum_dev") is not None else "") + "). "
                + ("The loss squashes them again, gradients shrink and learning stalls. Remove "
                   "the final softmax/sigmoid from the model, or tell the loss it gets "
                   "probabilities." if "logits" in _EXPECTED[name] else
                   "nll_loss returns minus the input at the true class, so it is a "
                   "log-likelihood only for log-probabilities: given anything else it falls "
                   "below 0 without bound (raw scores) or towards -1 (probabilities) and "
                   "optimises another objective. Use log_softmax as the output (not softmax), "
                   "or give the raw scores to cross_entropy." if name == "nll_loss" else
                   "The loss reads them as probabilities (clipped to [0, 1]): add the output "
                   "activation, or tell the loss it gets logits (from_logits=True)."),
                where, loss=name, input_kind=kind, **{k: seen[k] for k in ("min", "max")
                                                      if k in seen}, strength=0.95,
                decisive=True)]
        measured_steps = [st for st in ctx.run.steps if "gn" in st]
        if len(measured_steps) > 1 and all(st["gn"] == 0 for st in measured_steps):
            # what the lint predicts, measured: the output cannot move (one softmax unit is 1.0)
            return [self.finding(
                owner, True, hits[0].message + f" Measured: the gradient was exactly 0 "
                f"in all {len(measured_steps)} optimizer steps recorded (the weights get "
                "gradients, all zero): the output does not depend on them.", where,
                strength=0.9, decisive=True, zero_gradient_steps=len(measured_steps))]
        losses = {st["loss"] for st in ctx.run.steps if isinstance(st.get("loss"), float)}
        readings = sum(isinstance(st.get("loss"), float) for st in ctx.run.steps)
        if len(losses) == 1 and readings >= MIN_STEPS and \
                (ctx.signals.get("constant_predictor_loss") or 0) > 0:
            # measured: the loss never changed while the weights did, and the targets vary
            return [self.finding(
                _owner(ctx, loc(hits[0])), True, hits[0].message + f" Measured: the loss read "
                f"{losses.pop():.4g} at every one of the {readings} steps recorded, while "
                "always predicting the label prior would score "
                f"{ctx.signals['constant_predictor_loss']:.4g}: it does not depend on what "
                "the model outputs.", loc(hits[0]), strength=0.95, decisive=True,
                constant_loss_steps=readings)]
        if kind == "constant":  # what the lint predicts, measured on the model as built
            return [self.finding(
                _owner(ctx, loc(hits[0])), True, hits[0].message + f" Measured: the model as built "
                f"outputs {seen.get('min'):.4g} for every one of the kept rows, whatever their "
                "inputs: the output does not depend on them.", loc(hits[0]),
                strength=0.9, decisive=True, output_value=seen.get("min"))]
        return [self.finding(owner, False, hits[0].message + " (the loss input was not "
                             "measured)", where, strength=0.4)]

    def _floored(self, ctx: ProbeContext, seen: dict):
        """The finding for a bounded output that cannot reach some targets, or None.

        Bounded: a ReLU's floor, a sigmoid's or a tanh's range.
        The share of targets it cannot reach is the record's ``output_range_unreachable``
        (PyTorch), else computed the same way from the Keras model's output on kept rows.
        Located at the loss call when the prediction is squashed there
        (``loss(torch.relu(pred), y)``), else at the model.
        """
        from ..signals import output_range
        from ..thresholds import UNREACHABLE_SHARE

        targets = (ctx.run.of("targets") or [{}])[-1]
        if not targets and ctx.run.of("target_values"):  # a train_step's own loss
            targets = {**ctx.run.of("target_values")[-1], "loss": "custom"}
        head = ctx.signals.get("output_range_head")
        if head is not None:  # one output of several: its own targets and range
            targets = next((e for e in reversed(ctx.run.of("head_targets"))
                            if e.get("head") == head), {})  # its latest, as the signal's
        if isinstance(targets.get("input_min"), float):  # the loss inputs over the whole run
            seen = {"name": targets.get("loss"), "min": targets["input_min"],
                    "max": targets.get("input_max"),
                    "zero_share": targets.get("input_zero_share"),
                    "pressed": targets.get("input_pressed") or {}}
        share = ctx.signals.get("output_range_unreachable")
        bound = ctx.signals.get("output_range")
        if share is None and seen and ctx.train_xy is not None and ctx.train_xy[1] is not None:
            import numpy as np

            y = np.asarray(ctx.train_xy[1], dtype=np.float64)
            got = output_range(seen, {"mean": float(y.mean()), "negative": float((y < 0).mean()),
                                       "above_one": float((y > 1).mean()),
                                       "below_minus_one": float((y < -1).mean())})
            share, bound = got.get("output_range_unreachable"), got.get("output_range")
        if share is None or share < UNREACHABLE_SHARE:
            return None
        name = seen.get("name") or "the loss"
        if name == "custom":
            name = "the train_step's own loss"
        if name == "binary_cross_entropy_with_logits":
            why = (f"a raw score below 0 is how the model says 'class 0' ({share:.0%} of the "
                   "targets): it can never predict a probability below 0.5")
        else:
            why = f"{share:.0%} of the training targets lie outside it and can never be reached"
        where = (head_location(ctx, head, targets.get("index")) if head is not None else None) \
            or _squashed_at_loss(ctx, _SQUASH) or output_location(ctx) or ctx.ref("model") \
            or ctx.ref("loss_fn")
        said = f"The {head!r} output's {name}" if head is not None else name
        lo, hi = seen.get("min"), seen.get("max")
        shown = f"min {lo:.3g}" + (f", max {hi:.3g}" if isinstance(hi, (int, float)) else "")
        return self.finding(
            "architecture", True,
            f"{said} receives outputs confined to {bound} ({shown}, "
            f"{seen.get('zero_share') or 0:.0%} exactly 0), but {why}. The model converges to "
            "the best answer its output range allows, not the right one. Remove the activation "
            "from the output (a linear output for regression and logits), or scale the targets "
            "into the range.",
            where, loss=name, input_kind="bounded", output_range=bound, unreachable_share=share,
            **({"head": head} if head is not None else {}),
            zero_share=seen.get("zero_share"), strength=0.95, decisive=True)


def _targets_outside(probe: Probe, ctx: ProbeContext):
    """A binary cross-entropy over targets outside [0, 1] (class indices read as probabilities).

    The loss then has no minimum: ``-t log p - (1 - t) log(1 - p)`` with ``t = 3`` falls
    without bound as ``p`` goes to 1, so the run's loss goes below zero and the model learns to
    push outputs to one end. Measured on the recorded targets; decisive.
    """
    targets = ctx.run.of("targets")
    t = targets[-1] if targets else {}
    name = t.get("loss")
    if name not in _BINARY:
        return None
    share = float(t.get("above_one") or 0.0) + float(t.get("negative") or 0.0)
    if share < OUTSIDE_SHARE:
        return None
    mean = t.get("mean")
    where = output_location(ctx) or ctx.ref("loss_fn") or ctx.ref("model")
    return probe.finding(
        _owner(ctx, where), True,
        f"{name} reads its targets as probabilities in [0, 1], but {share:.0%} of the training "
        "targets lie outside that range"
        + (f" (their mean is {mean:.3g}: class indices?)" if isinstance(mean, float) else "")
        + ". For such a target the loss has no minimum: it falls below zero without bound as "
        "the output is pushed to one end, and the model learns that instead of the classes. "
        "Use a categorical loss (sparse categorical cross-entropy) with one output per class, "
        "or scale the targets to [0, 1].",
        where, loss=name,
        targets_outside=share, targets_mean=mean, strength=0.95, decisive=True)


_BINARY = ("binary_cross_entropy", "binary_cross_entropy_with_logits")
OUTSIDE_SHARE = 0.01  # targets outside [0, 1] under a binary cross-entropy: its domain left


_LOSS_LINE = re.compile(r"loss|crossentropy|cross_entropy|from_logits|nll|bce", re.IGNORECASE)


def _owner(ctx: ProbeContext, where: dict | None) -> str:
    """The root cause of an output/loss mismatch, by where it is fixed.

    ``training_loop`` when the line sets the loss up (its construction, ``compile(loss=
    ...)``, ``from_logits``): the loss was chosen or configured for another output.
    ``architecture`` for the model's output, also when its activation is written at the
    loss call (``loss(torch.relu(pred), y)``; the callers say so): the output was built for
    another loss.
    """
    if not where or where == output_location(ctx):
        return "architecture"
    compiled = ctx.ref("compile")
    if compiled and (compiled.get("file"), compiled.get("line")) == \
            (where.get("file"), where.get("line")):
        return "training_loop"
    text = _line(ctx, where)
    return "training_loop" if text is not None and _LOSS_LINE.search(text) and \
        not re.search(r"\b(Dense|Linear|Sequential|Model)\(", text) else "architecture"


def _squashed_at_loss(ctx: ProbeContext, pattern: re.Pattern) -> dict | None:
    """The loss call's location when its line applies an activation ``pattern`` names."""
    where = ctx.ref("loss_fn")
    text = _line(ctx, where)
    return where if text is not None and pattern.search(text) else None


def _line(ctx: ProbeContext, where: dict | None) -> str | None:
    if not where or not where.get("file") or not where.get("line"):
        return None
    text = ctx.source_files.get(where["file"])
    lines = text.splitlines() if isinstance(text, str) else []
    return lines[where["line"] - 1] if 0 < where["line"] <= len(lines) else None


def _held_all_run(ctx: ProbeContext, kind: str) -> bool:
    """Whether the first batch's kind of loss input held over the whole run.

    The capture describes the loss input on the first training call; the ``targets`` event
    keeps its range over every call. A freshly initialised model's logits can all fall in
    [0, 1] on the first batch (0.03-0.17): outputs that left [0, 1] later were never squashed.
    """
    ev = ctx.run.of("targets")
    low, high = (ev[-1].get("input_min"), ev[-1].get("input_max")) if ev else (None, None)
    if not isinstance(low, (int, float)) or not isinstance(high, (int, float)):
        return True  # no run-wide range recorded: the first batch is all there is
    if kind in ("unit_interval", "probabilities"):
        return low >= 0.0 and high <= 1.0
    if kind == "log_probabilities":
        return high <= 0.0
    return True
