"""``axis_order``: a ``view``/``reshape`` in the model that reorders axes instead of moving them.

``x.view(b, c, t)`` on a ``(b, t, c)`` tensor does not swap the time and channel axes: it keeps
the values in memory order and re-cuts them, so every "channel" now holds a run of consecutive
values from several time steps and channels. The model still trains, on scrambled inputs, and
settles far from what it could reach (``x.permute(0, 2, 1)`` / ``x.transpose(1, 2)`` is the
swap). Measured on one forward pass of a fresh copy: every ``view``/``reshape`` called from your
code whose result has the same axis sizes as its input in another order (the sizes of at least
two axes differ, so the order matters). Then two fresh copies are trained on the same rows: as
built, and with that call returning the input's axes permuted into the asked order. Confirmed
when the second reaches a clearly lower held-out loss; located at the call.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

from ._heldout import SettingExperiment
from .base import ProbeContext, register

ROWS = 7  # rows of the probing forward (a prime few other axes have: xyz or RGB are 3)


@register
class AxisOrder(SettingExperiment):
    """A view/reshape whose result is its input's axes reordered, tested by a permuting copy."""

    id = "axis_order"
    cost = 2
    frameworks = ("torch",)
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution", "overfitting")
    fix = ("Move axes with x.permute(...) or x.transpose(i, j) (then .contiguous() if a view "
           "follows), not x.view/x.reshape: a reshape keeps the memory order and re-cuts it.")

    def run(self, ctx: ProbeContext):
        """One finding for the first reordering call seen; confirmed by a permuting copy."""
        tr = ctx.trainer
        if tr is None or tr.framework != "torch" or tr.n < 16:
            return []
        sites = reorderings(tr, set(ctx.source_files or {}))
        if not sites:
            return []
        (path, line), (before, after, order) = next(iter(sites.items()))
        swap = _Swap(path, line, order)
        with swap.installed():
            as_set, permuted, confirmed = self.compare(ctx, swap.change)
        if not swap.fired:
            return []  # a reordering only at the probing forward's row count (x.view(-1, 3)
            # on (7, 21)): the training batches were cut otherwise
        return [self.finding(
            "architecture", confirmed,
            f"A reshape in your code turns a tensor of shape {tuple(before)} into "
            f"{tuple(after)}: the same axes in another order. A view or reshape does not move "
            f"axes, it re-cuts the values in memory order, so the model reads scrambled inputs. "
            f"Two fresh copies trained on the same rows reach a held-out loss of "
            f"{permuted:.4g} with the axes permuted (x.permute{tuple(order)}) and {as_set:.4g} "
            "as written"
            + (": the scrambled axes hold the model back." if confirmed else
               ": not clearly better, so the reshape is not what holds it back."),
            {"file": path, "line": line}, shape_in=list(before), shape_out=list(after),
            permutation=list(order), heldout_as_written=as_set, heldout_permuted=permuted,
            undone=confirmed, strength=0.85 if confirmed else 0.2)]


def permutation(before: tuple, after: tuple) -> tuple | None:
    """The axis order that makes ``after`` from ``before``, when it is a reordering.

    None unless both have the same sizes in another order, at least two of them different.
    Axes of one size keep their relative order (``(b, 32, 32, 3)`` to ``(b, 3, 32, 32)`` is
    ``(0, 3, 1, 2)``): a reshape that reorders axes moves them, it does not swap equal ones.
    """
    if len(before) != len(after) or len(before) < 2 or sorted(before) != sorted(after) or \
            tuple(before) == tuple(after):
        return None
    sources: dict[int, list[int]] = {}
    for j, size in enumerate(before):
        sources.setdefault(size, []).append(j)
    return tuple(sources[size].pop(0) for size in after)


def reorderings(tr, user_files: set[str]) -> dict[tuple[str, int], tuple]:
    """Reordering ``view``/``reshape`` calls of one forward pass of a fresh copy.

    Keyed by ``(file, line)`` of the call in ``user_files``; values ``(shape in, shape out,
    axis order)``, first seen first.
    """
    import torch

    model = tr.fresh_model().eval()
    seen: dict[tuple[str, int], tuple] = {}

    def record(tensor, out):
        frame = sys._getframe(2)
        where = (frame.f_code.co_filename, frame.f_lineno)
        if where[0] not in user_files or where in seen:
            return
        order = permutation(tuple(tensor.shape), tuple(out.shape))
        if order is not None:
            seen[where] = (tuple(tensor.shape), tuple(out.shape), order)

    with _patched(torch, record):
        with torch.no_grad():
            tr.forward(model, tuple(x[:ROWS] for x in tr.inputs))
    return seen


@contextmanager
def _patched(torch, on_call):
    """``Tensor.view``/``Tensor.reshape`` call ``on_call(tensor, result)`` (or replace it)."""
    originals = {name: getattr(torch.Tensor, name) for name in ("view", "reshape")}

    def wrap(original):
        def call(self, *shape, **kwargs):
            out = original(self, *shape, **kwargs)
            swapped = on_call(self, out)
            return out if swapped is None else swapped
        return call

    own = {name for name in originals if name in vars(torch.Tensor)}
    for name, original in originals.items():
        setattr(torch.Tensor, name, wrap(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            if name in own:
                setattr(torch.Tensor, name, original)
            else:  # (inherited from the C base: the class never held its own)
                delattr(torch.Tensor, name)


class _Swap:
    """While a changed copy runs, the call at ``path:line`` permutes instead of re-cutting."""

    def __init__(self, path: str, line: int, order: tuple):
        self.site, self.order, self.active, self.fired = (path, line), order, False, 0

    def change(self, model):
        """``model`` (a fresh copy) whose forward passes run with the swap on."""
        forward = model.forward

        def swapped(*args, **kwargs):
            self.active = True
            try:
                return forward(*args, **kwargs)
            finally:
                self.active = False

        model.forward = swapped
        return model

    def _on_call(self, tensor, out):
        """The call's input permuted, at the site during a changed copy's forward; else None."""
        if not self.active:
            return None
        frame = sys._getframe(2)
        if (frame.f_code.co_filename, frame.f_lineno) != self.site or \
                permutation(tuple(tensor.shape), tuple(out.shape)) != self.order:
            return None
        self.fired += 1
        return tensor.permute(*self.order).contiguous()

    @contextmanager
    def installed(self):
        """The patch in place for the experiment (removed after it)."""
        import torch

        with _patched(torch, self._on_call):
            yield
