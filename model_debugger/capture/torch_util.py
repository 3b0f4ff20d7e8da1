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


# the graph nodes whose operation leaves the finite numbers: the saved input that was out of
# its domain (a log of 0 or of a negative, a division by 0, a square root of a negative) or the
# saved result that overflowed (an exponential)
_DOMAIN = {"LogBackward0": ("log", "_saved_self", "nonpositive"),
           "Log2Backward0": ("log", "_saved_self", "nonpositive"),
           "Log10Backward0": ("log", "_saved_self", "nonpositive"),
           "DivBackward0": ("division", "_saved_other", "zero"),
           "SqrtBackward0": ("sqrt", "_saved_result", "nonfinite"),
           "ExpBackward0": ("exp", "_saved_result", "nonfinite")}
_GRAPH_NODES = 2000


def nonfinite_op(loss) -> dict | None:
    """The operation in ``loss``'s graph, nearest the loss, that left the finite numbers.

    ``{"op": "log", "bad": n}``: a log whose input held ``n`` values <= 0 (``division``: a
    denominator with zeros; ``sqrt``, ``exp``: a non-finite result). Read from the tensors the
    graph saved for backward, before backward frees them; None when none is out of its domain.
    """
    seen, queue = set(), [getattr(loss, "grad_fn", None)]
    while queue and len(seen) < _GRAPH_NODES:
        node = queue.pop(0)
        if node is None or node in seen:
            continue
        seen.add(node)
        kind = _DOMAIN.get(type(node).__name__)
        if kind is not None:
            try:
                saved = getattr(node, kind[1])
                if isinstance(saved, torch.Tensor) and saved.is_floating_point():
                    with torch.no_grad():
                        bad = {"nonpositive": saved <= 0, "zero": saved == 0,
                               "nonfinite": ~torch.isfinite(saved)}[kind[2]]
                        count = int(bad.sum())
                    if count:
                        return {"op": kind[0], "bad": count}
            except (RuntimeError, AttributeError):  # freed, or not saved under this name
                pass
        queue.extend(f for f, _ in node.next_functions)
    return None
