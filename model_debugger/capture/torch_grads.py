"""Measurements of gradients and weights for the PyTorch instrument (pure functions on tensors).

What they give the record: the L2 norm of each gradient (the ``gn`` and ``mgn`` of a ``step``),
the update/weight ratio (``ur``) from copies of the weights taken before a step, and the
histogram of a gradient (a ``hist`` event). No state: the instrument decides when to measure.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .torch_util import floats

UR_FULL_BYTES = 64 << 20  # weights above this are sampled for the update/weight ratio
UR_STRIDE = 17
HIST_SAMPLE = 1 << 16  # larger gradients are histogrammed on an evenly strided sample
HIST_BINS = 30


def per_module(modules: list[str], norms: list[float]) -> dict[str, float]:
    """Sum per-parameter norms into per-module norms (the root of the sum of squares)."""
    acc: dict[str, float] = {}
    for mod, n in zip(modules, norms):
        acc[mod] = acc.get(mod, 0.0) + n * n
    return {k: math.sqrt(v) for k, v in acc.items()}


def grad_norms(grads: list, host: list[int], rest: list[int]) -> list[float]:
    """L2 norm of each gradient.

    Parameters
    ----------
    grads : list of Tensor
    host, rest : list of int
        Indices measured on the host with NumPy (dense float32/float64 CPU tensors: a BLAS dot
        through a NumPy view costs a fraction of a torch kernel launch, and is faster on large
        tensors too) and with one multi-tensor norm kernel, read with one device-to-host copy.
    """
    norms = [0.0] * len(grads)
    try:
        with np.errstate(all="ignore"):  # an overflow is inf, as in torch's own norm (> 1.8e19)
            for i in host:
                a = grads[i].numpy().ravel()
                if a.dtype.itemsize < 4:  # the plan is stale (model.half() mid-run)
                    raise TypeError(a.dtype)
                norms[i] = math.sqrt(a.dot(a))
    except (RuntimeError, TypeError):  # a gradient that needs grad (create_graph=True), ...
        host, rest = [], list(range(len(grads)))
    if rest:
        with torch.no_grad():
            try:
                values = floats(torch._foreach_norm([grads[i] for i in rest]))
            except (RuntimeError, NotImplementedError):  # sparse (nn.Embedding(sparse=True))
                values = floats([torch.linalg.vector_norm(dense_values(grads[i]))
                                 for i in rest])
        for k, i in enumerate(rest):
            norms[i] = values[k]
    return norms


def on_host(t) -> bool:
    """A dense float32/float64 CPU tensor: NumPy reads it through a view, without a kernel."""
    return t.device.type == "cpu" and t.layout == torch.strided and \
        t.dtype in (torch.float32, torch.float64)


def ratio_stride(params: list) -> int:
    """The stride of the weights the update ratio is measured on: 1, or :data:`UR_STRIDE`.

    :data:`UR_STRIDE` when copying every weight would cost over :data:`UR_FULL_BYTES` of RAM:
    the ratio is then measured on every 17th weight of each tensor (a prime stride: not one
    column of each row), a copy of 6% of the weights.
    """
    size = sum(p.numel() * p.element_size() for p in params)
    return UR_STRIDE if size > UR_FULL_BYTES else 1


def _sample(p, stride: int, host: bool):
    """The weights of ``p`` compared for the ratio: all, or every ``stride``-th (a view)."""
    if host:
        a = p.detach().numpy()
        return a.ravel()[::stride] if stride > 1 else a
    t = p.detach()
    return t.reshape(-1)[::stride] if stride > 1 else t


def copy_weights(params: list, stride: int = 1) -> list:
    """Copies of the weights before a step (for the update/weight ratio).

    Host tensors are copied by NumPy (its buffers come from malloc and are reused, where a
    tensor of a few MB is freshly mapped and page-faulted on every copy); others by torch.
    With ``stride`` > 1 only every ``stride``-th weight is copied.
    """
    return [_sample(p, stride, True).copy() if on_host(p) else _sample(p, stride, False).clone()
            for p in params]


def update_ratio(before: list, params: list, stride: int = 1) -> float | None:
    """||weights after - weights before|| / ||weights before|| over all parameters.

    ``before`` is consumed (it ends up holding minus the update); ``stride`` as it was copied.
    """
    num = den = 0.0
    rest = []
    with np.errstate(all="ignore"):
        for b, p in zip(before, params):
            if isinstance(b, np.ndarray):
                den += float(np.vdot(b, b))
                np.subtract(b, _sample(p, stride, True), out=b)
                num += float(np.vdot(b, b))
            else:
                rest.append((b, _sample(p, stride, False)))
    if rest:
        with torch.no_grad():
            b, a = [r[0] for r in rest], [r[1] for r in rest]
            weights = floats(torch._foreach_norm(b))
            torch._foreach_sub_(b, a)
            updates = floats(torch._foreach_norm(b))
        den += sum(w * w for w in weights)
        num += sum(u * u for u in updates)
    return math.sqrt(num) / math.sqrt(den) if den > 0 else None


def dense_values(grad):
    """The stored values of a gradient: a sparse one's non-zeros (summed where repeated)."""
    if grad.layout == torch.sparse_coo:
        return grad.detach().coalesce().values()
    if grad.layout != torch.strided:  # compressed sparse layouts store no duplicates
        return grad.detach().values()
    return grad.detach()


def histogram(grad) -> dict | None:
    """The fields of a ``hist`` event for one gradient, or None (empty, or nothing finite).

    A sparse gradient's histogram is of its stored values. Above :data:`HIST_SAMPLE` values an
    evenly strided sample is histogrammed (a stride sharing no factor with a row's length: not
    one kernel tap of a conv); ``numel`` counts the values before striding, ``stride`` says k.
    """
    sparse = grad.layout != torch.strided
    g = dense_values(grad).flatten()
    numel = g.numel()
    if numel == 0:
        return None
    stride = -(-numel // HIST_SAMPLE)
    inner = numel // max(1, grad.shape[0]) if grad.dim() and not sparse else 1
    while stride > 1 and math.gcd(stride, inner) > 1:  # not one kernel tap of a conv
        stride += 1
    g = (g[::stride] if stride > 1 else g).float()
    lo, hi = torch.aminmax(g)
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi)):  # rare: copy the finite values
        g = g[torch.isfinite(g)]
        if g.numel() == 0:
            return None
        lo, hi = float(g.min()), float(g.max())
    counts = torch.histc(g, bins=HIST_BINS, min=lo, max=hi if hi > lo else lo + 1e-12)
    extra = {"sparse": True} if sparse else {}
    return {"lo": lo, "hi": hi, "counts": [int(c) for c in counts.tolist()],
            "numel": int(numel), "stride": stride, **extra}
