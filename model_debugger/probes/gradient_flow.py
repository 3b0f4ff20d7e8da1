"""``gradient_flow``: per-layer gradient norms over the run.

Names where gradients stop (layers with ~0 gradient while later layers learn: vanishing) and where
they break (the first module to go non-finite, and whether the forward pass or the update
produced it).
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from ..records import Intervention
from ._heldout import source_line
from ._lint import summed_loss_line, undivided_accumulation
from ._made import output_location
from .base import Probe, ProbeContext, blown_up, register, setting_location

VANISH = 1e-3      # layer median norm / largest layer median norm
UPSTREAM = 1e-2    # a layer before the last vanishing one at this share of the strongest:
                   # the gradient reaches the input, it does not vanish towards it
GROWTH = 100.0     # gradient norm growth before a NaN that points at the learning rate


@register
class GradientFlow(Probe):
    """Per-layer gradient norms and the first non-finite value of the record."""

    id = "gradient_flow"
    categories = ("gradient_instability", "loss_not_decreasing")

    def suggestion(self, finding) -> str:
        """Worded by the finding: the vanishing layers, a learning rate, or the unsafe operation."""
        vanishing = (finding.evidence or {}).get("vanishing_layers")
        if vanishing:
            return ("Use an activation and initialisation that keep gradients alive in "
                    f"{', '.join(map(str, vanishing[:3]))} (ReLU/GELU with He init, "
                    "residual connections or normalisation layers).")
        if finding.root_cause == "hyperparameter":
            return ("Lower the learning rate (see lr_range's safe rate) so the values that "
                    "overflow stop growing; keep the model as it is.")
        return ("Guard the operation that produces the first non-finite value (e.g. clamp before "
                "log, add an epsilon), or lower the learning rate if the values grow first.")

    def intervention(self, finding):
        """A finite loss with a non-finite gradient: guard each operation's backward."""
        if not finding.evidence.get("unsafe_backward"):
            return None
        return Intervention("guard_backward",
                            {"from_step": int(finding.evidence.get("step") or 0)})

    def reconsider(self, finding, others):
        """Vanishing gradients refuted as the architecture's doing by a copy that learned.

        A fresh copy of the same model fitted the samples at a rate below the user's: the
        model as built passes the gradient, and a rate too high saturated or killed its units
        (a consequence).
        """
        lower = next((o for o in others if o.confirmed and o.check == "overfit_small_batch"
                      and isinstance(o.evidence.get("working_lr"), (int, float))
                      and isinstance(o.evidence.get("lr"), (int, float))
                      and o.evidence["working_lr"] < o.evidence["lr"]), None)
        if lower is None or not finding.confirmed or not finding.evidence.get("vanishing_layers"):
            return finding
        return replace(finding, confirmed=False, explanation=(
            f"{finding.explanation} But a fresh copy of the same model fitted the samples at "
            f"lr={lower.evidence['working_lr']:.3g}, below the run's {lower.evidence['lr']:.3g}: "
            "the model as built passes the gradient, and the rate saturated or killed the "
            "units (a consequence, not the architecture's doing)."),
            evidence={**finding.evidence, "strength": 0.3, "learns_at": lower.evidence["working_lr"]})

    def acted_at(self, finding, sites):
        """Located where the guarded operation was made.

        In a layer's forward: ``architecture``; in the loss's code: ``training_loop``.
        """
        from ..provenance import in_layer

        site = next((s for s in sites if s.get("file") and isinstance(s.get("line"), int)),
                    None)
        if site is None or not finding.evidence.get("unsafe_backward"):
            return finding
        layer = in_layer(site.get("frames") or [site])
        op = str(site.get("op", "an operation")).removesuffix("Backward0")
        return replace(
            finding, root_cause="architecture" if layer else "training_loop",
            location={"file": site["file"], "line": site["line"]},
            explanation=f"{finding.explanation} The first operation to hand back a non-finite "
                        f"gradient from finite ones was {op} in {site.get('func', 'your code')} "
                        f"(line {site['line']})" + (", in a layer's forward" if layer else
                                                     ", in the loss's code") + ".",
            evidence={**finding.evidence, "unsafe_op": site.get("op"),
                      "made_at": {"file": site["file"], "line": site["line"]}})

    def run(self, ctx: ProbeContext):
        """Findings on the first non-finite value and on layers whose gradients vanish.

        A non-finite value that follows a growing gradient norm points at the learning rate; one
        the forward pass produces while the weights are still finite, at an unsafe operation of
        the module where it appeared. Vanishing: a layer's median gradient norm below 1e-3 of the
        strongest layer's, with no layer before the last of them (model order) at 1e-2 of the
        strongest or more.
        """
        out = []
        bad = ctx.run.first("nonfinite")
        if bad is not None:
            out.append(self._nonfinite(ctx, bad))
        names, norms = ctx.run.module_norms()
        if len(names) >= 3 and len(norms) >= 5:
            with np.errstate(all="ignore"):
                med = np.nanmedian(np.where(np.isfinite(norms), norms, np.nan), axis=0)
            top = np.nanmax(med) if np.isfinite(med).any() else 0.0
            if top > 0:
                ratio = med / top
                dead = [n for n, r in zip(names, ratio) if np.isfinite(r) and r < VANISH]
                if dead and names.index(dead[0]) < len(names) - 1 and \
                        not _reaches_input(ratio, names.index(dead[-1])):
                    blown = blown_up(ctx)
                    at_start = _start_ratios(norms, [names.index(n) for n in dead])
                    every = _start_ratios(norms, list(range(len(names))))
                    # the model as built passes the gradient: over the first readings the
                    # vanishing layers were strong enough, or a layer upstream of them was
                    # (a transformer's embeddings, before a rate too high collapsed it)
                    later = at_start is not None and (
                        min(at_start) >= UPSTREAM or _reaches_input(
                            np.asarray(every), names.index(dead[-1])))
                    out.append(self.finding(
                        "architecture", not blown and not later,
                        f"Gradients vanish towards the input: the median gradient norm of "
                        f"{dead[:4]} is below {VANISH:g}x that of the strongest layer, so the "
                        "early layers barely learn. Saturating activations (sigmoid/tanh) stacked "
                        "deep, or poor initialisation, shrink the gradient at every layer." + (
                            f" The run blew up ({', '.join(blown)}): small gradients cannot "
                            "explain a loss that grew, and saturated units after large updates "
                            "give them; not the cause of this run's symptom." if blown else "") + (
                            (f" Over the first steps those layers' gradients were at least "
                             f"{min(at_start):.2g}x the strongest layer's" if
                             min(at_start) >= UPSTREAM else
                             " Over the first steps a layer before them got "
                             f"{max(every[:names.index(dead[-1])]):.2g}x the strongest "
                             "layer's gradient") + ": the model as built passes the gradient, "
                            "and it vanished during training (units that died or saturated "
                            "after large updates): a consequence, not the architecture's "
                            "doing." if later and not blown else ""),
                        _saturating_location(ctx) or ctx.ref("model") or ctx.ref("backward"),
                        layer_median_norms={n: float(m) for n, m in zip(names, med)},
                        vanishing_layers=dead, min_ratio=float(np.nanmin(ratio)),
                        start_ratios=at_start,
                        strength=0.3 if blown or later else 0.9))
        return out

    def _nonfinite(self, ctx: ProbeContext, bad: dict):
        step, module, what = bad["step"], bad.get("module"), bad["what"]
        gn = ctx.run.series("gn")[:step]
        gn = gn[np.isfinite(gn)]
        growth = float(gn.max() / max(np.median(gn[:max(1, len(gn) // 10)]), 1e-12)) \
            if len(gn) >= 5 else None
        where = f"module '{module}'" if module else "an unknown module"
        common = dict(step=step, module=module, what=what, grad_norm_growth_before=growth)
        if bad.get("in_batch"):  # the batch itself held NaN/inf: nonfinite_inputs' finding
            return self.finding(
                "data", False,
                f"Non-finite {what} first at step {step} in {where}, from a batch that already "
                f"held non-finite values ({bad['in_batch']}): the data, not the module.",
                ctx.ref("backward"), strength=0.3, **common)
        if growth is not None and growth >= GROWTH:
            accumulated = undivided_accumulation(ctx)
            if accumulated is not None:
                k = accumulated["backwards"]
                return self.finding(
                    "training_loop", True,
                    f"Non-finite {what} first at step {step} in {where}, after the gradient norm "
                    f"grew {growth:.3g}x. The loop back-propagates {k} micro-batches per "
                    "optimizer step and never divides their losses, so every update is the sum "
                    f"of {k} gradients: {k}x what the rate was chosen for. Divide each "
                    f"micro-batch's loss by the accumulation steps (loss / {k}) before backward.",
                    {"file": accumulated["file"], "line": accumulated["line"]}, strength=0.75,
                    backwards_per_step=k, **common)
            summed = summed_loss_line(ctx)
            unbounded = ctx.signals.get("loss_unbounded") is not None
            return self.finding(
                "hyperparameter", not unbounded,
                f"Non-finite {what} first at step {step} in {where}, after the gradient norm "
                f"grew {growth:.3g}x: updates grow until values overflow, the signature of a "
                "learning rate too high for the scale of inputs and weights"
                + (" (the loss sums over the batch: reduction='sum' makes every step the "
                   "batch size times the mean's)." if summed else ".")
                + (" But the loss fell without bound before it overflowed (unbounded_loss): an "
                   "objective without a minimum overflows at any rate." if unbounded else ""),
                summed or setting_location(ctx.ref("optimizer"), "lr"),
                strength=0.3 if unbounded else 0.7, **common)
        if what == "loss" and (step == 0 or bad.get("op")) and not bad.get("in_weights") and \
                bad.get("forward") == "finite" and bad.get("replay") != "finite" and \
                _targets_finite(ctx):
            return _loss_made_it(self, ctx, bad, common)
        if what == "grad" and not bad.get("in_weights") and ctx.framework == "torch" and \
                (growth is not None or step == 0):  # (the norm seen not to grow, or no update)
            return self.finding(
                "training_loop", False,
                f"Non-finite gradient first at step {step} in {where}, while the loss was "
                "finite" + (", before any update," if step == 0 else "") + " and the gradient "
                "norm had not grown: an operation whose derivative is infinite at the values "
                "it meets (a square root of 0, the norm of a zero vector, a division by a value "
                "that is 0) turns the gradient into inf * 0 = NaN; no learning rate does that.",
                ctx.ref("loss_fn") or ctx.ref("backward"), strength=0.6, unsafe_backward=True,
                **common)
        custom = _module_location(ctx, module) if module else None
        # weights already non-finite: an earlier update (a gradient the capture did not
        # measure, see norm_every) put them there, not the forward pass
        in_weights = bool(bad.get("in_weights"))
        if what == "loss" and custom and not in_weights and \
                (step == 0 or (growth is not None and growth < 10)):
            return self.finding(
                "architecture", True,
                f"The forward pass produces a non-finite value at step {step} in {where} "
                "(found by replaying the batch) while weights and gradients were still finite: "
                "an operation in that module is numerically unsafe (log of 0, division by 0, "
                "exp overflow).",
                custom, strength=0.85, **common)
        return self.finding(
            "hyperparameter" if what != "loss" or in_weights else "architecture", False,
            f"Non-finite {what} first at step {step} in {where}" + (
                ", whose weights were already non-finite: an earlier update put them there"
                if in_weights else "") + ".", ctx.ref("backward"),
            strength=0.4, in_weights=in_weights, **common)


# an activation chosen for layers (a name, a module), not a functional call in a forward or
# a metric (``torch.sigmoid(logits) > 0.5``), which may be the output's or an evaluation's
_SATURATING = re.compile(
    r"""["'](?:sigmoid|tanh|softsign|hard_sigmoid)["']|nn\.(?:Sigmoid|Tanh|Softsign|Hardsigmoid)"""
    r"""\(""")


def _saturating_location(ctx: ProbeContext) -> dict | None:
    """Where the hidden layers' saturating activation is set, near the model; None without one.

    The sigmoid/tanh nearest the model's line in its file, not the output layer's (a sigmoid
    output is the task's), followed to where a name it is passed by was set
    (``activation=HIDDEN_ACT`` with ``HIDDEN_ACT = "sigmoid"``).
    """
    model = ctx.ref("model")
    text = ctx.source_files.get(model.get("file")) if model else None
    if not isinstance(text, str) or not isinstance(model.get("line"), int):
        return None
    output = output_location(ctx) or {}
    hits = {i for i, line in enumerate(text.splitlines(), 1)
            if _SATURATING.search(line) and not line.lstrip().startswith("#")
            and i != output.get("line")}
    if not hits:
        return None
    best = min(hits, key=lambda i: abs(i - model["line"]))
    while best - 1 in hits:
        best -= 1
    return setting_location({"file": model["file"], "line": best}, "activation")


def _start_ratios(norms: np.ndarray, layers: list[int]) -> list[float] | None:
    """Each of ``layers``' median gradient norm over the run's first readings, relative.

    The first tenth of the readings (three at least), against the strongest layer's median
    then; None with too few readings.
    """
    head = norms[:max(3, len(norms) // 10)]
    if len(norms) < 10 or not len(head):
        return None
    with np.errstate(all="ignore"):
        med = np.nanmedian(np.where(np.isfinite(head), head, np.nan), axis=0)
    top = np.nanmax(med) if np.isfinite(med).any() else 0.0
    if not top > 0:
        return None
    return [float(med[i] / top) if np.isfinite(med[i]) else 0.0 for i in layers]


def _reaches_input(ratio: np.ndarray, last_weak: int) -> bool:
    """Whether a layer before the last weak one (model order) gets a strong gradient.

    Vanishing is a gradient that shrinks on its way to the input, so everything upstream of
    the weak layers is weak too. A strong gradient upstream of them (a transformer's
    embeddings, while its attention query/key weights get tiny gradients at initialisation, or
    a residual model's stem) says the gradient gets through: small parameters in between are
    insensitive, not starved.
    """
    upstream = ratio[:last_weak]
    upstream = upstream[np.isfinite(upstream)]
    return bool(upstream.size and upstream.max() >= UPSTREAM)


def _targets_finite(ctx: ProbeContext) -> bool:
    """Whether the kept training targets are finite (none kept: nothing says otherwise)."""
    y = ctx.train_xy[1] if ctx.train_xy is not None else None
    if y is None:
        return True
    y = np.asarray(y.detach().cpu().float() if hasattr(y, "detach") else y)
    return y.dtype.kind not in "fc" or bool(np.isfinite(y).all())


def _loss_made_it(probe: Probe, ctx: ProbeContext, bad: dict, common: dict):
    """The loss turned finite outputs into a non-finite value.

    Measured by the capture: the batch that gave the first non-finite loss, replayed through
    the model at the weights of that step, gave finite outputs; the value came from the loss
    computation. On a later step the capture also names the operation (``op``: a log of a value
    <= 0, a division by 0), read from what the loss's graph saved: outputs that trained into a
    bound (a sigmoid's probability rounded to exactly 1) met a loss without a guard. With
    outputs exactly 0 (a ReLU's floor) it is the output layer (``architecture``, located
    there); else the loss code (``training_loop``): a library loss's call, or the nearest line
    of the user's code doing that operation (a hand-written loss).
    """
    from ..signals import FLOOR_ZEROS

    zeros = float(bad.get("output_zeros") or 0.0)
    floored = zeros >= FLOOR_ZEROS
    op = (bad.get("op") or {}).get("op")
    near = ctx.ref("loss_fn") or ctx.ref("backward")
    written = source_line(ctx, _OP_CODE[op], near=near) if op in _OP_CODE and \
        ctx.ref("loss_fn") is None else None
    where = (output_location(ctx) or ctx.ref("model") if floored else None) or written or near
    step = ctx.signals.get("first_nonfinite_step", 0)
    when = "at the first step, before any update" if not step else f"at step {step}"
    what = {"log": "a log of a value <= 0", "division": "a division by 0",
            "sqrt": "a square root of a negative", "exp": "an exponential that overflowed"}
    return probe.finding(
        "architecture" if floored else "training_loop", True,
        f"The loss was non-finite {when}, while the model's outputs on that batch were finite "
        "(replayed at that step's weights): the loss computation itself makes the value ("
        + (f"{what[op]}, {bad['op'].get('bad')} values, read from the loss's graph)." if op
           else "a log of 0, a division by 0, a square root of a negative).") + (
            f" {zeros:.0%} of the outputs are exactly 0 (a ReLU or clamp on the output): a "
            "loss that takes their log or divides by them cannot take 0. Use an output that "
            "stays positive (softplus, exp) or add a small epsilon in the loss." if floored
            else " Guard the operation (an epsilon, a clamp) or use the library's stable form "
                 "of the loss."),
        where, strength=0.9, decisive=True, output_zero_share=zeros,
        **({"op": bad["op"]} if op else {}), **common)


# where an operation is written in the user's code (a hand-written loss)
# (a math library's function, or a tensor's method; not a logger's ``self.log(``/``wandb.log(``;
# a division by something other than a number written out)
_LIB = r"(?:\b(?:torch|np|numpy|math|F|tf|tf\.math|K|ops)\.|(?<![\w.]))"
_OP_CODE = {"log": re.compile(rf"{_LIB}log(?:2|10|1p)?\(|\.log(?:2|10|1p)?\(\s*\)"),
            "sqrt": re.compile(rf"{_LIB}sqrt\(|\.sqrt\(\s*\)"),
            "exp": re.compile(rf"{_LIB}exp\(|\.exp\(\s*\)"),
            "division": re.compile(r"[\w)\]]\s*/\s*(?![\d.]+\b)[A-Za-z_(]")}


# evidence of a classification that the loss or the gradients grew (classify.exploding, nonfinite)
def _module_location(ctx: ProbeContext, name: str) -> dict | None:
    """Where the named submodule's ``forward`` is defined (user code only)."""
    if ctx.model is None or not hasattr(ctx.model, "get_submodule"):
        return None
    try:
        code = type(ctx.model.get_submodule(name)).forward.__code__
    except (AttributeError, TypeError):
        return None
    from ..capture.codeloc import is_user_file

    if not is_user_file(code.co_filename):
        return None
    return {"file": code.co_filename, "line": code.co_firstlineno}
