"""``unmasked_padding``: a recurrent layer reads the padding after each sequence.

Sequences of different lengths are padded to one length; padded at the end (``padding="post"``,
``row[:n] = tokens``) and fed to an LSTM / GRU / RNN with no mask (Keras ``mask_zero=True`` or a
``Masking`` layer) and no packing (PyTorch ``pack_padded_sequence``), the layer keeps stepping
through the padding, and the state the model reads at the last step is what many pad steps made
of the sequence: a short review's words are far behind it. Measured on the kept batches: the
first input's rows end with a run of all-pad steps (value 0) whose length varies from row to
row, and the model holds a recurrent layer. Tested by experiment: two fresh copies trained on
the same rows, one on them as they are and one on the same rows padded at the front instead
(each row's steps shifted to its end); confirmed when the second reaches a clearly lower
held-out loss (below the constant predictor's, where that is known). A model that masks or
packs the padding is unaffected by where it stands; one that reads ``out[:, lengths - 1]``
gets worse. Located where the padding should be kept from the layer: Keras, the embedding
(``mask_zero``); PyTorch, the recurrent module's call in ``forward`` (where it is packed).
"""

from __future__ import annotations

import math
import re

import numpy as np

from ._heldout import BETTER, as_is, heldout_variants, prior_loss, source_line
from ._layers import EMBEDDINGS, keras_layers, parts
from ._made import attribute_line
from .base import Probe, ProbeContext, register

PADDED_ROWS = 0.3  # at least this share of the rows ends with padding
PAD_SHARE = 0.1  # and the padding is at least this share of all steps
SEEDS = (5, 6)  # row samples of the experiment (the second only when the first is unclear)
_TORCH_RNN = ("RNN", "LSTM", "GRU")
_KERAS_RNN = ("LSTM", "GRU", "SimpleRNN", "RNN", "Bidirectional", "ConvLSTM1D")
_KERAS_RNN_LINE = re.compile(r"\b(?:LSTM|GRU|SimpleRNN|RNN|Bidirectional|CuDNNLSTM|CuDNNGRU)"
                             r"\s*\(")
_KERAS_EMBED_LINE = re.compile(r"\bEmbedding\s*\(")


@register
class UnmaskedPadding(Probe):
    """End-padded sequences into a recurrent layer; the padding moved to the front in a copy."""

    id = "unmasked_padding"
    cost = 2
    needs_live = True
    frameworks = ("torch", "keras")
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution")
    fix = ("Keep the recurrent layer from reading the padding: mask it (Keras: "
           "Embedding(..., mask_zero=True) or a Masking layer; PyTorch: "
           "nn.utils.rnn.pack_padded_sequence with the true lengths), or pad at the front "
           "(padding='pre') so the last step the layer reads is the sequence's own.")

    def applies(self, ctx: ProbeContext) -> bool:
        """A trainer whose first input is end-padded, and a model with a recurrent layer."""
        tr = ctx.trainer
        if not (super().applies(ctx) and tr is not None and tr.n >= 40):
            return False
        if not _recurrent(ctx.model, tr.framework) or _keras_masks(ctx.model, tr.framework):
            return False
        first, target = tr.inputs[0], tr.targets
        if getattr(target, "ndim", 0) >= 2 and tuple(target.shape[:2]) == tuple(first.shape[:2]):
            return False  # a target per step (a tagger): each output is read where it stands
        if getattr(first, "ndim", 0) == 2 and not any(
                type(m).__name__ in EMBEDDINGS for m in parts(ctx.model)):
            return False  # integer steps that no embedding looks up: zeros may be data
        return padding(first) is not None and not _packs(tr)

    def run(self, ctx: ProbeContext):
        """One finding; confirmed when the front-padded copy is clearly better."""
        tr = ctx.trainer
        stats = padding(tr.inputs[0])
        if stats is None:
            return []
        prior = prior_loss(tr)
        for seed in SEEDS:
            runs, _ = heldout_variants(ctx, [as_is, front_padded], seed=seed)
            (post, _), (pre, _) = runs
            confirmed = math.isfinite(pre) and pre < BETTER * post and \
                (prior is None or pre < BETTER * prior)
            if confirmed or not (pre < post):  # (worse at the front: no second sample)
                break
        names = _recurrent(ctx.model, tr.framework)
        return [self.finding(
            "architecture", confirmed,
            f"The sequences are padded at the end: {stats['rows']:.0%} of the rows end with "
            f"padding, {stats['share']:.0%} of all steps (row lengths {stats['shortest']} to "
            f"{stats['longest']} of {stats['steps']}), and the recurrent layer "
            f"{names[0]} reads them with no mask. Two fresh copies trained on the same rows "
            f"reach a held-out loss of {pre:.4g} with the padding moved to the front and "
            f"{post:.4g} as padded"
            + (": the layer's last state is made by the padding, not by the sequence."
               if confirmed else ": not clearly better, so the padding is not what holds it "
               "back."),
            _where(ctx, names[0]), undone=confirmed, strength=0.85 if confirmed else 0.1,
            padded_rows=stats["rows"], pad_share=stats["share"], heldout_as_padded=post,
            heldout_front_padded=pre, layers=names[:4])]


