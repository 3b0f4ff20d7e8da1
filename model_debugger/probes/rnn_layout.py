"""``rnn_layout``: a recurrent layer reads the batch axis as time (``batch_first`` left False).

``nn.GRU`` / ``nn.LSTM`` / ``nn.RNN`` take ``(time, batch, features)`` unless built with
``batch_first=True``; a loader yields ``(batch, time, features)``. Fed that, the layer runs
across the rows of the batch as if they were the steps of one sequence (each "sequence" is one
time step of every row), and reads ``out[:, -1]`` from the last row: nothing it learns is about
the sequences. Measured on a fresh copy: a forward pass over a few kept rows shows a recurrent
layer without ``batch_first`` whose input's first axis is the number of rows given; then two
fresh copies are trained on the same rows, as built and with ``batch_first`` set on those
layers. Confirmed when the second reaches a clearly lower held-out loss, located where the
layer was built.
"""

from __future__ import annotations

from ._heldout import SettingExperiment
from ._made import attribute_line
from .base import ProbeContext, register

ROWS = 7  # rows of the probing forward: an odd count few sequences are as long as


@register
class RnnLayout(SettingExperiment):
    """Recurrent layers fed ``(batch, time, ...)`` without ``batch_first``, tested on copies."""

    id = "rnn_layout"
    cost = 2
    frameworks = ("torch",)
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution", "overfitting")
    fix = ("Build the recurrent layer with batch_first=True (your batches are (batch, time, "
           "features)), or give it (time, batch, features).")

    def run(self, ctx: ProbeContext):
        """One finding when a recurrent layer reads the rows as time; confirmed by copies."""
        tr = ctx.trainer
        if tr is None or tr.framework != "torch" or tr.n < 16:
            return []
        names = time_major_reads(tr)
        if not names:
            return []
        as_set, flipped, confirmed = self.compare(ctx, lambda m: batch_first(m, names))
        return [self.finding(
            "architecture", confirmed,
            f"The recurrent layer{'s' if len(names) > 1 else ''} {', '.join(names)} "
            f"{'are' if len(names) > 1 else 'is'} built without batch_first=True and "
            f"given inputs whose first axis is the batch: {ROWS} rows in, {ROWS} time steps "
            "read, so it runs across the rows of the batch instead of along each sequence. "
            f"Two fresh copies trained on the same rows reach a held-out loss of {flipped:.4g} "
            f"with batch_first=True and {as_set:.4g} as built"
            + (": the layout holds the model back." if confirmed else
               ": not clearly better, so the layout is not what holds it back."),
            self._where(ctx, names[0]), layers=names, heldout_as_built=as_set,
            heldout_batch_first=flipped, undone=confirmed,
            strength=0.85 if confirmed else 0.2)]

    @staticmethod
    def _where(ctx: ProbeContext, name: str) -> dict | None:
        """The line that built the layer (``self.gru = nn.GRU(...)``), else the model's."""
        model = ctx.ref("model")
        if not model or not model.get("file"):
            return model
        source = ctx.source_files.get(model["file"])
        line = attribute_line(source, model.get("line"), name.split(".")[0]) \
            if isinstance(source, str) else None
        return {**model, "line": line} if line else model


def time_major_reads(tr) -> list[str]:
    """Names of a fresh copy's recurrent layers without ``batch_first`` fed rows as time.

    One forward pass over :data:`ROWS` kept rows: a layer whose 3-D input has ``ROWS`` on its
    first axis (and not on its second) reads the batch as its time axis.
    """
    import torch
    from torch import nn

    model = tr.fresh_model()
    seen: dict[str, tuple] = {}

    def look(name: str):
        def hook(_module, args) -> None:  # (a pre-hook that returns a value replaces the input)
            if args and isinstance(args[0], torch.Tensor):
                seen.setdefault(name, tuple(args[0].shape))
        return hook

    handles = [m.register_forward_pre_hook(look(name)) for name, m in model.named_modules()
               if isinstance(m, nn.RNNBase) and not m.batch_first]
    if not handles:
        return []
    try:
        with torch.no_grad():
            tr.forward(model, tuple(x[:ROWS] for x in tr.inputs))
    except Exception:  # noqa: BLE001 - a copy that cannot run these rows: no measurement
        return []
    finally:
        for h in handles:
            h.remove()
    return [name for name, shape in seen.items()
            if len(shape) == 3 and shape[0] == ROWS and shape[1] != ROWS]


def batch_first(model, names: list[str]):
    """``model`` (a copy) with ``batch_first`` set on the named recurrent layers."""
    modules = dict(model.named_modules())
    for name in names:
        modules[name].batch_first = True
    return model
