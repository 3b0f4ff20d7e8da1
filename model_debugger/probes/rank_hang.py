"""Probe ``rank_hang``: the rank that never joined the collective the others waited in.

A collective completes only when every rank of the group calls it. When some ranks ended waiting
in one (its timeout raised, or the job was stopped) and another never reached it, the job hung on
that rank. The capture recorded where each rank's training thread stood when it stopped making
steps (``stall`` events: the collective, ``backward`` for DDP's all-reduce, or the loop's own
code, with the user's line), so the finding names the missing rank and the line it was on
instead of joining: code that runs on some ranks only (``if rank == 0:`` around a collective or
a long evaluation), an early ``break`` or ``return`` on one rank, uneven data (one rank runs
out of batches first).
"""

from __future__ import annotations

from ..ranks import batches, comm_failed, label, last_collective
from ..records import Finding
from .base import Probe, ProbeContext, register


@register
class RankHang(Probe):
    """Where the missing rank was while the others waited in a collective."""

    id = "rank_hang"
    categories = ("performance_issue",)
    needs_live = False
    fix = ("Make every rank reach every collective in the same order: no collective (or "
           "DDP forward/backward) inside rank-dependent code, the same number of batches on "
           "every rank (DistributedSampler with drop_last), long rank-0-only work outside the "
           "steps or followed by a barrier on all ranks.")

    def applies(self, ctx: ProbeContext) -> bool:
        """When the job's ranks ended waiting for a rank that never came."""
        return super().applies(ctx) and bool(ctx.run.ranks) and \
            bool(ctx.signals.get("rank_hang"))

    def run(self, ctx: ProbeContext) -> list[Finding]:
        """One confirmed ``training_loop`` finding at the line that parted the ranks.

        That is the missing rank's line when it was stuck elsewhere (its last ``stall``); when
        it ended its script instead (it ran out of batches first, or skipped a collective), the
        waiting rank's line: the collective only some ranks reach.
        """
        sig = ctx.signals
        missing = sig["rank_hang_missing"]
        by_rank = {(r.rank or {}).get("rank"): r for r in ctx.run.ranks}
        places = {label(r): last_collective(r) for r in ctx.run.ranks}
        gone = by_rank.get(missing[0])
        waiter = by_rank.get((sig.get("rank_hang_waiting") or [None])[0])
        wait = _where(waiter)
        place = {"backward": "DDP's all-reduce (in backward)", None: "a collective"}.get(
            wait["where"], wait["where"])
        at = f" at step {wait['step']}" if wait["step"] is not None else ""
        text = (f"{_ranks(sig['rank_hang_waiting'])} ended waiting in {place}{at}, which "
                f"{_ranks(missing)} never reached")
        mine = _where(gone)
        sizes = {label(r): batches(r) for r in ctx.run.ranks}
        uneven = len({v for v in sizes.values() if v is not None}) > 1
        if uneven:  # the cause, measured: the ranks do not run the same number of batches
            shown = ", ".join(f"{k}: {v}" for k, v in sizes.items())
            text += (f". The ranks' DataLoaders hold different numbers of batches per epoch "
                     f"({shown}): a rank that runs out first leaves the others waiting in the "
                     "next all-reduce. Give every rank the same number (DistributedSampler, "
                     "drop_last=True).")
            location = (gone.refs().get("loader") if gone is not None else None) or \
                (waiter.refs().get("loader") if waiter is not None else None)
        elif gone is None:
            text += ": that rank wrote no record (it never started, or died before training)."
            location = None
        elif mine["waiting"] and mine["where"]:
            text += (f": it waited in {mine['where']} instead, after {len(gone.steps)} steps "
                     f"against {len(waiter.steps) if waiter else '?'} (the ranks called "
                     "different collectives: different numbers of batches, or a collective "
                     "behind a rank condition).")
            location = wait["location"] or mine["location"]
        elif mine["location"] and not gone.ended:
            text += (f": it was in its {mine['where']} code at step {mine['step']}, on this "
                     "line, instead of joining.")
            location = mine["location"]
        else:
            text += (f": it ended its script after {len(gone.steps)} steps (the waiting rank "
                     f"made {len(waiter.steps) if waiter else '?'}): it ran out of batches "
                     "first, or skipped a collective the others call here.")
            location = wait["location"] or gone.refs().get("loader") or \
                gone.refs().get("step")
        return [self.finding("training_loop", True, "The job hung: " + text, location,
                             strength=0.9, rank=missing[0], missing=missing,
                             waiting=sig["rank_hang_waiting"], places=places)]


def _where(run) -> dict:
    """Where a rank's record ends: the place it waited, its step, its line, whether waiting."""
    if run is None:
        return {"where": None, "step": None, "location": None, "waiting": False}
    stall = (run.of("stall") or [None])[-1]
    end = last_collective(run) or {}
    err = run.error or {}
    location = (stall or {}).get("location") if stall is not None and \
        stall.get("step") == len(run.steps) else None
    return {"where": end.get("where") or (stall or {}).get("where"),
            "step": len(run.steps), "waiting": bool(end.get("waiting")),
            "location": location or (err.get("location") if comm_failed(run) else None)}


def _ranks(ranks: list) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
