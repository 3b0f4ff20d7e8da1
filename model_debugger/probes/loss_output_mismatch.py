"""``loss_output_mismatch``: the model's output is not what the loss expects.

e.g. probabilities (softmax) fed to ``CrossEntropyLoss``, which applies log-softmax itself and
expects logits: the gradient shrinks and training stalls.
"""

from __future__ import annotations

from ._lint import lint_hits, loc
from .base import Probe, ProbeContext, register

_EXPECTS_LOGITS = {"cross_entropy": ("probabilities", "log_probabilities"),
                   "binary_cross_entropy_with_logits": ("unit_interval",)}


@register
class LossOutputMismatch(Probe):
    """What the loss received on the first batch, against what it expects."""

    id = "loss_output_mismatch"
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution", "gradient_instability")
    fix = ("Remove the Softmax/LogSoftmax (or sigmoid) before a loss that expects raw logits "
           "(CrossEntropyLoss, BCEWithLogitsLoss), or switch to the loss that matches the output "
           "(NLLLoss after LogSoftmax).")

    def run(self, ctx: ProbeContext):
        """Confirmed when the recorded loss input is of a kind the loss does not expect.

        E.g. probabilities fed to ``cross_entropy``; a lint hit alone is a hypothesis.
        """
        hits = lint_hits(ctx, "loss_output_mismatch")
        seen = ctx.run.first("loss_input") or {}
        name, kind = seen.get("name"), seen.get("kind")
        measured = kind in _EXPECTS_LOGITS.get(name, ())
        if not hits and not measured:
            return []
        where = loc(hits[0]) if hits else ctx.ref("model") or ctx.ref("loss_fn")
        if measured:
            return [self.finding(
                "architecture", True,
                f"{name} expects raw scores (logits) but receives {kind.replace('_', ' ')} "
                f"(measured on the first batch: min {seen.get('min'):.3g}, max "
                f"{seen.get('max'):.3g}, rows summing to 1 within {seen.get('row_sum_dev', 0):.2g})."
                " The loss squashes them again, gradients shrink and learning stalls. Remove the "
                "final softmax/sigmoid from the model.",
                where, loss=name, input_kind=kind, **{k: seen[k] for k in ("min", "max")
                                                      if k in seen}, strength=0.95)]
        return [self.finding("architecture", False, hits[0].message + " (the loss input was not "
                             "measured)", where, strength=0.4)]
