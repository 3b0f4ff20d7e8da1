"""Helpers of the PyTorch instrument: a timed DataLoader iterator, forward replay, small utils."""

from __future__ import annotations

import time

import torch


class TimedIterator:
    """Wraps a DataLoader iterator: time spent waiting in ``__next__`` is data wait."""

    def __init__(self, inner, link, loader_id: int) -> None:
        self._inner = inner
        self._link = link  # the instrument's :class:`~.patches.Link` (cut after the capture)
        self._loader_id = loader_id

    def __iter__(self):
        return self

    def __next__(self):
        t0 = time.perf_counter()
        try:
            return next(self._inner)
        finally:
            inst = self._link()
            if inst is not None:
                inst._active_loader = self._loader_id
                if self._loader_id in inst._train_loaders or not inst._train_loaders:
                    inst._data_wait += time.perf_counter() - t0

    def __len__(self):
        return len(self._inner)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def floats(tensors) -> list[float]:
    """Read 0-dim tensors with one device-to-host copy (one each when devices differ)."""
    try:
        return torch.stack(list(tensors)).tolist()
    except RuntimeError:  # a model spread over several devices
        return [float(t) for t in tensors]


def hyper(defaults: dict) -> dict:
    out = {}
    for k, v in defaults.items():
        if isinstance(v, (int, float, bool, str)) or v is None:
            out[k] = v
        elif isinstance(v, tuple) and all(isinstance(x, (int, float)) for x in v):
            out[k] = list(v)
    return out


def replay_first_nonfinite(model, args, kwargs) -> tuple[str | None, object]:
    """Re-run the last forward without side effects.

    Returns the first module with non-finite output (or None) and the model's output.
    """
    found: list[str] = []
    out = None
    handles = []

    def make_hook(name):
        def hook(module, inp, out):
            if found:
                return
            tensors = out if isinstance(out, (tuple, list)) else (out,)
            for t in tensors:
                if isinstance(t, torch.Tensor) and t.is_floating_point() \
                        and not torch.isfinite(t).all():
                    found.append(name)
                    return
        return hook

    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    rng = torch.get_rng_state()
    try:
        for name, module in model.named_modules():
            if name and not list(module.children()):
                handles.append(module.register_forward_hook(make_hook(name)))
        with torch.no_grad():
            out = model(*args, **kwargs)
    except Exception:  # noqa: BLE001 - localization is best effort
        out = None
    finally:
        for h in handles:
            h.remove()
        torch.set_rng_state(rng)
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n in buffers:
                    b.copy_(buffers[n])
    return (found[0] if found else None), out


    return None
