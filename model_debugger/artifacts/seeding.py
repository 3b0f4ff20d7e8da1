"""Seeding, written once: Python, NumPy and every framework the run uses get the same seed."""

from __future__ import annotations

import os
import random
import sys


def _seed_keras(keras, seed: int) -> None:
    try:
        keras.utils.set_random_seed(seed)  # Python, NumPy and the backend (TensorFlow)
    except Exception as exc:  # noqa: BLE001 - an old or partial keras: the others are seeded
        print(f"model_debugger: could not seed keras: {exc}", file=sys.stderr)


def seed_everything(seed: int, lazily: bool = False) -> None:
    """Seed Python, NumPy, torch and Keras with ``seed``.

    Parameters
    ----------
    seed : int
    lazily : bool
        In a fresh process (the script's child) nothing is imported yet: each framework is
        seeded when the script imports it (and ``PYTHONHASHSEED`` is set for its children).
        Otherwise only the frameworks already imported are seeded (a kernel).
    """
    random.seed(seed)
    hooks = {"numpy": lambda np: np.random.seed(seed),
             "torch": lambda torch: torch.manual_seed(seed),
             "keras": lambda keras: _seed_keras(keras, seed)}
    if lazily:
        from ..capture.imports import when_imported

        os.environ.setdefault("PYTHONHASHSEED", str(seed))
        for name, hook in hooks.items():
            when_imported(name, hook)
        return
    for name, hook in hooks.items():
        module = sys.modules.get(name)
        if module is not None and (name != "keras" or hasattr(module, "utils")):
            hook(module)
