"""Helpers of the Keras instrument.

User code locations (autograph-aware), layer names, import state and XLA detection. Importing
this module imports neither tensorflow nor keras.
"""

from __future__ import annotations

import sys

from .codeloc import user_frame


def user_location(start=None) -> dict | None:
    """The innermost user ``file:line``; autograph's generated copies of user code are skipped."""
    frame = user_frame(start or sys._getframe(1))
    while frame is not None and "__autograph_generated" in frame.f_code.co_filename:
        frame = user_frame(frame.f_back)
    if frame is None:
        return None
    return {"file": frame.f_code.co_filename, "line": frame.f_lineno}


    return None


def layer_of(var) -> str:
    """The layer name of a variable: its path without the model prefix and the variable name."""
    path = getattr(var, "path", None) or getattr(var, "name", "?")
    parts = str(path).split(":")[0].split("/")
    if len(parts) >= 3:
        return "/".join(parts[1:-1])
    return parts[0] if len(parts) == 2 else str(path)


def initializing(name: str) -> bool:
    """True while module ``name`` is still being imported (its spec says ``_initializing``)."""
    spec = getattr(sys.modules.get(name), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def in_xla() -> bool:
    """True when the current TensorFlow graph is compiled by XLA (False when unknown)."""
    try:
        from tensorflow.python.framework import ops
        from tensorflow.python.ops import control_flow_util

        return bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))
    except Exception:  # noqa: BLE001
        return False


def fit_owner(keras):
    """The class that defines Keras' ``fit`` (the backend's trainer), where the capture patches it.

    A patch on ``keras.Model`` itself would shadow the backend's ``fit`` and call the one it
    found at install time, bypassing the capture's patch installed later on the backend class:
    every epoch's metrics and targets of the run were lost.
    """
    return next((k for k in keras.Model.__mro__ if "fit" in vars(k)), keras.Model)
