"""Helpers of the PyTorch instrument: forward replay without side effects, small utils."""

from __future__ import annotations

import torch


def floats(tensors) -> list[float]:
    """Read 0-dim tensors with one device-to-host copy (one each when devices differ)."""
    try:
        return torch.stack(list(tensors)).tolist()
    except RuntimeError:  # a model spread over several devices
        return [float(t) for t in tensors]


def hyper(defaults: dict) -> dict:
    """The JSON-safe hyperparameters of an optimizer's ``defaults`` (numbers, flags, tuples)."""
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
                # only what the replay changed (BatchNorm's running statistics): an in-place
                # write bumps a buffer's version, and one the pending backward saved (BERT's
                # position_ids, an embedding's index) would then fail to back-propagate
                if n in buffers and not torch.equal(b, buffers[n]):
                    b.copy_(buffers[n])
    return (found[0] if found else None), out
