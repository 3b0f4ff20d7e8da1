"""``optimizer_elsewhere``: the optimizer steps parameters that are not the trained model's.

Measured by the capture (the ``optimizer_elsewhere`` event): at an optimizer step, none of the
optimizer's parameters had a gradient while the model that ran forward had gradients on its
own, so the backward reached the model and the step updated something else (an optimizer built
over another instance, ``Trainer(MLP(...))`` handed a fresh model, a model re-created after
its optimizer). Unlike a cut graph (``detached_output``), the gradients exist: they land on
parameters no optimizer owns. Direct and decisive; located where the optimizer was built.
"""

from __future__ import annotations

from .base import Probe, ProbeContext, register


@register
class OptimizerElsewhere(Probe):
    """The optimizer's parameters and the model's are different objects."""

    id = "optimizer_elsewhere"
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution", "overfitting")
    fix = ("Build the optimizer over the parameters of the model you train "
           "(optimizer = Adam(model.parameters()) after the model you pass on is created), or "
           "pass the same model instance to the code that trains it.")

    def applies(self, ctx: ProbeContext) -> bool:
        """When the record holds the event (no live objects needed)."""
        return super().applies(ctx) and ctx.run.first("optimizer_elsewhere") is not None

    def run(self, ctx: ProbeContext):
        """One confirmed finding from the event."""
        from ..provenance import rebound_between

        e = ctx.run.first("optimizer_elsewhere")
        shared = e.get("shared", 0)
        name = (ctx.run.first("model") or {}).get("name")
        again = rebound_between(ctx.ref("optimizer"), ctx.ref("backward") or ctx.ref("step"),
                                name)
        return [self.finding(
            "training_loop", True,
            f"At step {e.get('step')} the optimizer's {e.get('optimizer_params')} parameter "
            f"tensors had no gradient while {e.get('model_params_with_grad')} of the trained "
            "model's own did: backward() reaches the model, but the optimizer updates other "
            "parameters (" + ("none" if not shared else f"only {shared}") + " of the model's "
            "are in it). " + (
                f"'{name}' is made again here, after the optimizer was built over the earlier "
                f"instance (line {ctx.ref('optimizer')['line']}): build the optimizer after it, "
                "or change the model in place." if again else
                "The optimizer was built over another model instance."),
            again or ctx.ref("optimizer"), strength=0.95, decisive=True,
            optimizer_params=e.get("optimizer_params"),
            model_params_with_grad=e.get("model_params_with_grad"), shared=shared)]
