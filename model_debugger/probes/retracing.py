"""Probe ``retracing``: a custom loop's ``tf.function`` step traced again and again.

A ``tf.function`` builds a new graph for every new Python value it is given (a step counter,
a float learning rate, a new list): called with one each step, every step pays the trace (tens
to hundreds of milliseconds) and keeps one more graph in memory. The Keras capture counts the
traces of the step that applies gradients and where it was called from (the ``traces``
event); confirmed when it was traced at least ``MIN_TRACES`` times and on at least a quarter
of the steps, a direct measurement.
"""

from __future__ import annotations

from ..thresholds import RETRACED_MIN as MIN_TRACES
from ..thresholds import RETRACED_SHARE as SHARE
from .base import Probe, ProbeContext, register


@register
class Retracing(Probe):
    """The training step's ``tf.function`` traced on a large share of the steps."""

    id = "retracing"
    categories = ("performance_issue", "memory_issue")
    symptom = "performance_issue"  # the graphs it keeps are a side effect of the time it costs
    frameworks = ("keras", "none")  # (a loop that updates by hand names no model: "none")
    fix = ("Pass tensors, not Python numbers or new Python objects, to the tf.function "
           "(tf.constant(step), a tf.Variable for the rate), or declare its input_signature / "
           "use reduce_retracing=True, so it is traced once.")

    def applies(self, ctx: ProbeContext) -> bool:
        """When the capture counted traces of a custom loop's step."""
        return super().applies(ctx) and bool(ctx.run.of("traces"))

    def run(self, ctx: ProbeContext):
        """One confirmed finding when the step was traced on a large share of the steps."""
        e = ctx.run.of("traces")[-1]
        count, steps = int(e.get("count") or 0), int(e.get("steps") or len(ctx.run.steps) or 0)
        if count < MIN_TRACES or not steps or count < SHARE * steps:
            return []
        where = {"file": e["file"], "line": e["line"]} if e.get("file") and \
            isinstance(e.get("line"), int) else ctx.ref("step")
        return [self.finding(
            "training_loop", True,
            f"The training step's tf.function was traced {count} times in {steps} "
            + ("calls (it updates the weights itself)" if _by_hand(ctx) else
               "optimizer steps" if ctx.run.first("unapplied") is None else "calls")
            + ": each call with a new Python value (a step counter, a float, a new object) "
            "builds a new graph, so every step pays the trace and keeps one more graph in "
            "memory. Pass tensors (tf.constant(step)) or fix its input_signature.",
            where, traces=count, steps=steps, strength=0.85, decisive=True)]


def _by_hand(ctx: ProbeContext) -> bool:
    """Whether the capture measured the loop updating half its variables itself."""
    e = ctx.run.first("unapplied") or {}
    return bool(e.get("watched")) and 2 * (e.get("updated") or 0) >= e["watched"]
