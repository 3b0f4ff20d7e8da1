"""Probe ``step_overhead``: the line of the loop where a step's own time goes.

A step is data loading, forward, backward and the optimizer step, and the rest: what the loop
does itself every step. When that rest dominated the first steps, the capture sampled the
training thread while it was outside those four and counted the user's line it was on
(``step_overhead`` event, :mod:`~model_debugger.capture.sampler`). The line holding most of those
samples is where the time goes: a direct measurement, no threshold on the code.
"""

from __future__ import annotations

import os

from ..records import Finding
from ..thresholds import OVERHEAD_SHARE
from .base import Probe, ProbeContext, register, setting_location

LINE_SHARE = 0.5  # of the idle samples on one line: that line is the stall
# the settings of a library's callbacks (and of a Hugging Face trainer's own periodic work)
# that decide how often they run: a finding is located where the one passed was set
FREQUENCY = {"ModelCheckpoint": ("save_freq", "every_n_train_steps"),
             "TensorBoard": ("update_freq",), "checkpoint saving": ("save_steps", "save_strategy"),
             "evaluation": ("eval_steps", "eval_strategy")}


@register
class StepOverhead(Probe):
    """Where the loop's own per-step time is spent (sampled lines)."""

    id = "step_overhead"
    categories = ("performance_issue",)
    needs_live = False
    frameworks = ("torch", "keras", "none")
    fix = ("Take the blocking work out of the per-step path: do it every N steps, after the "
           "epoch, or asynchronously (logging, checkpoints, syncs, host copies, sleeps).")

    def applies(self, ctx: ProbeContext) -> bool:
        """When the run measured the loop's own time per step."""
        return super().applies(ctx) and "step_overhead_share" in ctx.signals

    def run(self, ctx: ProbeContext) -> list[Finding]:
        """A confirmed ``training_loop`` finding at the line holding most of the loop's time."""
        share = ctx.signals["step_overhead_share"]
        ms = ctx.signals.get("step_overhead_ms", 0.0)
        if share < OVERHEAD_SHARE:
            return []
        heavy = _heaviest_callback(ctx.run, ms)
        if heavy is not None:
            cb, per_step = heavy
            where = {"file": cb["file"], "line": cb["line"]} if cb.get("file") else \
                ctx.ref("fit") or ctx.ref("step")
            for keyword in FREQUENCY.get(cb["cls"], ()):  # the setting that makes it run
                found = setting_location(where, keyword)  # every step, where it was set
                if found is not where:
                    where = found
                    break
            return [self.finding(
                "training_loop", True,
                f"{share:.0%} of each step ({ms:.1f} ms median) is spent outside the model's "
                f"work, and {per_step:.1f} ms a step of it in {cb['cls']} (measured over "
                f"{cb['calls']} calls): it runs every step. Do it every N steps or at the end "
                "of each epoch (Keras ModelCheckpoint save_freq='epoch', TensorBoard "
                "update_freq='epoch'; Lightning every_n_train_steps; Hugging Face save_steps, "
                "eval_steps, logging_steps).",
                where, strength=0.9, callback=cb["cls"], callback_ms_per_step=round(per_step, 3),
                step_overhead_share=share, step_overhead_ms=ms)]
        sampled = ctx.run.first("step_overhead") or {}
        lines = sampled.get("lines") or []
        common = dict(step_overhead_share=share, step_overhead_ms=ms,
                      samples=sampled.get("samples"), lines=lines)
        top = lines[0] if lines else None
        if top is None or top["share"] < LINE_SHARE:
            return [self.finding(
                "training_loop", False,
                f"{share:.0%} of each step ({ms:.1f} ms) is spent outside data loading, forward, "
                "backward and the optimizer step, but on no single line of your code"
                + (f" (the most sampled holds {top['share']:.0%})" if top else "")
                + ": spread over the loop, or inside a library it calls.",
                ctx.ref("step") or ctx.ref("backward"), strength=0.4, **common)]
        calls = sampled.get("loop_lines") or []
        call = calls[0] if calls and calls[0]["share"] >= LINE_SHARE else None
        via = call is not None and (call["file"], call["line"]) != (top["file"], top["line"])
        where = call if via else top
        return [self.finding(
            "training_loop", True,
            f"{share:.0%} of each step ({ms:.1f} ms median) is spent outside data loading, "
            f"forward, backward and the optimizer step, and {top['share']:.0%} of the "
            f"{sampled.get('samples')} samples of that time were on "
            + (f"line {top['line']} of {os.path.basename(top['file'])}, which the loop reaches "
               f"every step through this call ({call['share']:.0%} of the samples): the loop "
               "does that work every step." if via else
               "this line: the loop blocks here every step."),
            {"file": where["file"], "line": where["line"]}, strength=0.9,
            **({"spent_at": {"file": top["file"], "line": top["line"]}} if via else {}),
            **common)]


def _heaviest_callback(run, overhead_ms: float) -> tuple[dict, float] | None:
    """The callback whose batch hooks hold most of the loop's own time, and its ms a step.

    From the ``callbacks`` events of a trainer (Keras ``fit``, Lightning, Hugging Face: the
    time inside each callback's per-batch hooks, and a Hugging Face trainer's checkpoints and
    evaluations, measured directly). Only work that ran on at least half the steps can hold
    the median step's time (an evaluation once an epoch cannot), and a hook is judged by its
    median call (``typical_seconds``: a checkpoint saved every hundred batches from a hook
    called every batch is not a save every batch); None when none holds :data:`LINE_SHARE`
    of ``overhead_ms``.
    """
    best = None
    for event in run.of("callbacks"):
        steps = max(int(event.get("steps") or 0), 1)
        for cb in event.get("callbacks") or []:
            if int(cb.get("calls") or 0) < steps / 2:
                continue
            per_step = 1000.0 * float(cb.get("typical_seconds", cb.get("seconds")) or 0.0) \
                / steps
            if best is None or per_step > best[1]:
                best = (cb, per_step)
    if best is None or best[1] < LINE_SHARE * overhead_ms:
        return None
    return best
