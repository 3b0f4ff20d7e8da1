"""``recurrent_activation``: a recurrent layer whose state is not squashed (linear, ReLU).

An LSTM, GRU or simple RNN keeps its state bounded with ``tanh``: each step's output feeds the
next, so over a long sequence an unbounded activation (``activation="linear"``, ``"relu"``,
PyTorch's ``nn.RNN(nonlinearity="relu")``) lets the state and its gradients grow geometrically
until they overflow. Measured on the live model (the recurrent layers' activations), then tested
by experiment: two fresh copies trained on the same rows, one as built and one with ``tanh``
restored in those layers; confirmed when the ``tanh`` copy reaches a clearly lower held-out loss
(or trains where the other diverges). Located where the layer was built.
"""

from __future__ import annotations

import re

from ._heldout import BETTER, SettingExperiment, heldout_loss, source_line
from .base import ProbeContext, register

_RECURRENT = ("LSTM", "GRU", "SimpleRNN", "RNN")


@register
class RecurrentActivation(SettingExperiment):
    """Recurrent layers with an unbounded activation, and a ``tanh`` copy that learns better."""

    id = "recurrent_activation"
    cost = 2
    categories = ("gradient_instability", "loss_not_decreasing")
    frameworks = ("torch", "keras")
    fix = ("Keep the recurrent layers' default tanh activation (remove activation='linear' / "
           "'relu', or nonlinearity='relu'); to bound the output instead, add an activation "
           "after the layer.")

    def applies(self, ctx: ProbeContext) -> bool:
        """With a trainer and at least one recurrent layer not squashed by ``tanh``."""
        return super().applies(ctx) and bool(unbounded(ctx.model))

    def run(self, ctx: ProbeContext):
        """One finding naming the layers; confirmed when the ``tanh`` copy is clearly better."""
        names = unbounded(ctx.model)
        # judged on the last held-out loss (a recurrent copy's evaluation over long sequences
        # costs as much as its training: not read every eighth of it)
        as_set = heldout_loss(ctx.trainer, ctx)
        squashed = heldout_loss(ctx.trainer, ctx, change=squash)
        confirmed = squashed < BETTER * as_set
        kinds = sorted({kind for kind, _ in names.values()})
        what = ", ".join(f"'{n}' ({act})" for n, (_, act) in list(names.items())[:4])
        pattern = re.compile(r"\b(?:" + "|".join(kinds) + r")\s*\(.*(?:activation|nonlinearity)")
        where = source_line(ctx, pattern, near=ctx.ref("model")) or ctx.ref("model")
        return [self.finding(
            "architecture", confirmed,
            f"The recurrent layer{'s' if len(names) > 1 else ''} {what} "
            f"{'do' if len(names) > 1 else 'does'} not squash the state with tanh: over a "
            "sequence each step multiplies it again, so it and its gradients can grow without "
            f"bound. Two fresh copies trained on the same rows reach a held-out loss of "
            f"{squashed:.4g} with tanh restored and {as_set:.4g} as built"
            + (": the unbounded activation holds the training back." if confirmed else
               ": no clearly better, so it is not what holds it back."),
            where, layers=list(names), heldout_as_built=as_set, heldout_tanh=squashed,
            undone=confirmed, strength=0.85 if confirmed else 0.2)]


def unbounded(model) -> dict[str, tuple[str, str]]:
    """``{layer name: (class, activation)}`` of the recurrent layers not squashed by ``tanh``."""
    found: dict[str, tuple[str, str]] = {}
    if model is None:
        return found
    if hasattr(model, "named_modules"):  # torch: nn.RNN(nonlinearity="relu")
        for name, module in model.named_modules():
            if type(module).__name__ == "RNN" and getattr(module, "nonlinearity", "tanh") != "tanh":
                found[name or type(module).__name__] = ("RNN", str(module.nonlinearity))
        return found
    try:
        layers = model._flatten_layers(include_self=False, recursive=True)
    except Exception:  # noqa: BLE001 - not a Keras model
        return found
    for layer in layers:
        cell = getattr(layer, "cell", None)
        act = getattr(cell, "activation", None)
        kind = type(layer).__name__
        if kind in _RECURRENT and act is not None and \
                getattr(act, "__name__", "") not in ("tanh", "softsign"):
            found[layer.name] = (kind, getattr(act, "__name__", str(act)))
    return found


def squash(model):
    """``model`` (a fresh copy) with ``tanh`` restored in its unbounded recurrent layers."""
    if hasattr(model, "named_modules"):
        for module in model.modules():
            if type(module).__name__ == "RNN" and getattr(module, "nonlinearity", "tanh") != "tanh":
                module.nonlinearity, module.mode = "tanh", "RNN_TANH"
        return model
    import keras

    for layer in model._flatten_layers(include_self=False, recursive=True):
        cell = getattr(layer, "cell", None)
        if type(layer).__name__ in _RECURRENT and cell is not None and \
                getattr(getattr(cell, "activation", None), "__name__", "tanh") not in (
                    "tanh", "softsign"):
            cell.activation = keras.activations.tanh
    return model
