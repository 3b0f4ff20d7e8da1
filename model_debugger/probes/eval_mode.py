"""``eval_mode_not_reset``: training continues in eval mode after a validation pass.

PyTorch: optimizer steps taken with the model in eval mode (the step's ``tm`` flag). Keras:
the training forward, under a recording gradient tape, called without ``training=True`` (a
custom ``train_step`` calling ``self(x)``, a tape loop calling ``model(x)``) on a model with
dropout or batch normalisation (the capture's ``train_flag`` event): those layers then run as
in inference for every step.
"""

from __future__ import annotations

from ..provenance import enclosing_loop
from ..records import Intervention
from ._lint import lint_hits, loc
from .base import Probe, ProbeContext, register


@register
class EvalModeNotReset(Probe):
    """Optimizer steps taken in eval mode (recorded per step), and the lint's hint."""

    id = "eval_mode_not_reset"
    categories = ("overfitting", "loss_not_decreasing", "convergence_to_wrong_solution")
    fix = "Call model.train() again after evaluation, before the next training steps."

    def intervention(self, finding):
        """A training forward runs in train mode in the re-run."""
        return Intervention("train_mode")

    def run(self, ctx: ProbeContext):
        """Confirmed when some optimizer steps ran in eval mode; a lint hit alone: a hypothesis."""
        flag = ctx.run.first("train_flag")
        if flag is not None and flag.get("layers"):
            given = "without training=" if flag.get("training") is None else \
                f"with training={flag['training']}"
            return [self.finding(
                "training_loop", True,
                f"The model's training forward (under the gradient tape) is called {given}: its "
                f"{', '.join(flag['layers'])} layers run as in inference at every step, so "
                "dropout never regularises and batch-norm statistics never update. Call it "
                "with training=True in the training step.",
                flag.get("location") or ctx.ref("step"), layers=flag["layers"],
                training_given=flag.get("training"), strength=0.8)]
        hits = lint_hits(ctx, "eval_mode_not_reset")
        flags = [s.get("tm") for s in ctx.run.steps if s.get("tm") is not None]
        off = sum(1 for f in flags if f is False)
        if not hits and not off:
            return []
        # a lint hit (the eval() call never undone), else the loop whose steps ran in eval
        # mode: model.train() goes before it
        where = loc(hits[0]) if hits else enclosing_loop(ctx.ref("backward")) or \
            ctx.ref("backward")
        if off:
            return [self.finding(
                "training_loop", True,
                f"{off} of {len(flags)} optimizer steps ran with the model in eval mode: after "
                "model.eval() the loop never calls model.train(), so dropout and batch-norm "
                "statistics stay frozen for the rest of training.",
                where, eval_mode_steps=off, steps=len(flags), strength=0.8)]
        return [self.finding("training_loop", False, hits[0].message, where, strength=0.3)]
