"""``data_mutated``: a dataset whose item access changes the data it stores.

``x = self.signals[idx]`` is a view of the stored array; a transform that works in place on it
(``x.sub_(mean).div_(std)``, ``x -= mean``) changes the stored row, so every epoch transforms
the previous epoch's result again: standardised twice, the inputs collapse to a constant and
the loss stops falling after the first epoch. Measured on a copy of the training dataset: its
stored tensors' version counters and read-only copies of its arrays show whether reading a
few items wrote to them, and the in-place call that did (a tensor method ending in ``_`` on
the stored data, or the write a read-only array refused) is where the finding is located.
Decisive: reading an item must not change the data.
"""

from __future__ import annotations

import ast
import copy

import numpy as np

from .base import Probe, ProbeContext, register

ITEMS = 8  # items read from the copy
MAX_BYTES = 256 * 2**20  # a dataset storing more is not copied


@register
class DataMutated(Probe):
    """Reading items of the training dataset writes to the arrays it stores."""

    id = "data_mutated"
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution",
                  "gradient_instability", "overfitting")
    needs_live = True
    frameworks = ("torch",)
    traces_origin = False  # located at the in-place call
    fix = ("Transform a copy, not the stored data: x = self.data[idx].clone() (numpy: .copy()) "
           "before an in-place operation, or write the transform out of place "
           "(x = (x - mean) / std).")

    def applies(self, ctx: ProbeContext) -> bool:
        """With the training ``DataLoader``'s map-style dataset (one that stores its data)."""
        if not super().applies(ctx):
            return False
        dataset = _dataset(ctx)
        return not hasattr(dataset, "shape") and hasattr(dataset, "__dict__") and \
            callable(getattr(dataset, "__getitem__", None)) and \
            callable(getattr(dataset, "__len__", None))  # (an array or tensor stores nothing
        # it could write to apart from itself)

    def run(self, ctx: ProbeContext):
        """One decisive finding when reading items of a copy changed its stored data."""
        dataset = _dataset(ctx)
        if _stored_bytes(dataset) > MAX_BYTES:
            return []
        try:
            twin = copy.deepcopy(dataset)
        except Exception:  # noqa: BLE001 - a dataset that cannot be copied: not read
            return []
        changed, where = _read(twin, min(ITEMS, len(twin)))
        if not changed:
            return []
        names = ", ".join(sorted(changed)[:4])
        return [self.finding(
            "data", True,
            f"Reading {min(ITEMS, len(twin))} items of a copy of the training dataset changed "
            f"the data it stores ({names}): an operation works in place on a view of the "
            "stored rows, so every epoch transforms what the last one left (standardised again "
            "and again, the inputs drift or collapse).",
            where or ctx.ref("loader"), strength=0.95, decisive=True, stored=sorted(changed))]


def _dataset(ctx: ProbeContext):
    """The training loader's dataset (kept by the capture when the loader is gone)."""
    found = getattr(ctx.train_loader, "dataset", None)
    return ctx.train_dataset if found is None else found


def _stored(obj, depth: int = 0):
    """``(name, value)`` of the tensors and arrays ``obj`` stores (nested datasets too)."""
    import torch

    for name, value in list(vars(obj).items()) if hasattr(obj, "__dict__") else ():
        if isinstance(value, (torch.Tensor, np.ndarray)):
            yield name, value
        elif depth < 2 and hasattr(value, "__getitem__") and hasattr(value, "__dict__") and \
                not isinstance(value, type):
            yield from ((f"{name}.{n}", v) for n, v in _stored(value, depth + 1))


def _stored_bytes(obj) -> int:
    total = 0
    for _, value in _stored(obj):
        total += value.nbytes if isinstance(value, np.ndarray) else \
            value.numel() * value.element_size()
    return total


