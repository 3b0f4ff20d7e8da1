"""``recurrent_readout``: the model reads a recurrent layer's output at one early step.

``out, _ = self.gru(x)`` gives the output at every step; the state that has seen the whole
sequence is the last one (``out[:, -1]``, or ``h_n``). Reading ``out[:, 0]`` takes the state
after the first token only: the rest of the sequence never reaches the head, and the loss stays
near the constant predictor's. Measured on a fresh copy: one forward and backward over a few
kept rows shows which steps of each (one-directional) recurrent layer's output the model's
output depends on; a single step before the last is a readout of part of the sequence. Tested
by experiment: two fresh copies trained on the same rows, one as built and one whose recurrent
layer hands every step the last step's output (whatever step is read, it has seen the whole
sequence); confirmed when the second reaches a clearly lower held-out loss. Located where the
output is indexed at that step.
"""

from __future__ import annotations

import re

from ._heldout import SettingExperiment, source_line
from .base import ProbeContext, register

ROWS = 8  # rows of the probing forward
_KINDS = ("RNN", "LSTM", "GRU")


@register
class RecurrentReadout(SettingExperiment):
    """A single early step of a recurrent output read, tested by a copy given the last one."""

    id = "recurrent_readout"
    cost = 2
    frameworks = ("torch",)
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution")
    fix = ("Read the state that has seen the whole sequence: out[:, -1] (batch_first) or "
           "out[-1], or the returned h_n[-1]; with padding, the step at each row's length.")

    def applies(self, ctx: ProbeContext) -> bool:
        """A PyTorch trainer whose model reads one early step of a recurrent output."""
        return super().applies(ctx) and ctx.trainer.framework == "torch" and \
            readout(ctx.trainer) is not None

    def run(self, ctx: ProbeContext):
        """One finding; confirmed when the copy handed the last step trains clearly better."""
        found = readout(ctx.trainer)
        if found is None:
            return []
        name, step, steps, axis = found
        as_built, last, confirmed = self.compare(ctx, lambda m: last_step_everywhere(m, name))
        return [self.finding(
            "architecture", confirmed,
            f"The model's output depends on step {step} of the {steps} steps of the recurrent "
            f"layer {name}'s output, and on no other: it reads the state after "
            f"{step + 1} of {steps} steps, not the one that has seen the whole sequence. Two "
            f"fresh copies trained on the same rows reach a held-out loss of {last:.4g} when "
            f"every step carries the last step's output and {as_built:.4g} as built"
            + (": the readout leaves the rest of the sequence out." if confirmed else
               ": not clearly better, so the readout is not what holds it back."),
            _where(ctx, step, axis), layer=name, step_read=step, steps=steps, undone=confirmed,
            heldout_as_built=as_built, heldout_last_step=last,
            strength=0.85 if confirmed else 0.15)]


def _recurrent(model) -> dict:
    """``{name: module}`` of the model's one-directional recurrent modules."""
    return {name: m for name, m in model.named_modules()
            if type(m).__name__ in _KINDS and not getattr(m, "bidirectional", False)}


def readout(tr) -> tuple[str, int, int, int] | None:
    """``(layer, the one step read, steps, time axis)`` when the output depends on one early step.

    One forward and backward of a fresh copy over :data:`ROWS` kept rows; the gradient of the
    summed model output reaching each step of each recurrent layer's output sequence says
    which steps it depends on. None without such a layer, when it gets packed sequences, when
    several steps or the last one are read, or when the copy cannot take the rows.
    """
    import torch

    model = tr.fresh_model()
    layers = _recurrent(model)
    if not layers:
        return None
    seen: dict[str, torch.Tensor] = {}

    def keep(name):
        def hook(module, args, out):
            seq = out[0] if isinstance(out, tuple) else out
            if isinstance(seq, torch.Tensor) and seq.requires_grad and seq.dim() == 3:
                seq.retain_grad()
                seen[name] = (seq, 1 if module.batch_first else 0)
        return hook

    handles = [m.register_forward_hook(keep(n)) for n, m in layers.items()]
    try:
        out = tr.forward(model.train(), tuple(x[:ROWS] for x in tr.inputs))
        tensors = [t for t in (out if isinstance(out, (tuple, list)) else [out])
                   if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad]
        if not tensors:
            return None
        sum(t.sum() for t in tensors).backward()
    except Exception:  # noqa: BLE001 - rows the copy cannot take: nothing measured
        return None
    finally:
        for h in handles:
            h.remove()
    for name, (seq, axis) in seen.items():
        grad = seq.grad
        if grad is None or seq.shape[axis] < 4:
            continue
        per_step = grad.abs().transpose(0, axis).reshape(seq.shape[axis], -1).sum(1)
        used = [i for i, g in enumerate(per_step.tolist()) if g > 0]
        if len(used) == 1 and used[0] < seq.shape[axis] - 1:
            return name, used[0], int(seq.shape[axis]), axis
    return None


def last_step_everywhere(model, name: str):
    """``model`` whose recurrent layer ``name`` returns its last step's output at every step."""
    import torch

    module = dict(model.named_modules())[name]
    axis = 1 if module.batch_first else 0

    def hook(_module, _args, out):
        seq, rest = (out[0], out[1:]) if isinstance(out, tuple) else (out, None)
        if not isinstance(seq, torch.Tensor) or seq.dim() != 3:
            return out
        last = seq.narrow(axis, seq.shape[axis] - 1, 1).expand_as(seq)
        return (last, *rest) if rest is not None else last

    module.register_forward_hook(hook)
    return model


def _where(ctx: ProbeContext, step: int, axis: int) -> dict | None:
    """The line that indexes the output at ``step`` (``out[:, 0]``; time-major ``out[0]``)."""
    lead = r":\s*,\s*" if axis == 1 else ""
    pattern = re.compile(rf"\[\s*{lead}{step}\s*[,\]]")
    return source_line(ctx, pattern, near=ctx.ref("model")) or ctx.ref("model")
