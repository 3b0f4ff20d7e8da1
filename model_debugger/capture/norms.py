"""Per-module gradient norms in the record, bounded for models with thousands of modules.

A step event carries ``mgn``: ``{module: gradient norm}``. Up to :data:`MGN_MAX` modules every
module is in every measured step. Above that, each measured step carries a rotating window of
:data:`MGN_MAX` modules in model order (step 0 the first 64, step 1 the next 64, ...), so every
module is measured once per ``ceil(modules / MGN_MAX)`` measured steps and a step stays a few KB
whatever the model; modules with a non-finite norm are always added. The global norm ``gn``
and the ``nonfinite`` event (which module first) are computed from every parameter on every
measured step, before the window is taken. Readers (``Run.module_norms``) get NaN where a
module was not in a step's window, which the per-module medians they compute ignore.

Importing this module imports neither torch nor tensorflow.
"""

from __future__ import annotations

import math

MGN_MAX = 64  # modules per step event above which norms rotate through a window
MGN_NONFINITE = 16  # non-finite modules always added to a windowed step (at most)


def window(norms: dict[str, float], start: int) -> dict[str, float]:
    """The modules of one step's ``mgn``: all of them, or a window of :data:`MGN_MAX`.

    Parameters
    ----------
    norms : dict
        Every module's norm, in model order.
    start : int
        Position of the window (the caller advances it by :data:`MGN_MAX` each step).

    Returns
    -------
    dict
        At most ``MGN_MAX + MGN_NONFINITE`` entries.
    """
    n = len(norms)
    if n <= MGN_MAX:
        return norms
    names = list(norms)
    start %= n
    pick = names[start:start + MGN_MAX]
    if len(pick) < MGN_MAX:
        pick += names[:MGN_MAX - len(pick)]
    out = {k: norms[k] for k in pick}
    bad = 0
    for k, v in norms.items():
        if bad >= MGN_NONFINITE:
            break
        if not math.isfinite(v):
            out[k] = v
            bad += 1
    return out
