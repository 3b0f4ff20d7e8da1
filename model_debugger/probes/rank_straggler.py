"""Probe ``rank_straggler``: which rank makes the others wait, and on what.

Ranks of a data-parallel job meet at every all-reduce, so each step lasts as long as its slowest
rank's own work (data wait, forward, the loop's own code). The rank analysis measured each rank's
own work per step (:mod:`model_debugger.ranks`); this probe splits the straggler's excess over
the other ranks' median into those three parts. The part holding most of it names the cause: a
slow input pipeline on that rank (``data``), a slower forward for the same code (``hardware``: a
slower or shared device; escalated, not patched), or work only that rank does every step
(``training_loop``: logging, a checkpoint, an evaluation behind ``if rank == 0``, a sleep) at
the line the capture sampled that rank's loop on.
"""

from __future__ import annotations

import numpy as np

from ..ranks import is_straggler, label
from ..records import Finding, as_float
from .base import Probe, ProbeContext, register

PART_SHARE = 0.6  # of the straggler's excess in one part: that part is the cause


def _parts(run) -> dict[str, float]:
    """Median seconds per step of a rank's data wait, forward and loop's own work."""
    rows = [s for s in run.steps[1:] if isinstance(s.get("dt"), (int, float)) and "fw" in s]
    if not rows:
        return {}
    dw = [as_float(s.get("dw") or 0.0) for s in rows]
    fw = [as_float(s["fw"]) for s in rows]
    rest = [s["dt"] - (s.get("bz") or 0.0) - (s.get("dw") or 0.0) - (s.get("co") or 0.0)
            for s in rows]
    return {"data": float(np.median(dw)), "forward": float(np.median(fw)),
            "loop": float(np.median(np.maximum(rest, 0.0)))}


@register
class RankStraggler(Probe):
    """The straggling rank's excess own work per step, split into data, forward and loop."""

    id = "rank_straggler"
    categories = ("performance_issue",)
    needs_live = False
    fix = ("Give every rank the same work per step: move what only the straggling rank does "
           "out of the step (or do it every N steps, or asynchronously), or give its input "
           "pipeline the workers the others have.")

    def applies(self, ctx: ProbeContext) -> bool:
        """When the job has ranks and one of them straggles."""
        return super().applies(ctx) and bool(ctx.run.ranks) and is_straggler(ctx.signals)

    def run(self, ctx: ProbeContext) -> list[Finding]:
        """A finding for the straggling rank, its cause the part holding most of its excess."""
        sig = ctx.signals
        ranks = ctx.run.ranks
        slow = next((r for r in ranks if (r.rank or {}).get("rank") == sig["rank_straggler"]),
                    None)
        if slow is None:
            return []
        mine = _parts(slow)
        others = [_parts(r) for r in ranks if r is not slow]
        others = [p for p in others if p]
        if not mine or not others:
            return []
        excess = {k: mine[k] - float(np.median([p[k] for p in others])) for k in mine}
        total = sum(max(v, 0.0) for v in excess.values())
        part = max(excess, key=excess.get)
        share = max(excess[part], 0.0) / total if total > 0 else 0.0
        victims = [label(r) for r in ranks if r is not slow]
        common = dict(rank=sig["rank_straggler"], victims=victims,
                      excess_ms={k: round(v * 1000, 3) for k, v in excess.items()},
                      straggler_ms=sig["rank_straggler_ms"],
                      straggler_share=sig["rank_straggler_share"], part=part,
                      part_share=round(share, 3))
        where = f"{label(slow)} spends {sig['rank_straggler_ms']:.1f} ms more per step on its " \
                f"own work than the other ranks ({sig['rank_straggler_share']:.0%} of a step)"
        wait = f"; {', '.join(victims)} {'waits' if len(victims) == 1 else 'wait'} for it " \
               "in every all-reduce"
        confirmed = share >= PART_SHARE
        if part == "data":
            return [self.finding(
                "data", confirmed, f"{where}, {excess['data'] * 1000:.1f} ms of it waiting for "
                f"data{wait}: that rank's input pipeline is slower.",
                _ref(slow, "loader") or _ref(slow, "backward"), strength=0.85, **common)]
        if part == "forward":
            return [self.finding(
                "hardware", confirmed, f"{where}, {excess['forward'] * 1000:.1f} ms of it in "
                f"the forward pass of the same model{wait}: its device is slower or shared "
                "(or it is given larger batches).", _ref(slow, "model"), strength=0.7,
                **common)]
        overhead = slow.first("step_overhead") or {}
        sampled = overhead.get("lines") or []
        calls = overhead.get("loop_lines") or []
        top = sampled[0] if sampled else None  # where the time is spent
        call = calls[0] if calls and calls[0]["share"] >= 0.5 else None  # the loop's call to it
        via = call if call is not None and top is not None and \
            (call["file"], call["line"]) != (top["file"], top["line"]) else None
        line = {"file": top["file"], "line": top["line"]} if top else None
        return [self.finding(
            "training_loop", confirmed, f"{where}, {excess['loop'] * 1000:.1f} ms of it in the "
            f"loop's own code{wait}"
            + (f"; the capture sampled that rank's loop on this line ({top['share']:.0%} of its "
               "samples)" + (f", called from the loop at {_short(via)}" if via else "") + "."
               if top else ": work only that rank does every step."),
            line or _ref(slow, "step") or _ref(slow, "backward"), strength=0.9,
            **{**common, "loop_line": via})]


def _ref(run, kind: str) -> dict | None:
    return run.refs().get(kind)


def _short(loc: dict) -> str:
    return f"{str(loc['file']).rsplit('/', 1)[-1]}:{loc['line']}"
