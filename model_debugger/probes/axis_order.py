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

ROWS = 3  # rows of the probing forward (a size no other axis is likely to have)


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

    None unless both have the same sizes in another order, the sizes that move are all
    different from each other (an unambiguous order) and at least two differ from each other.
    """
    if len(before) != len(after) or len(before) < 2 or sorted(before) != sorted(after) or \
            tuple(before) == tuple(after):
        return None
    order = []
    for i, size in enumerate(after):
        if before[i] == size:
            order.append(i)
            continue
        found = [j for j, s in enumerate(before) if s == size and before[j] != after[j]]
        if len(found) != 1:
            return None  # two moved axes of one size: which went where is unknown
        order.append(found[0])
    return tuple(order) if sorted(order) == list(range(len(before))) else None


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

    for name, original in originals.items():
        setattr(torch.Tensor, name, wrap(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


class _Swap:
    """While a changed copy runs, the call at ``path:line`` permutes instead of re-cutting."""

    def __init__(self, path: str, line: int, order: tuple):
        self.site, self.order, self.active = (path, line), order, False

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
        if not self.active:
            return None
        frame = sys._getframe(2)
        if (frame.f_code.co_filename, frame.f_lineno) != self.site or \
                permutation(tuple(tensor.shape), tuple(out.shape)) != self.order:
            return None
        return tensor.permute(*self.order).contiguous()

    @contextmanager
    def installed(self):
        """The patch in place for the experiment (removed after it)."""
        import torch

        with _patched(torch, self._on_call):
            yield
