"""``framework_warnings``: what PyTorch, Keras or NumPy warned about during the run.

The capture records each kind of warning once, with the line of the user's code that made the
framework warn (:mod:`model_debugger.capture.warned`). The warnings that name a known training
pitfall become hypotheses at that line, each with its root-cause kind and fix (:data:`KNOWN`):
a target whose shape broadcasts against the output, probabilities given to a loss that expects
logits, a scheduler stepped before its optimizer, a softmax over an implicit dimension,
overflow or invalid values in NumPy. A warning is what the framework noticed, not a measured
effect: these findings stay unconfirmed (a measuring probe, such as ``loss_broadcast``,
confirms the same cause on its own). Other warnings are kept in the record only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .base import Probe, ProbeContext, register


@dataclass(frozen=True)
class Known:
    """A warning that names a training pitfall: its pattern, root-cause kind and fix."""

    pattern: re.Pattern
    root_cause: str
    what: str
    fix: str


KNOWN: tuple[Known, ...] = (
    Known(re.compile(r"target size .* different to the input size|target.*broadcast", re.I),
          "training_loop", "the target's shape broadcasts against the output's",
          "Give the target the output's shape (`target.view_as(output)`, or `unsqueeze(1)` / "
          "`squeeze(1)`) before the loss; a (B,) target against a (B, 1) output makes a "
          "(B, B) loss."),
    Known(re.compile(r"from_logits|does not represent logits", re.I),
          "architecture", "probabilities are given to a loss that expects logits (Keras "
          "warns when it took the logits from the activation's input itself, so this run may "
          "not have suffered; an eager loop or another backend would)",
          "Either drop the output activation (softmax/sigmoid) and keep `from_logits=True`, or "
          "keep it and build the loss with `from_logits=False`."),
    Known(re.compile(r"lr_scheduler\.step\(\)` before `optimizer\.step\(\)", re.I),
          "training_loop", "the learning-rate scheduler steps before the optimizer",
          "Call `optimizer.step()` before `scheduler.step()` in each iteration."),
    Known(re.compile(r"implicit dimension choice for (log_)?softmax", re.I),
          "architecture", "a softmax over an implicit dimension",
          "Pass `dim=` to softmax / log_softmax (usually `dim=-1`, the class axis)."),
    Known(re.compile(r"overflow encountered|invalid value encountered|divide by zero", re.I),
          "data", "NumPy met overflow, division by zero or invalid values",
          "Find the array operation at this line: values too large for their dtype, a "
          "division by a zero spread, or a log of zero; clip, cast to float64, or guard it."),
)


def known(message: str) -> Known | None:
    """The pitfall a warning's message names, or None."""
    return next((k for k in KNOWN if k.pattern.search(message or "")), None)


@register
class FrameworkWarnings(Probe):
    """Warnings of the frameworks that name a known pitfall, as hypotheses at the user's line."""

    id = "framework_warnings"
    categories = ("*", "healthy")  # a healthy-looking run can still hide a pitfall
    traces_origin = False

    def suggestion(self, finding) -> str:
        """The fix of the pitfall the warning names."""
        hit = known(finding.evidence.get("message", ""))
        return hit.fix if hit is not None else self.fix

    def applies(self, ctx: ProbeContext) -> bool:
        """When the record holds a warning."""
        return super().applies(ctx) and bool(ctx.run.of("warning"))

    def run(self, ctx: ProbeContext):
        """One unconfirmed finding per known kind of warning (the last event holds its count)."""
        kinds: dict[tuple, dict] = {}
        for event in ctx.run.of("warning"):
            kinds[(event.get("message"), event.get("file"), event.get("line"))] = event
        out = []
        for event in kinds.values():
            hit = known(str(event.get("message", "")))
            if hit is None:
                continue
            times = int(event.get("count") or 1)
            where = {"file": event["file"], "line": event["line"]} \
                if event.get("file") and isinstance(event.get("line"), int) else None
            out.append(self.finding(
                hit.root_cause, False,
                f"The run warned that {hit.what} ({event.get('category', 'warning')}"
                f"{f', {times} times' if times > 1 else ''}, first at step "
                f"{event.get('step', 0)}): \"{event.get('message', '')}\"",
                where, strength=0.3, message=event.get("message", ""), count=times,
                step=event.get("step")))
        return out
