"""Probe ``rank_desync``: replicas that should be equal hold different weights.

Every rank of a data-parallel job applies the same averaged gradient to the same weights, so
their parameters stay equal (DDP keeps them bit-equal). The capture took a checksum of each
rank's optimizer parameters every few steps (``pcs``); the rank analysis compared them across
ranks (:mod:`model_debugger.ranks`). Checksums that differ are the direct measurement; what the
records say about the job then names the cause:

- no rank's model is a ``DistributedDataParallel`` and the code called no collective: the
  gradients are never averaged, each rank trains its own model (located at the model);
- checksums that differ from the first step: the replicas did not start equal (located at the
  model: build it from one seed, or broadcast rank 0's weights);
- else the ranks' updates differ (rank-dependent code around the optimizer step).
"""

from __future__ import annotations

from ..ranks import label
from ..records import Finding
from .base import Probe, ProbeContext, register

DDP = ("DistributedDataParallel", "FullyShardedDataParallel")


@register
class RankDesync(Probe):
    """Parameter checksums that differ across ranks, and what keeps the replicas apart."""

    id = "rank_desync"
    categories = ("convergence_to_wrong_solution",)
    needs_live = False
    fix = ("Keep the replicas equal: wrap the model in DistributedDataParallel (it broadcasts "
           "rank 0's weights and averages every gradient), or all-reduce each gradient and "
           "divide by the world size before optimizer.step(), on every rank alike.")

    def applies(self, ctx: ProbeContext) -> bool:
        """When the job compared checksums across ranks and they differ."""
        return super().applies(ctx) and bool(ctx.run.ranks) and \
            "rank_desync_step" in ctx.signals

    def run(self, ctx: ProbeContext) -> list[Finding]:
        """One confirmed ``training_loop`` finding, located where the replicas part."""
        sig = ctx.signals
        ranks = ctx.run.ranks
        wrapped = any((e.get("cls") in DDP) for r in ranks for e in r.of("model"))
        called = max((s.get("cn") or 0) for r in ranks for s in r.steps[-1:] or [{}])
        step = sig["rank_desync_step"]
        apart = ", ".join(f"rank {k}" for k in sig.get("rank_desync_ranks", [])) or "some ranks"
        common = dict(rank=(sig.get("rank_desync_ranks") or [None])[0],
                      rank_desync=sig["rank_desync"], step=step, ranks=sig.get(
            "rank_desync_ranks", []), ddp=wrapped, collectives=called,
            checksums=_checksums(ranks, step))
        head = (f"The ranks' parameter checksums differ from step {step} on ({apart} apart "
                f"from rank 0, relative spread up to {sig['rank_desync']:.2g}): each rank "
                "holds a different model")
        model = ctx.ref("model")
        if not wrapped and not called:
            return [self.finding(
                "training_loop", True, f"{head}. No rank's model is a "
                "DistributedDataParallel and the code called no collective: the gradients are "
                "never averaged, so every rank trains on its own shard alone.",
                model, strength=0.95, **common)]
        if step == 0:
            return [self.finding(
                "training_loop", True, f"{head} from the first step: the replicas did not "
                "start from the same weights (built from different seeds, and never "
                "broadcast from rank 0).", model, strength=0.9, **common)]
        return [self.finding(
            "training_loop", True, f"{head}. They started equal and their updates differ: "
            "code around the optimizer step that depends on the rank (a rank-only update, "
            "gradients changed after the all-reduce, a learning rate per rank).",
            ctx.ref("step") or model, strength=0.85, **common)]


def _checksums(ranks, step: int) -> dict:
    out = {}
    for r in ranks:
        for s in r.steps:
            if s.get("i") == step and "pcs" in s:
                out[label(r)] = s["pcs"]
    return out
