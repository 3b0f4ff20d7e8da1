"""``graph_retention``: memory growth traced to tensors that keep autograd history across steps."""

from __future__ import annotations

from ..thresholds import GRAPHS_KEPT
from ._lint import lint_hits, loc
from .base import Probe, ProbeContext, register

MIN_TENSORS = 10


def retained(namespace: dict) -> dict[str, tuple[int, int]]:
    """Containers in ``namespace`` holding tensors with autograd history: name -> (count, bytes)."""
    import torch

    found = {}
    for name, value in list(namespace.items()):
        if name.startswith("__") or not isinstance(value, (list, tuple, dict, set)):
            continue
        items = value.values() if isinstance(value, dict) else value
        count = size = 0
        for item in list(items)[:100000]:
            if isinstance(item, torch.Tensor) and item.grad_fn is not None:
                count += 1
                size += item.numel() * item.element_size()
        if count:
            found[name] = (count, size)
    return found


@register
class GraphRetention(Probe):
    """Containers of the user's namespace that keep tensors with autograd history."""

    id = "graph_retention"
    categories = ("memory_issue",)
    fix = ("Store losses with .item() (or .detach()) so tensors that carry autograd history are "
           "not kept across steps.")

    def run(self, ctx: ProbeContext):
        """Confirmed when one container holds >= 10 tensors with a ``grad_fn``.

        Or when the record measured past steps' losses kept alive (``graphs_kept``, >= 90%),
        located at the lint's line when it has one. Else each lint hit is a hypothesis.
        """
        hits = lint_hits(ctx, "graph_retention")
        namespace = ctx.namespace
        held = retained(namespace) if namespace else {}
        held = {k: v for k, v in held.items() if v[0] >= MIN_TENSORS}
        growth = ctx.signals.get("rss_slope_mb_per_step")
        if held:
            name, (count, size) = max(held.items(), key=lambda kv: kv[1][0])
            hit = next((h for h in hits if name in _line(ctx, h)), hits[0] if hits else None)
            return [self.finding(
                "training_loop", True,
                f"'{name}' holds {count} tensors that still carry autograd history "
                f"(grad_fn): each keeps its whole graph, activations included, alive across "
                f"steps, so memory grows every step"
                f"{f' ({growth:.3g} MB/step measured)' if growth is not None else ''}. Store "
                "`.item()` or `.detach()` values instead.",
                loc(hit) if hit else ctx.ref("backward"), variable=name, tensors=count,
                tensor_bytes=size, rss_mb_per_step=growth, strength=0.95)]
        kept = ctx.signals.get("graphs_kept_share")
        if kept is not None and kept >= GRAPHS_KEPT:
            seen = ctx.run.first("graphs_kept") or {}
            what, alive, checked = max(
                (("loss tensors", seen.get("alive", 0), seen.get("checked", 0)),
                 ("predictions", seen.get("outputs_alive", 0), seen.get("outputs_checked", 0))),
                key=lambda w: w[1] / w[2] if w[2] else 0.0)
            return [self.finding(
                "training_loop", True,
                f"The {what} of {alive} of {checked} past steps were still alive "
                f"{seen.get('lag')} steps later, each holding its whole autograd graph (the "
                "activations it saved): the loop keeps them, so memory grows every step"
                + (f" ({growth:.3g} MB/step measured)" if growth else "")
                + ". Store `.item()` or `.detach()` values instead.",
                loc(hits[0]) if hits else ctx.ref("backward"), graphs_kept_share=kept,
                rss_mb_per_step=growth, strength=0.9)]
        return [self.finding("training_loop", False, h.message + " (not measured)", loc(h),
                             strength=0.3) for h in hits]


def _line(ctx: ProbeContext, hit) -> str:
    text = ctx.source_files.get(hit.file, "").splitlines()
    return text[hit.line - 1] if 0 < hit.line <= len(text) else ""
