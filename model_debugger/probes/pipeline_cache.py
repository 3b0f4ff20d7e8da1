"""``pipeline_cache``: a ``tf.data`` cache over a dataset that never ends.

Measured by the capture (the ``cache_unbounded`` event): ``Dataset.cache()`` applied after
``.repeat()`` (or over any infinite dataset) keeps every element the pipeline yields, epoch
after epoch, and never completes; augmented batches are each new, so memory grows for the
whole run. A direct measurement of the pipeline, confirmed when the run's memory grew, located
at the ``cache()`` call.
"""

from __future__ import annotations

from .base import Probe, ProbeContext, register


@register
class PipelineCache(Probe):
    """An in-memory ``tf.data`` cache over an infinite dataset, on a run whose memory grew."""

    id = "pipeline_cache"
    categories = ("memory_issue",)
    frameworks = ("keras",)
    fix = ("Cache before repeat() (and before random augmentation): "
           "ds.cache().shuffle(...).map(augment).batch(...).repeat(), or drop cache().")

    def applies(self, ctx: ProbeContext) -> bool:
        """When the capture saw such a cache."""
        return super().applies(ctx) and ctx.run.first("cache_unbounded") is not None

    def run(self, ctx: ProbeContext):
        """One finding, confirmed when the cache is in memory and the process grew."""
        e = ctx.run.first("cache_unbounded")
        grew = ctx.signals.get("rss_growth_mb")
        confirmed = bool(e.get("in_memory")) and isinstance(grew, (int, float)) and grew > 0
        return [self.finding(
            "data", confirmed,
            "The input pipeline caches a dataset that never ends (cache() after repeat()): "
            "every element it yields, each epoch's batches again, is kept "
            + ("in memory" if e.get("in_memory") else "in the cache file")
            + " and the cache never completes"
            + (f"; the process grew by {grew:.0f} MB over the run." if confirmed else ".")
            + " Cache before repeat() and before random augmentation.",
            e.get("location") or ctx.ref("fit"), in_memory=e.get("in_memory"),
            rss_growth_mb=grew, strength=0.9, decisive=confirmed)]
