"""``gradients_unapplied``: a custom loop takes gradients and never applies them.

``tape.gradient`` runs every step, but no optimizer ``apply_gradients`` / ``apply`` follows
and the weights never change: the loss stays where the initial model put it. Measured by the
capture (the ``unapplied`` event: gradients taken, no optimizer step in the whole run, and the
trainable variables of the gradient, where they could be read, mostly unchanged at the end),
so the finding is decisive. Located at the line that takes the gradients, where the update belongs.
"""

from __future__ import annotations

import ast

from .base import Probe, ProbeContext, register


@register
class GradientsUnapplied(Probe):
    """The capture's count of gradients taken without any optimizer step."""

    id = "gradients_unapplied"
    cost = 0
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution", "gradient_instability",
                  "overfitting", "healthy")
    reveals = "loss_not_decreasing"  # a run that looked healthy never trained
    fix = ("Apply the gradients after taking them: optimizer.apply_gradients(zip(grads, "
           "model.trainable_variables)) in every training step.")

    def applies(self, ctx: ProbeContext) -> bool:
        """When the capture saw gradients taken and never applied (the ``unapplied`` event).

        Keras records it (PyTorch records a step at each backward: ``detached_output``); a run
        that never applied anything may name no model or optimizer, hence no framework. Not
        when the capture measured at least half the gradient's trainable variables changing
        (``updated`` of ``watched``): the loop applies its gradients by hand
        (``v.assign_sub(lr * g)``).
        """
        event = ctx.run.first("unapplied")
        if event is None:
            return False
        updated, watched = event.get("updated") or 0, event.get("watched") or 0
        return not (watched and 2 * updated >= watched)

    def run(self, ctx: ProbeContext):
        """Confirmed when the run took gradients and no optimizer applied any of them."""
        event = ctx.run.first("unapplied")
        if not event or not event.get("gradients"):
            return []
        return [self.finding(
            "training_loop", True,
            f"The loop took gradients {event['gradients']} times (tape.gradient) but no "
            "optimizer applied them (no apply_gradients or apply in the whole run)"
            + (f" and {event.get('updated', 0)} of the {event['watched']} trainable variables "
               "it differentiated changed" if event.get("watched") else "")
            + ": the loss stays where the initial model put it.",
            _gradient_line(ctx) or ctx.ref("backward"), gradients=event["gradients"],
            optimizer_steps=0, strength=0.95, decisive=True)]


def _gradient_line(ctx: ProbeContext) -> dict | None:
    """The one ``<tape>.gradient(...)`` call of the file the gradients were taken from.

    Inside a ``tf.function`` the capture sees the gradient taken while the step is traced,
    from the loop's line that calls it; the update belongs beside the gradient call itself.
    None when the file holds none or several.
    """
    where = ctx.ref("backward")
    text = ctx.source_files.get(where["file"]) if where and where.get("file") else None
    if not isinstance(text, str):
        return None
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    lines = {n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and
             isinstance(n.func, ast.Attribute) and n.func.attr == "gradient"}
    return {**where, "line": lines.pop()} if len(lines) == 1 else None
