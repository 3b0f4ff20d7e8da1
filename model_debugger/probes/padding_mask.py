"""``padding_mask``: a key-padding mask that hides the tokens instead of the padding.

PyTorch's attention modules take ``key_padding_mask`` / ``src_key_padding_mask`` as True
where a position is padding, to be ignored; Hugging Face's ``attention_mask`` is the opposite
(1 where a token is real). Writing one convention for the other (``mask = tokens != PAD``)
makes every token attend to the padding only: the sequence's content never reaches the
output and the loss stays near the constant predictor's. Tested by experiment, on a model
holding ``nn.TransformerEncoder``/``Decoder`` (or their layers, or ``nn.MultiheadAttention``)
called with a boolean padding mask: two fresh copies trained on the same rows, one as built and
one whose outermost attention modules receive the inverted mask; confirmed when that copy
reaches a clearly lower held-out loss. Located where the mask passed is made.
"""

from __future__ import annotations

import re

from ._heldout import SettingExperiment, source_line
from .base import ProbeContext, register, setting_location

_MASKS = ("src_key_padding_mask", "key_padding_mask", "tgt_key_padding_mask",
          "memory_key_padding_mask")
_MODULES = ("TransformerEncoder", "TransformerDecoder", "TransformerEncoderLayer",
            "TransformerDecoderLayer", "Transformer", "MultiheadAttention")
_PASSED = re.compile(r"\b(?:src_|tgt_|memory_)?key_padding_mask\s*=")


@register
class PaddingMask(SettingExperiment):
    """The attention modules' boolean padding masks inverted in a copy."""

    id = "padding_mask"
    cost = 2
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution")
    frameworks = ("torch",)
    fix = ("Mark the padding, not the tokens: PyTorch's key_padding_mask is True where a "
           "position is padding (mask = tokens == PAD); Hugging Face's attention_mask is 1 "
           "where a token is real.")

    def applies(self, ctx: ProbeContext) -> bool:
        """A PyTorch model with attention modules that were given a boolean padding mask."""
        if not (super().applies(ctx) and _outermost(ctx.trainer.model)):
            return False
        share = _masked_share(ctx)
        return share is not None and share > 0  # (a mask that hides nothing: no padding)

    def run(self, ctx: ProbeContext):
        """One finding; confirmed when the inverted mask trains clearly better."""
        share = _masked_share(ctx)
        kept, inverted, confirmed = self.compare(ctx, _inverting)
        where = source_line(ctx, _PASSED, ctx.ref("model"))
        if where is not None:
            for keyword in _MASKS:
                traced = setting_location(where, keyword)
                if traced is not where:
                    where = traced
                    break
        return [self.finding(
            "architecture", confirmed,
            f"The attention modules are given a padding mask that hides {share:.0%} of the "
            f"positions. Two fresh copies trained on the same rows reach a held-out loss of "
            f"{inverted:.4g} with the mask inverted and {kept:.4g} as built"
            + (": the mask hides the tokens and keeps the padding (True marks the positions "
               "to ignore)." if confirmed else ": not clearly better, so the mask is right."),
            where or ctx.ref("model"), strength=0.85 if confirmed else 0.1, undone=confirmed,
            masked_share=share, heldout_as_built=kept, heldout_inverted=inverted)]


def _outermost(model) -> list:
    """The attention modules of ``model`` not inside another one (each mask inverted once)."""
    found, inside = [], set()
    for name, module in model.named_modules():
        if type(module).__name__ not in _MODULES:
            continue
        if any(name.startswith(outer + ".") for outer in inside):
            continue
        inside.add(name)
        found.append(module)
    return found


def _masked_share(ctx: ProbeContext) -> float | None:
    """The share of positions the padding masks hide on a kept batch; None without one."""
    import torch

    tr = ctx.trainer
    model = tr.fresh_model()
    seen: list[float] = []

    def look(module, args, kwargs):
        for key in _MASKS:
            mask = kwargs.get(key)
            if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.numel():
                seen.append(float(mask.float().mean()))

    handles = [m.register_forward_pre_hook(look, with_kwargs=True) for m in _outermost(model)]
    try:
        with torch.no_grad():
            tr.forward(model.eval(), tuple(x[:64] for x in tr.inputs))
    except Exception:  # noqa: BLE001 - a batch the copy cannot take: no mask seen
        return None
    finally:
        for h in handles:
            h.remove()
    return max(seen) if seen else None


def _inverting(model):
    """``model`` whose outermost attention modules receive their boolean padding masks inverted."""
    import torch

    def invert(module, args, kwargs):
        for key in _MASKS:
            mask = kwargs.get(key)
            if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
                kwargs[key] = ~mask
        return args, kwargs

    for module in _outermost(model):
        module.register_forward_pre_hook(invert, with_kwargs=True)
    return model
