"""``lint``: static pitfalls with no dedicated measuring probe, reported as hypotheses.

Rules that a probe can measure (``missing_zero_grad``, ``detached_output``, ...) are reported by
that probe; the others (evaluation outside ``no_grad``, Keras label-format and input-scaling
pitfalls) surface here as unconfirmed findings with their exact line. Each rule entry of
:data:`RULES` carries the fix it suggests.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..records import Finding
from ._lint import lint_hits, loc
from .base import GENERIC_SUGGESTION, PROBES, Probe, ProbeContext, register


@dataclass(frozen=True)
class LintRule:
    """A static pitfall this probe reports.

    Attributes
    ----------
    id : str
        The rule id the lint packs emit (``LintHit.rule``).
    suggestion : str
        The suggested fix for a hit of the rule.
    """

    id: str
    suggestion: str


RULES: dict[str, LintRule] = {r.id: r for r in (
    LintRule("eval_without_no_grad",
             "Run evaluation under `with torch.no_grad():` (or torch.inference_mode()) so no "
             "autograd graph is built or kept for validation batches."),
    LintRule("label_format_mismatch",
             "Match the labels to the loss: sparse_categorical_crossentropy for integer class "
             "ids, categorical_crossentropy for one-hot rows (keras.utils.to_categorical(y))."),
    LintRule("missing_input_normalization",
             "Scale the inputs before the model sees them: divide 0-255 pixel values by 255 "
             "(x.astype(\"float32\") / 255) or add layers.Rescaling(1/255) as the first layer."),
    LintRule("early_stop_on_training",
             "Watch a validation quantity: EarlyStopping(monitor=\"val_loss\", patience=..., "
             "restore_best_weights=True) (likewise ModelCheckpoint and ReduceLROnPlateau)."),
    # measured by its own probe on PyTorch; a hypothesis from the Keras lint
    LintRule("loss_output_mismatch",
             "Make the model's output what the loss expects: remove the final softmax/sigmoid "
             "when the loss is built with from_logits=True, or add the activation (or build the "
             "loss with from_logits=True) when the last layer outputs raw scores."),
)}


@register
class Lint(Probe):
    """Static lint hits that no measuring probe covers, reported as unconfirmed findings."""

    id = "lint"
    categories = ("*", "healthy")  # a healthy-looking run can still hide a pitfall

    def suggestion(self, finding: Finding) -> str:
        """The fix of the hit's rule (:data:`RULES`)."""
        rule = RULES.get((finding.evidence or {}).get("rule"))
        return rule.suggestion if rule is not None else GENERIC_SUGGESTION

    def run(self, ctx: ProbeContext):
        """One unconfirmed finding per hit of a rule of :data:`RULES`.

        On PyTorch, a rule with its own measuring probe is left to that probe.
        """
        out = []
        for rule in RULES:
            if rule in PROBES and ctx.framework == "torch":
                continue  # measured by its own probe
            for hit in lint_hits(ctx, rule):
                seen = _measured(ctx, rule) and hit.message.startswith("EarlyStopping")
                out.append(self.finding(hit.root_cause, seen, hit.message, loc(hit), rule=rule,
                                        strength=0.8 if seen else 0.3))
        return out


def _measured(ctx: ProbeContext, rule: str) -> bool:
    """Whether the run shows the hit's consequence (then it is confirmed, not a hypothesis).

    ``early_stop_on_training``: the run was classified ``overfitting`` and went on past its
    best validation loss for at least two more readings: nothing stopped it there (for an
    ``EarlyStopping`` hit only: a checkpoint or a rate schedule stops nothing).
    """
    if rule != "early_stop_on_training":
        return False
    sig = ctx.signals or {}
    primary = getattr(ctx.classification, "primary", None)
    return primary == "overfitting" and "val_points" in sig and \
        sig.get("val_loss_min_index", sig["val_points"]) <= sig["val_points"] - 3
