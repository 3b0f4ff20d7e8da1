"""``detached_output``: gradients do not reach (most of) the weights: the graph is cut before the loss.

Two shapes of one fault:

- no optimizer step had any gradient (the prediction itself was detached): confirmed by the record;
- most parameters were never updated though they require a gradient (a hidden state detached
  inside ``forward``, a branch computed under ``no_grad``; measured as ``untrained_share``): a
  fresh copy's backward shows which parameters get no gradient, and an experiment undoes the cut
  by letting ``Tensor.detach`` keep the graph inside the copy's forward. The copy with the graph
  kept reaching a clearly lower held-out loss confirms it, located at the ``detach`` call the
  copy's forward made on a tensor that needed a gradient.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import numpy as np

from ..records import Intervention
from ._heldout import SettingExperiment
from ._lint import lint_hits, loc
from .base import ProbeContext, register

CUT = 0.5  # share of the parameters needing a gradient that get none: the graph is cut


@register
class DetachedOutput(SettingExperiment):
    """Whether gradients reach the weights: the recorded norms, the copies' backward, the lint."""

    id = "detached_output"
    cost = 2
    suggested_by = ("untrained_share",)
    categories = ("loss_not_decreasing",)
    needs_live = False
    fix = ("Remove the .detach()/.data/no_grad on the path from the model's output to the loss, "
           "so gradients reach the weights.")

    def intervention(self, finding):
        """The re-run's forward keeps the graph where the code detaches (a cut inside forward)."""
        sites = finding.evidence.get("detach_sites")
        return Intervention("keep_graph", {"sites": sites}) if sites else None

    def applies(self, ctx: ProbeContext) -> bool:
        """Always: the record's norms and the lint need no live model."""
        return ctx.framework in self.frameworks

    def run(self, ctx: ProbeContext):
        """Confirmed when no step had a gradient, or when a copy keeping the graph trains better.

        A lint hit alone is a hypothesis.
        """
        hits = lint_hits(ctx, "detached_output")
        steps = ctx.run.steps
        # a step without a "gn" key was not measured (a log); None means no gradient at all.
        # An exactly-zero norm is a gradient that exists and is zero (a constant output: a
        # softmax over one unit, every unit dead): the graph reaches the weights, it is not cut
        no_grad = sum(1 for s in steps if "gn" in s and s["gn"] is None)
        # gradients that landed on the model's own parameters, not the optimizer's, or that
        # were taken and never applied (a Keras tape loop): not a cut
        measured = len(steps) > 1 and no_grad == len(steps) and \
            ctx.run.first("optimizer_elsewhere") is None and ctx.run.first("unapplied") is None
        where = loc(hits[0]) if hits else ctx.ref("loss_fn") or ctx.ref("backward")  # (the
        # cut lies between the model and the loss: the loss call is nearer it than backward)
        silent = _step_returns_nothing(ctx) if measured else None
        if silent is not None:
            return [self.finding(
                "training_loop", True,
                f"In all {len(steps)} optimizer steps no parameter had a gradient, and the "
                "LightningModule's training_step returns nothing: under automatic optimization "
                "Lightning back-propagates the loss training_step returns, and skips the batch "
                "when it returns None. Return the loss (return loss).",
                silent, steps=len(steps), steps_without_gradient=no_grad, strength=0.95,
                decisive=True)]
        if measured:
            return [self.finding(
                "training_loop", True,
                f"In all {len(steps)} optimizer steps no parameter had a gradient: backward() "
                "never reaches the weights, so the optimizer has nothing to apply. The model "
                "output is cut from the graph (detach/.data/numpy round trip) before the loss.",
                where, steps=len(steps), steps_without_gradient=no_grad, strength=0.95,
                decisive=True)]
        partial = self._partial(ctx)
        if partial:
            return partial
        if not hits:
            return []
        return [self.finding("training_loop", False, hits[0].message + " (gradients did reach "
                             "some weights)", where, strength=0.3)]

    def _partial(self, ctx: ProbeContext) -> list:
        """Most parameters untrained in the run: which get no gradient, and the experiment."""
        untrained = ctx.signals.get("untrained_share", 0.0)
        tr = ctx.trainer
        if untrained < CUT or tr is None or tr.framework not in ("torch", "keras") or \
                tr.n < 16 or not ctx.live:
            return []
        share, keeping = (_cut_share, _keeping_graph) if tr.framework == "torch" else \
            (partial(_keras_cut_share, sources=ctx.source_files), _keras_keeping_graph)
        before, _ = share(tr, keep=False)
        after, sites = share(tr, keep=True)
        if before < CUT or after >= before or not sites:
            return []  # not a cut (frozen, left out of the optimizer), or not one detach undoes
        cut, kept, confirmed = self.compare(ctx, keeping)
        return [self.finding(
            "training_loop", confirmed,
            f"{before:.0%} of the parameters that need a gradient get none: the forward pass "
            f"{'detaches' if tr.framework == 'torch' else 'stops the gradient of'} a tensor on "
            f"the way to the loss (a fresh copy's backward; {after:.0%} once the "
            f"{'detach' if tr.framework == 'torch' else 'stop_gradient'} keeps the graph). "
            "Two fresh copies trained on the same rows reach "
            f"a held-out loss of {kept:.4g} with the graph kept and {cut:.4g} as written"
            + (": the cut holds the loss up." if confirmed else
               ": no clearly better, so the cut is not what holds the loss up."),
            sites[0], undone=confirmed, strength=0.85 if confirmed else 0.2,
            ungraded_share=before, ungraded_share_kept=after, heldout_cut=cut,
            heldout_kept=kept, detach_sites=sites[:3])]


