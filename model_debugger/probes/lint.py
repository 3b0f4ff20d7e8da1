"""``lint``: static pitfalls with no dedicated measuring probe, reported as hypotheses.

Rules that a probe can measure (``missing_zero_grad``, ``detached_output``, ...) are reported by
that probe; the others (evaluation outside ``no_grad``, Keras label-format and input-scaling
pitfalls) surface here as unconfirmed findings with their exact line.
"""

from __future__ import annotations

from ._lint import lint_hits, loc
from .base import PROBES, Probe, ProbeContext, register

_RULES = ("eval_without_no_grad", "label_format_mismatch", "missing_input_normalization",
          "loss_output_mismatch")


@register
class Lint(Probe):
    id = "lint"
    categories = ("*",)

    def run(self, ctx: ProbeContext):
        out = []
        for rule in _RULES:
            if rule in PROBES and ctx.framework == "torch":
                continue  # measured by its own probe
            for hit in lint_hits(ctx, rule):
                out.append(self.finding(hit.root_cause, False, hit.message, loc(hit),
                                        rule=rule, strength=0.3))
        return out