def padding(x) -> dict | None:
    """How the rows of ``x`` (batch, time[, features]) end with all-zero steps; None if not.

    ``{"rows", "share", "shortest", "longest", "steps"}`` when at least :data:`PADDED_ROWS`
    of the rows end with padding, the padding is :data:`PAD_SHARE` of the steps or more, the
    padded lengths differ between rows, and more rows end with padding than start with it.
    """
    pad = _pad_steps(x)
    if pad is None:
        return None
    n, steps = pad.shape
    trailing = _trailing(pad)
    leading = _trailing(pad[:, ::-1])
    lengths = steps - trailing
    padded = trailing > 0
    if padded.mean() < PADDED_ROWS or trailing.sum() < PAD_SHARE * pad.size or \
            (padded & (lengths > 0)).sum() < 2 or \
            len(set(lengths[padded & (lengths > 0)].tolist())) < 2 or \
            (leading > 0).sum() >= padded.sum():
        return None
    real = lengths[lengths > 0]
    return {"rows": float(padded.mean()), "share": float(trailing.sum() / pad.size),
            "shortest": int(real.min()), "longest": int(real.max()), "steps": int(steps)}


def _pad_steps(x) -> np.ndarray | None:
    """``(rows, time)`` booleans: the step is all zero; None for inputs without a time axis.

    Integer ids of shape (batch, time), or floating-point steps of (batch, time, features).
    """
    try:
        a = x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
    except (TypeError, ValueError, RuntimeError):
        return None
    if a.ndim == 2 and np.issubdtype(a.dtype, np.integer) and a.shape[1] >= 4:
        return a == 0
    if a.ndim == 3 and np.issubdtype(a.dtype, np.floating) and a.shape[1] >= 4:
        return (a == 0).all(axis=2)
    return None


def _trailing(pad: np.ndarray) -> np.ndarray:
    """Per row, how many steps at the end are padding."""
    real = ~pad
    last = pad.shape[1] - 1 - np.argmax(real[:, ::-1], axis=1)  # the last real step
    return np.where(real.any(axis=1), pad.shape[1] - 1 - last, pad.shape[1])


def front_padded(inputs, target, cut):
    """The variant whose rows carry their padding at the front (same steps).

    The first input's trailing padding decides each row's shift; every input with the same
    ``(rows, steps)`` leading axes (a mask, per-step features) is moved with it.
    """
    x = inputs[0]
    pad = _pad_steps(x)
    shift = _trailing(pad)
    steps = pad.shape[1]
    source = (np.arange(steps)[None, :] - shift[:, None]) % steps  # a roll right by ``shift``
    lead = tuple(x.shape[:2])
    return tuple(_moved(a, source) if getattr(a, "ndim", 0) >= 2 and
                 tuple(a.shape[:2]) == lead else a for a in inputs), target


def _moved(a, source: np.ndarray):
    """``a`` (rows, steps, ...) with each row's steps taken from ``source``'s positions."""
    if hasattr(a, "detach"):
        import torch

        index = torch.as_tensor(source, dtype=torch.long, device=a.device)
        index = index.reshape(*index.shape, *([1] * (a.ndim - 2))).expand(a.shape)
        return torch.gather(a, 1, index)
    a = np.asarray(a)
    index = source.reshape(*source.shape, *([1] * (a.ndim - 2)))
    return np.take_along_axis(a, np.broadcast_to(index, a.shape), axis=1)


def _recurrent(model, framework: str) -> list[str]:
    """Names of the model's recurrent layers (PyTorch modules or Keras layers)."""
    if model is None:
        return []
    if framework == "torch":
        try:
            return [name or type(m).__name__ for name, m in model.named_modules()
                    if type(m).__name__ in _TORCH_RNN]
        except (AttributeError, TypeError):
            return []
    return [layer.name for layer in keras_layers(model)
            if type(layer).__name__ in _KERAS_RNN]


def _packs(tr) -> bool:
    """Whether a PyTorch model hands its recurrent layers packed sequences (one forward).

    ``pack_padded_sequence`` gives the layer each row's true length: it never steps through
    the padding, wherever it stands.
    """
    if tr.framework != "torch":
        return False
    import torch
    from torch.nn.utils.rnn import PackedSequence

    model = tr.fresh_model()
    packed: list[bool] = []

    def look(_module, args):
        packed.append(bool(args) and isinstance(args[0], PackedSequence))

    handles = [m.register_forward_pre_hook(look) for m in model.modules()
               if type(m).__name__ in _TORCH_RNN]
    try:
        with torch.no_grad():
            tr.forward(model.eval(), tuple(x[:16] for x in tr.inputs))
    except Exception:  # noqa: BLE001 - a batch the copy cannot take: judged by the experiment
        return False
    finally:
        for h in handles:
            h.remove()
    return any(packed)


def _keras_masks(model, framework: str) -> bool:
    """Whether a Keras model masks its padding (an ``Embedding(mask_zero=True)``, ``Masking``)."""
    if framework != "keras":
        return False
    return any(type(layer).__name__ == "Masking" or getattr(layer, "mask_zero", False)
               for layer in keras_layers(model))


def _where(ctx: ProbeContext, name: str) -> dict | None:
    """Where the padding should be kept from the layer.

    Keras: the ``Embedding`` (``mask_zero``), else the recurrent layer. PyTorch: the call of
    the recurrent module in ``forward`` (where the sequence is packed), else where it is built.
    """
    model = ctx.ref("model")
    if ctx.framework != "torch":
        return source_line(ctx, _KERAS_EMBED_LINE, near=model) or \
            source_line(ctx, _KERAS_RNN_LINE, near=model) or model
    attr = name.split(".")[0]
    called = source_line(ctx, re.compile(rf"\bself\.{re.escape(attr)}\s*\("), near=model)
    if called is not None:
        return called
    source = ctx.source_files.get(model["file"]) if model and model.get("file") else None
    line = attribute_line(source, model.get("line"), attr) if isinstance(source, str) else None
    return {**model, "line": line} if line else model
