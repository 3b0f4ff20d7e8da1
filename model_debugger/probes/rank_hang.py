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

from ..ranks import label, last_collective
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
        """One confirmed ``training_loop`` finding at the missing rank's last line."""
        sig = ctx.signals
        missing = sig["rank_hang_missing"]
        by_rank = {(r.rank or {}).get("rank"): r for r in ctx.run.ranks}
        places = {label(r): last_collective(r) for r in ctx.run.ranks}
        gone = by_rank.get(missing[0])
        stall = (gone.of("stall") or [None])[-1] if gone is not None else None
        waiter = by_rank.get((sig.get("rank_hang_waiting") or [None])[0])
        wait = (waiter.of("stall") or [None])[-1] if waiter is not None else None
        waited = (wait or {}).get("where")
        place = "DDP's all-reduce (in backward)" if waited == "backward" else \
            waited or "a collective"
        text = (f"{_ranks(sig['rank_hang_waiting'])} ended waiting in {place} at step "
                f"{(wait or {}).get('step')}, which {_ranks(missing)} never reached")
        if gone is None:
            text += ": that rank wrote no record (it never started, or died before training)."
            location = None
        elif stall is not None and stall.get("location"):
            text += (f": it was in its {stall.get('where')} code at step {stall.get('step')}, "
                     "on this line, instead of joining.")
            location = stall["location"]
        else:
            text += f": it ended ({places.get(label(gone))}) without joining."
            location = gone.refs().get("step") or gone.refs().get("backward")
        return [self.finding("training_loop", True, "The job hung: " + text, location,
                             strength=0.9, rank=missing[0], missing=missing,
                             waiting=sig["rank_hang_waiting"],
                             places=places)]


def _ranks(ranks: list) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
