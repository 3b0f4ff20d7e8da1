"""``optimizer_recreated``: an optimizer built inside the training loop restarts every step."""

from __future__ import annotations

from ..pitfalls.torch_lint import RESTART
from ._lint import lint_hits, loc
from .base import Probe, ProbeContext, register

MIN_BUILT = 3  # optimizers built during the run before it counts as a pattern
MAX_STEPS_EACH = 2.0  # optimizer steps per optimizer built, on average, at most


@register
class OptimizerRecreated(Probe):
    """Optimizers built during the run, counted against the optimizer steps, and the lint's hint."""

    id = "optimizer_recreated"
    categories = ("gradient_instability", "loss_not_decreasing", "convergence_to_wrong_solution")
    frameworks = ("torch", "none")  # Keras builds its optimizer once, in compile()
    fix = ("Build the optimizer once, before the training loop, and reuse it for every step (its "
           "state, Adam's moments or SGD's momentum, must carry over from step to step).")

    def run(self, ctx: ProbeContext):
        """Confirmed when >= 3 optimizers were built, at most 2 steps each on average.

        Otherwise a lint hit is a hypothesis (with the counts that contradict it, when measured).
        """
        hits = lint_hits(ctx, "optimizer_recreated")
        calls = ctx.run.first("calls") or {}
        built, steps = calls.get("optimizers_built"), calls.get("optimizer_steps") or 0
        counted = built is not None and steps > 0
        if not hits and not counted:
            return []
        hinted = loc(hits[0]) if hits else None
        if not counted:
            return [self.finding("training_loop", False, hits[0].message + " (optimizer "
                                 "constructions were not counted in this run)", hinted,
                                 strength=0.4)]
        each = steps / max(built, 1)
        if built >= MIN_BUILT and each <= MAX_STEPS_EACH:
            return [self.finding(
                "training_loop", True,
                f"{built} optimizers were built for {steps} optimizer steps ({each:.1f} "
                f"steps each): {RESTART}",
                calls.get("most_built_at") or hinted or ctx.ref("optimizer"),
                optimizers_built=built, optimizer_steps=steps,
                steps_per_optimizer=round(each, 2), strength=0.9)]
        if not hits:
            return []  # one optimizer, or a new one every many steps (trials, restarts)
        return [self.finding(
            "training_loop", False, hits[0].message + f" In this run, though, {built} "
            f"optimizer(s) took {steps} steps ({each:.0f} steps each): not rebuilt every step.",
            hinted, optimizers_built=built, optimizer_steps=steps, strength=0.2)]