def _read(dataset, n: int) -> tuple[set[str], dict | None]:
    """Names of the stored data reading ``n`` items changed, and the line that changed them."""
    import sys

    import torch
    from torch.overrides import TorchFunctionMode

    from ..capture.codeloc import traceback_location, user_location

    stored = list(_stored(dataset))
    arrays = [(name, a) for name, a in stored if isinstance(a, np.ndarray) and a.flags.writeable
              and a.dtype.kind == "f"]
    tensors = [(name, t, t._version) for name, t in stored
               if isinstance(t, torch.Tensor) and t.is_floating_point()]
    spans = [(name, t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
             for name, t, _ in tensors if t.numel()]
    spans += [(name, a.ctypes.data, a.nbytes) for name, a in arrays if a.size]  # (a tensor
    # made with torch.from_numpy shares an array's memory, whatever its read-only flag)
    found: list[dict] = []
    hit: set[str] = set()

    def owner(t) -> str | None:
        at = t.data_ptr()
        return next((name for name, lo, n in spans if lo <= at < lo + n), None)

    class InPlace(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name in _IN_PLACE and args and isinstance(args[0], torch.Tensor) and \
                    args[0].numel() and args[0].is_floating_point():
                stored_as = owner(args[0])
                if stored_as is not None:
                    hit.add(stored_as)
                    where = user_location(sys._getframe(1))
                    if where is not None:
                        found.append(where)
            return func(*args, **(kwargs or {}))

    changed: set[str] = set()
    for _, a in arrays:
        a.flags.writeable = False
    try:
        with InPlace():
            for i in range(n):
                try:
                    dataset[i]
                except ValueError as exc:  # a read-only array refused an in-place write
                    where = traceback_location(exc.__traceback__)
                    if "read-only" in str(exc) and _arithmetic_at(where):
                        changed.add(_written(where, arrays))
                        found.append(where)
                        break
                    return set(), None  # (a cache filled by item assignment is no drift)
                except Exception:  # noqa: BLE001 - an item the copy cannot read: no verdict
                    return set(), None
    finally:
        for _, a in arrays:
            try:
                a.flags.writeable = True
            except ValueError:
                pass
    changed |= hit  # in-place arithmetic on the stored data (a cache filled by copy_ or item
    # assignment is not counted)
    return changed, next((f for f in found if f), None)


# in-place arithmetic a transform applies to a value (``x.sub_(m)``, ``x -= m``): not a copy
# into a buffer (``copy_``, ``fill_``, ``index_put_``)
_IN_PLACE = {"__iadd__", "__isub__", "__imul__", "__itruediv__", "__idiv__", "__ipow__",
             "add_", "sub_", "mul_", "div_", "true_divide_", "pow_", "neg_", "abs_", "exp_",
             "log_", "sqrt_", "rsqrt_", "clamp_", "clip_", "addcmul_", "addcdiv_", "lerp_",
             "sigmoid_", "tanh_", "relu_", "reciprocal_", "square_", "floor_", "round_"}


def _written(where: dict | None, arrays: list) -> str:
    """The stored array the statement at ``where`` writes to, by the name it reads it by."""
    from ..provenance import _nodes_at

    names = {n.attr for n in _nodes_at(where) if isinstance(n, ast.Attribute)} if where else set()
    return next((name for name, _ in arrays if name.split(".")[-1] in names),
                arrays[0][0] if arrays else "an array")


def _arithmetic_at(where: dict | None) -> bool:
    """Whether the statement at ``where`` changes a value in place by arithmetic.

    An augmented assignment (``x -= mean``) or an in-place method (``np.subtract(x, m,
    out=x)``, ``x.clip(0, 1, out=x)``), not an item assignment (``self.cache[i] = v``).
    """
    from ..provenance import _nodes_at

    nodes = list(_nodes_at(where)) if where else []
    return any(isinstance(n, ast.AugAssign) for n in nodes) or any(
        isinstance(n, ast.keyword) and n.arg == "out" for n in nodes)
