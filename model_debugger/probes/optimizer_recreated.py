"""``optimizer_recreated``: an optimizer built inside the training loop restarts every step."""

from __future__ import annotations

from ._lint import lint_hits, loc
from .base import Probe, ProbeContext, register

MIN_BUILT = 3  # optimizers built during the run before it counts as a pattern
MAX_STEPS_EACH = 2.0  # optimizer steps per optimizer built, on average, at most


@register
class OptimizerRecreated(Probe):
    id = "optimizer_recreated"
    categories = ("gradient_instability", "loss_not_decreasing", "convergence_to_wrong_solution")
    frameworks = ("torch", "none")  # Keras builds its optimizer once, in compile()

    def run(self, ctx: ProbeContext):
        hits = lint_hits(ctx, "optimizer_recreated")
        calls = ctx.run.first("calls") or {}
        built, steps = calls.get("optimizers_built"), calls.get("optimizer_steps") or 0
        measured = built is not None and built >= MIN_BUILT and steps > 0
        if not hits and not measured:
            return []
        where = loc(hits[0]) if hits else ctx.ref("optimizer")
        if measured:
            each = steps / built
            if each <= MAX_STEPS_EACH:
                return [self.finding(
                    "training_loop", True,
                    f"{built} optimizers were built for {steps} optimizer steps ({each:.1f} "
                    "steps each): every one starts with empty state (Adam's moment estimates, "
                    "SGD's momentum buffer), so every update is a first step. Adam then moves "
                    "each weight by about the learning rate in the sign of its gradient, whatever "
                    "its size, and momentum never builds up. Build the optimizer once, before "
                    "the loop.", where, optimizers_built=built, optimizer_steps=steps,
                    steps_per_optimizer=round(each, 2), strength=0.9)]
            if not hits:
                return []  # restarts every many steps (new trials, warm restarts): deliberate
            return [self.finding(
                "training_loop", False, hits[0].message + f" In this run, though, {built} "
                f"optimizers took {steps} steps ({each:.0f} steps each): not rebuilt every step.",
                where, optimizers_built=built, optimizer_steps=steps, strength=0.2)]
        return [self.finding("training_loop", False, hits[0].message + " (optimizer "
                             "constructions were not counted in this run)", where, strength=0.4)]
