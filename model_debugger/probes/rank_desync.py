"""Probe ``rank_desync``: replicas that should be equal hold different weights.

Every rank of a data-parallel job applies the same averaged gradient to the same weights, so
their parameters stay equal (DDP keeps them bit-equal). The capture took a checksum of each
rank's optimizer parameters every few steps (``pcs``); the rank analysis compared them across
ranks (:mod:`model_debugger.ranks`). Checksums that differ are the direct measurement; what the
records say about the job then names the cause:

- the ranks' optimizers were built with different settings (a learning rate per rank: located
  at the optimizer's construction);
- the ranks made different numbers of optimizer steps: the update runs on some ranks only
  (located at ``optimizer.step()``);
- checksums that differed before the first update (``checksum0``): the replicas did not start
  equal (located at the model: build it from one seed, or broadcast rank 0's weights);
- they started equal and no model is a ``DistributedDataParallel``: the gradients are not
  averaged (at the model when the code called no collective, else at the update);
- else the ranks' updates differ (rank-dependent code around the optimizer step).
"""

from __future__ import annotations

from ..ranks import label
from ..records import Finding
from ..thresholds import DESYNC_REL
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
            ("rank_desync_step" in ctx.signals or bool(ctx.signals.get("rank_updates")))

    def run(self, ctx: ProbeContext) -> list[Finding]:
        """One confirmed ``training_loop`` finding, located where the replicas part."""
        sig = ctx.signals
        ranks = ctx.run.ranks
        wrapped = any((e.get("cls") in DDP) for r in ranks for e in r.of("model"))
        called = max(((r.steps[-1].get("cn") or 0) if r.steps else 0) for r in ranks)
        steps = {label(r): (r.first("calls") or {}).get("optimizer_steps") for r in ranks}
        start = sig.get("rank_desync_start")
        step = sig.get("rank_desync_step", 0)
        apart = ", ".join(f"rank {k}" for k in sig.get("rank_desync_ranks", [])) or "some ranks"
        common = dict(rank=(sig.get("rank_desync_ranks") or [None])[0],
                      rank_desync=sig.get("rank_desync"), step=step, ranks=sig.get(
                          "rank_desync_ranks", []), ddp=wrapped, collectives=called,
                      optimizer_steps=steps, start_spread=start,
                      checksums=_checksums(ranks, step))
        head = (f"The ranks' parameter checksums differ from step {step} on ({apart} apart "
                f"from rank 0, relative spread up to {sig['rank_desync']:.2g}): each rank "
                "holds a different model") if "rank_desync" in sig else (
            "The ranks do not update together: each rank ends with a different model")
        model, update = ctx.ref("model"), ctx.ref("step")
        hyper = _hyper_apart(ranks)
        if hyper:  # the update differs by design: an optimizer setting that depends on the rank
            name, values = hyper
            shown = ", ".join(f"{k}: {v}" for k, v in values.items())
            return [self.finding(
                "training_loop", True, f"{head}. The ranks' optimizers were built with different "
                f"{name} ({shown}): every rank takes a different step from the same averaged "
                "gradient.", ctx.ref("optimizer") or update or model, strength=0.95,
                **{**common, "hyper": name, "values": values})]
        counted = {(r.rank or {}).get("rank"): (r.first("calls") or {}).get("optimizer_steps")
                   for r in ranks}
        counted = {k: n for k, n in counted.items() if isinstance(n, int)}
        if len(set(counted.values())) > 1:  # some rank updates less often, or never
            shown = ", ".join(f"{k}: {n}" for k, n in steps.items())
            low = min(counted, key=lambda k: (counted[k], k if k is not None else 1 << 30))
            return [self.finding(
                "training_loop", True, f"{head}. The ranks made different numbers of optimizer "
                f"steps ({shown}): the update runs on some ranks only (a rank condition around "
                "optimizer.step()).", update or model, strength=0.95,
                **{**common, "rank": low})]
        if start is not None and start > DESYNC_REL:
            return [self.finding(
                "training_loop", True, f"{head}. They differed before the first update "
                f"(spread {start:.2g}): the replicas did not start from the same weights (built "
                "from different seeds, never broadcast from rank 0).", model, strength=0.9,
                **common)]
        if not wrapped:
            how = ("the code called no collective" if not called else
                   f"the {called} collectives the code called did not average every gradient")
            return [self.finding(
                "training_loop", True, f"{head}. They started equal, no rank's model is a "
                f"DistributedDataParallel and {how}: the gradients are not averaged, so every "
                "rank trains on its own shard alone.", model, strength=0.95, **common)]
        return [self.finding(
            "training_loop", True, f"{head}. They started equal (DDP broadcasts rank 0's "
            "weights) and their updates differ: code around the optimizer step that depends on "
            "the rank (a learning rate per rank, gradients changed after the all-reduce).",
            update or model, strength=0.85, **common)]


def _hyper_apart(ranks) -> tuple[str, dict] | None:
    """The first optimizer setting (``lr``, ``momentum``, ...) that differs across ranks."""
    built = {label(r): (r.first("optimizer") or {}).get("hyper") or {} for r in ranks}
    if len(built) < 2 or not all(built.values()):
        return None
    for name in sorted(set.intersection(*(set(h) for h in built.values()))):
        values = {k: h[name] for k, h in built.items()}
        if len({repr(v) for v in values.values()}) > 1:
            return name, values
    return None


def _checksums(ranks, step: int) -> dict:
    out = {}
    for r in ranks:
        for s in r.steps:
            if s.get("i") == step and "pcs" in s:
                out[label(r)] = s["pcs"]
    return out
