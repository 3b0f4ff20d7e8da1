"""``target_offset``: token targets paired with the wrong position of the model's input.

A language model is trained to predict, at each position, the token after it. The capture
reads the first training cross-entropy whose targets are a row of token ids per input row
(``target_offset`` event): the share of targets equal to the input token 0, 1, 2 or 3
positions on. Labels shifted by hand and then given to a model that shifts them again
(``labels=ids[:, 1:]`` into a Hugging Face causal LM) pair each position with the token after
next (offset 2); targets not shifted at all ask for the token the position is given (offset
0), which it copies. Whether the model sees later positions is measured on a copy: a token
changed further on leaves the earlier outputs alone in a causal model. Any offset but 1 is
wrong for a causal model; 1 for one that sees the whole sequence (the target is in its
input). An encoder-decoder, or a model whose causality cannot be measured, is not judged.
Decisive; located where the targets were made.
"""

from __future__ import annotations

from .base import Probe, ProbeContext, register

PAIRED = 0.9  # at least this share of the targets equal the input token at one offset


@register
class TargetOffset(Probe):
    """Targets that are the input tokens at an offset next-token prediction does not use."""

    id = "target_offset"
    categories = ("convergence_to_wrong_solution", "loss_not_decreasing", "overfitting",
                  "healthy")
    reveals = "convergence_to_wrong_solution"  # a copy task's loss falls to ~0: looks healthy
    symptom = "convergence_to_wrong_solution"  # the loss falls, the next-token metric does not
    frameworks = ("torch",)
    traces_origin = False  # located at the targets' origin below
    fix = ("Pair each position with the next token once: either shift the targets yourself "
           "(inputs = ids[:, :-1], targets = ids[:, 1:]) and compute the loss on the logits, "
           "or give a causal LM labels=input_ids and let it shift them.")

    def run(self, ctx: ProbeContext):
        """One decisive finding when the targets sit at an offset the model cannot use."""
        seen = ctx.run.first("target_offset")
        if not seen or not seen.get("matches"):
            return []
        matches = {int(k): float(v) for k, v in seen["matches"].items()}
        offset = max(matches, key=matches.get)
        if matches[offset] < PAIRED:
            return []
        config = getattr(ctx.model, "config", None)
        if getattr(config, "is_encoder_decoder", False):
            return []  # (labels read against the encoder's input: another sequence)
        causal = _causal(ctx.model, seen.get("length"), seen.get("classes")) \
            if ctx.live else None
        if not (causal is True and offset != 1 or causal is False and offset == 1):
            return []  # (a model that reads the whole sequence pairs positions as it likes,
            # an autoencoder its input with itself)
        what = {0: "the token each position is given: the model learns to copy its input",
                1: "the next token, which a model that reads the whole sequence sees in its "
                   "input",
                }.get(offset, f"the token {offset} positions on: labels shifted "
                              f"{offset} times where next-token prediction wants 1")
        where = _where(ctx, seen.get("location"))
        from ..provenance import in_data_pipeline

        return [self.finding(
            "data" if in_data_pipeline(where) else "training_loop", True,
            f"{matches[offset]:.0%} of {seen.get('counted')} training targets equal the input "
            f"token {offset} position{'s' if offset != 1 else ''} on, so each position is "
            f"asked for {what}"
            + (" (the model is causal: a token changed further on leaves earlier outputs "
               "alone)" if causal else "") + ".",
            where, strength=0.95, decisive=True, offset=offset, matches=matches,
            causal=causal)]


def _causal(model, length, classes) -> bool | None:
    """Whether a copy of ``model``'s outputs at a position ignore later tokens (None: unknown)."""
    import torch

    from ..trainers.torch import copy_model

    if model is None or not isinstance(length, int) or not isinstance(classes, int) or \
            length < 4 or classes < 2:
        return None
    try:
        m = copy_model(model).to("cpu").eval()
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, classes, (2, length), generator=g)
        y = x.clone()
        cut = length // 2
        y[:, cut + 1:] = (y[:, cut + 1:] + 1) % classes
        with torch.no_grad():
            a, b = _logits(m(x)), _logits(m(y))
    except Exception:  # noqa: BLE001 - a model that takes other inputs: not known
        return None
    if a is None or b is None or a.shape[:2] != (2, length):
        return None
    return bool(torch.allclose(a[:, :cut + 1], b[:, :cut + 1], atol=1e-5))


def _logits(out):
    import torch

    if isinstance(out, torch.Tensor):
        return out
    found = getattr(out, "logits", None)
    if isinstance(found, torch.Tensor):
        return found
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


def _where(ctx: ProbeContext, used: dict | None) -> dict | None:
    """Where the targets given at ``used`` (the model or loss call) were made.

    Followed back in the file; a ``labels=batch["labels"]`` over a loader's batches is made
    in the dataset's ``__getitem__`` that returns that key.
    """
    from ..provenance import data_origin, item_origin

    return item_origin(used) or data_origin(used, "targets") or used
