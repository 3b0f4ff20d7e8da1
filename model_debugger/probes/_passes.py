"""Passes over the training data left early: read from the capture's ``passes`` event.

Shared by ``training_length`` (too few updates) and ``data_volume`` (the same first rows every
epoch): both name the loop when it leaves each pass over its loader early.
"""

from __future__ import annotations

from ..provenance import loop_exit
from .base import ProbeContext


def cut_passes(ctx: ProbeContext) -> dict | None:
    """Passes over the training loader left before it ran out, from the ``passes`` event.

    At least two passes begun after the first, and every finished pass (all but the last)
    drew fewer than half the loader's batches. Returns the batches per pass, the most a pass
    drew, the ``for`` line and the statement that left it (:func:`provenance.loop_exit`).
    """
    ev = ctx.run.first("passes") or {}
    batches, drawn = ev.get("batches"), ev.get("drawn")
    if not isinstance(batches, int) or batches < 2 or not isinstance(drawn, list) or \
            len(drawn) < 3 or not all(isinstance(d, int) for d in drawn):
        return None
    done = drawn[:-1]
    if max(done) * 2 > batches:
        return None
    loop = {"file": ev.get("file"), "line": ev.get("line")} if ev.get("file") else None
    return {"batches": batches, "drawn": max(done), "loop": loop, "exit": loop_exit(loop)}
