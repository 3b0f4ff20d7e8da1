"""Shared optimisation knowledge (framework-agnostic): learning-rate ranges, batch size, memory.

Typical ranges are starting points seen across common practice, not rules; probes use them only
to phrase a hypothesis when nothing could be measured.
"""

from __future__ import annotations

# optimizer (lower-cased class name) -> typical learning-rate range
TYPICAL_LR: dict[str, tuple[float, float]] = {
    "sgd": (1e-4, 0.5),
    "adam": (1e-5, 1e-2),
    "adamw": (1e-5, 1e-2),
    "rmsprop": (1e-5, 1e-2),
    "adagrad": (1e-3, 0.5),
    "adadelta": (0.1, 10.0),
    "nadam": (1e-5, 1e-2),
    "radam": (1e-5, 1e-2),
    "lbfgs": (0.01, 1.0),
}


def typical_lr(optimizer: str) -> tuple[float, float] | None:
    """The typical learning-rate range of an optimizer class name, or None if unknown."""
    return TYPICAL_LR.get(optimizer.lower())


def lr_outside_typical(optimizer: str, lr: float, margin: float = 10.0) -> str | None:
    """``"high"``/``"low"`` when ``lr`` is over ``margin`` times outside the typical range."""
    rng = typical_lr(optimizer)
    if rng is None or lr <= 0:
        return None
    if lr > rng[1] * margin:
        return "high"
    if lr < rng[0] / margin:
        return "low"
    return None


def batch_that_fits(bytes_per_sample: float, available: float, fixed: float = 0.0) -> int:
    """The largest batch whose activations fit in ``available`` bytes after ``fixed`` ones."""
    if bytes_per_sample <= 0:
        return 0
    return max(0, int((available - fixed) / bytes_per_sample))
