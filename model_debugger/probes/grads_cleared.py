"""``grads_cleared``: gradients cleared between ``backward()`` and the optimizer step.

``loss.backward(); optimizer.zero_grad(); optimizer.step()``: every step applies a zero (or
missing) gradient, so the weights never move and the loss stays where the initial model put it
(momentum and weight decay aside). The capture sees the order of the calls (the
``grads_cleared`` event: a ``zero_grad()`` after a ``backward()`` and before the step that was
to apply it, counted per step), so the finding is decisive when most steps do it. Located at
that ``zero_grad()``, which belongs before the backward; or, when the loop calls
``zero_grad(); step(); backward()`` (the step before the backward: the same count), at the
``step()``, which belongs after it.
"""

from __future__ import annotations

from .base import Probe, ProbeContext, register

MOST = 0.5  # of the optimizer steps


@register
class GradsCleared(Probe):
    """The capture's count of optimizer steps whose gradients were cleared just before."""

    id = "grads_cleared"
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution", "overfitting",
                  "gradient_instability", "healthy")
    reveals = "loss_not_decreasing"  # a run that looked healthy hardly trained
    frameworks = ("torch",)
    fix = ("Clear the gradients before the backward pass, not between it and the step: "
           "optimizer.zero_grad(); loss.backward(); optimizer.step().")

    def run(self, ctx: ProbeContext):
        """One decisive finding when most optimizer steps had their gradients cleared first."""
        seen = ctx.run.first("grads_cleared")
        if not seen or not seen.get("of"):
            return []
        share = seen["steps"] / seen["of"]
        if share < MOST:
            return []
        where = seen.get("location") or ctx.ref("zero_grad")
        early = step_before_backward(where)
        if early is not None:  # zero_grad(); step(); backward(): the step is what is misplaced
            return [self.finding(
                "training_loop", True,
                f"In {seen['steps']} of {seen['of']} optimizer steps the gradients had been "
                "cleared (zero_grad) and not computed again: the loop calls optimizer.step() "
                "before loss.backward(), so each step applies the cleared gradient and the "
                "backward's gradient is cleared before any step uses it. Call step() after "
                "backward().",
                early, strength=0.95, decisive=True, cleared_steps=seen["steps"],
                optimizer_steps=seen["of"], step_before_backward=True)]
        return [self.finding(
            "training_loop", True,
            f"In {seen['steps']} of {seen['of']} optimizer steps the gradients were cleared "
            "(zero_grad) after backward() and before the step: each step applies a zero "
            "gradient, so the weights do not learn from the loss.",
            where, strength=0.95, decisive=True,
            cleared_steps=seen["steps"], optimizer_steps=seen["of"])]


def step_before_backward(location: dict | None) -> dict | None:
    """The ``step()`` line of a loop that clears, steps, then computes the gradients, or None.

    The block holding the ``zero_grad()`` at ``location`` calls ``zero_grad()``, then
    ``step()``, then ``backward()``.
    """
    import ast

    from ..provenance import _tree_of

    tree = _tree_of(location)
    if tree is None:
        return None

    def calls(stmt, attr: str) -> bool:
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
                   n.func.attr == attr for n in ast.walk(stmt))

    for node in ast.walk(tree):
        for body in (getattr(node, "body", None), getattr(node, "orelse", None)):
            if not isinstance(body, list) or not any(
                    getattr(st, "lineno", None) == location["line"] for st in body):
                continue
            at = {attr: next((i for i, st in enumerate(body) if calls(st, attr)), None)
                  for attr in ("zero_grad", "step", "backward")}
            if None not in at.values() and at["zero_grad"] < at["step"] < at["backward"]:
                return {"file": location["file"], "line": body[at["step"]].lineno}
    return None