def _step_returns_nothing(ctx: ProbeContext) -> dict | None:
    """The last line of a Lightning ``training_step`` that returns no value, else None."""
    import ast

    where = ctx.ref("training_step")
    trainer = ctx.run.first("trainer") or {}
    if trainer.get("kind") != "lightning" or not trainer.get("automatic", True) or not where \
            or where.get("file") not in (ctx.source_files or {}):
        return None  # (under manual optimization returning nothing is how it is written)
    try:
        tree = ast.parse(ctx.source_files[where["file"]])
    except (SyntaxError, ValueError):
        return None
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and
               n.name == "training_step" and n.lineno == where.get("line")), None)
    if fn is None or any(isinstance(n, (ast.Return, ast.Yield)) and n.value is not None and
                         not (isinstance(n.value, ast.Constant) and n.value.value is None)
                         for n in _own_nodes(fn)):
        return None
    return {"file": where["file"], "line": fn.body[-1].end_lineno or fn.body[-1].lineno}


def _own_nodes(fn):
    """The nodes of a function's body, not those of the functions and lambdas inside it."""
    import ast

    stack = list(fn.body)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                 ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def _cut_share(tr, keep: bool) -> tuple[float, list[dict]]:
    """Share of a fresh copy's parameters needing a gradient that get none after one backward.

    With ``keep`` (``detach`` keeping the graph), also where the forward detached such tensors.
    """
    model = tr.fresh_model()
    sites: list[dict] = []
    if keep:
        model = _keeping_graph(model, sites)
    inputs, target = tr.subset(slice(0, min(tr.n, 64)))
    tr.loss(model, inputs, target).backward()
    need = [p for p in model.parameters() if p.requires_grad]
    total = sum(p.numel() for p in need)
    none = sum(p.numel() for p in need if p.grad is None)
    return (none / total if total else 0.0), sites


def _keeping_graph(model, sites: list | None = None):
    """``model`` (a copy) whose forward keeps the graph where your code calls ``detach``.

    Only detaches made by the user's code on tensors that need a gradient are kept (the
    ``keep_graph`` intervention's rule); their lines go to ``sites``.
    """
    import torch

    from .._interventions_torch import graph_keeping_detach

    forward = model.forward
    detach = graph_keeping_detach(torch, sites)

    def kept(*args, **kwargs):
        torch.Tensor.detach = detach
        try:
            return forward(*args, **kwargs)
        finally:
            torch.Tensor.detach = detach.original

    model.forward = kept
    return model


def _keras_cut_share(tr, keep: bool, sources: dict | None = None) -> tuple[float, list[dict]]:
    """As :func:`_cut_share` for Keras: a fresh copy's gradients under a ``GradientTape``.

    With ``keep``, ``tf.stop_gradient``/``keras.ops.stop_gradient`` called by the user's code
    keep the graph, and their lines go to the sites (for a functional model's node, the lines
    of ``sources``, ``{path: text}``, that call it).
    """
    import tensorflow as tf

    model = tr.fresh_model()
    sites: list[dict] = []
    symbolic: list = []
    inputs, target = tr.subset(np.arange(min(tr.n, 64)))
    with _keras_stop_gradient_kept(sites if keep else None, symbolic):
        with tf.GradientTape() as tape:
            loss = tr._loss(model, inputs, target, True)
    need = model.trainable_variables
    grads = tape.gradient(loss, need)
    total = sum(int(np.prod(v.shape)) for v in need)
    none = sum(int(np.prod(v.shape)) for v, g in zip(need, grads) if g is None)
    if symbolic:  # a functional model's node: where the code called stop_gradient
        sites += [s for s in _stop_gradient_calls(sources) if s not in sites]
    return (none / total if total else 0.0), sites


def _stop_gradient_calls(sources: dict | None) -> list[dict]:
    """Lines of the user's code that call ``stop_gradient`` (where a functional node was made)."""
    import ast

    found = []
    for path, text in (sources or {}).items():
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        found += [{"file": path, "line": node.lineno} for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and getattr(node.func, "attr",
                                                            getattr(node.func, "id", None))
                  == "stop_gradient"]
    return sorted(found, key=lambda s: (s["file"], s["line"]))


def _keras_keeping_graph(model):
    """``model`` (a Keras copy) whose every call keeps the graph where your code stops it."""
    call = model.call

    def kept(*args, **kwargs):
        with _keras_stop_gradient_kept([]):
            return call(*args, **kwargs)

    model.call = kept
    return model


@contextmanager
def _keras_stop_gradient_kept(sites: list | None, symbolic: list | None = None):
    """Within the block, the user's ``stop_gradient`` calls keep the graph (None: unchanged).

    Their lines go to ``sites``; ``symbolic`` gets a mark when a functional model's
    ``stop_gradient`` node ran.
    """
    if sites is None:
        yield
        return
    import keras

    from .._interventions_keras import install_graph_keeping

    undo = install_graph_keeping(keras, sites, symbolic=symbolic)
    try:
        yield
    finally:
        for remove in reversed(undo):
            remove()
