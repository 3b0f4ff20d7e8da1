"""What a model is made of, for probes of either framework (no framework imported here)."""

from __future__ import annotations

import numpy as np

EMBEDDINGS = ("Embedding", "EmbeddingBag")  # torch's and Keras' lookup layers (not PatchEmbedding)


def keras_layers(model) -> list:
    """Every layer of a Keras model, nested ones too (outer ones first, in order)."""
    out, stack = [], list(getattr(model, "layers", None) or [])
    while stack:
        layer = stack.pop(0)
        out.append(layer)
        stack.extend(getattr(layer, "layers", None) or [])
    return out


def parts(model) -> list:
    """A PyTorch model's modules or a Keras model's layers (empty for None)."""
    if model is None:
        return []
    if hasattr(model, "modules") and callable(model.modules):
        return list(model.modules())
    return keras_layers(model)


def token_ids(ctx) -> bool:
    """Whether the inputs are integer ids an embedding looks up (their scale means nothing).

    Integer inputs (or integral floats) to a model holding an embedding layer: a vocabulary
    index of 9000 is no feature 9000 times another's, nor nearer to 8999 than to 3. Integer
    inputs of a model without one (counts, prices read as ``int64``) are features.
    """
    xy, model = getattr(ctx, "train_xy", None), getattr(ctx, "model", None)
    x = xy[0] if xy is not None else None
    if x is None or model is None:
        return False
    try:  # integral values (a framework may hand them over as floats)
        values = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
        integer = np.issubdtype(values.dtype, np.integer) or (
            np.issubdtype(values.dtype, np.floating) and np.isfinite(values).all()
            and bool((values == np.round(values)).all()))
    except (TypeError, ValueError):
        return False
    return integer and any(type(m).__name__ in EMBEDDINGS for m in parts(model))
