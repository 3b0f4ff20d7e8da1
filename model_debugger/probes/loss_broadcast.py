"""``loss_broadcast``: the training loss compared every prediction with every target.

Measured by the capture (the ``loss_broadcast`` event): an elementwise loss (MSE, L1, Huber,
binary cross-entropy) was given a prediction and a target of different shapes that broadcast,
typically ``(B, 1)`` against ``(B,)``, so it averaged ``B x B`` differences. That loss is minimised
by predicting the targets' mean for every row: the model converges to a constant whatever its
inputs. A direct measurement of the shapes, located at the loss call.
"""

from __future__ import annotations

from ..records import Intervention
from .base import Probe, ProbeContext, register


@register
class LossBroadcast(Probe):
    """The shapes the training loss was given, from the record."""

    id = "loss_broadcast"
    categories = ("convergence_to_wrong_solution", "loss_not_decreasing", "gradient_instability")
    needs_live = False
    frameworks = ("torch", "keras")
    fix = ("Give the loss a prediction and a target of the same shape: squeeze the (B, 1) output "
           "(output.squeeze(-1)) or view the target as (B, 1).")

    def intervention(self, finding):
        """Keras: the targets given the output's shape in the re-run (a hypothesis to test)."""
        if finding.evidence.get("framework") == "keras":
            return Intervention("match_target_shape")
        return None

    def run(self, ctx: ProbeContext):
        """One confirmed finding when the capture saw a broadcasting training loss.

        Keras: a loss the capture does not know (written in ``train_step``) over a ``(B,)``
        target and a ``(B, 1)`` output is a hypothesis, tested by re-running with the
        targets shaped ``(B, 1)``.
        """
        if ctx.framework == "keras":
            return self._keras(ctx)
        event = ctx.run.first("loss_broadcast")
        if not event or not isinstance(event.get("factor"), (int, float)) or event["factor"] < 2:
            return self._unpaired(ctx)
        where = event.get("location") or ctx.ref("loss_fn") or ctx.ref("backward")
        return [self.finding(
            "training_loop", True,
            f"The training loss {event.get('loss')} was given predictions of shape "
            f"{tuple(event.get('input') or ())} and targets of shape "
            f"{tuple(event.get('target') or ())}; they broadcast to {tuple(event.get('shape') or ())}, "
            f"{event['factor']:.3g} terms per element, so every prediction is compared with every "
            "target. That loss is minimised by predicting the targets' mean for every row: the "
            "model converges to a constant. Make both the same shape.",
            where, input_shape=event.get("input"), target_shape=event.get("target"),
            broadcast_shape=event.get("shape"), factor=event["factor"], strength=0.95)]

    def _unpaired(self, ctx: ProbeContext):
        """A loss the capture does not know that never paired a prediction with its target.

        The gradient each row's one-column prediction received (``output_grads``, read at a
        few steps) was an affine function of the prediction alone at every reading: the loss
        gave no row its own target's pull, as a hand-written ``((pred - y) ** 2).mean()`` of a
        ``(B, 1)`` prediction against a ``(B,)`` target does (``2 (pred_i - mean(y)) / B``).
        A direct measurement, located where the loss that was backpropagated was computed.
        """
        if ctx.run.first("loss_input") is not None or ctx.run.first("targets") is not None or \
                ctx.signals.get("loss_unpaired", 0.0) < 1.0:
            return []  # (a loss the capture knows: its shapes were watched, the event above)
        reads = [e for e in ctx.run.of("output_grads") if isinstance(e.get("rank_corr"), float)]
        from ..provenance import receiver_made

        return [self.finding(
            "training_loop", True,
            f"At each of {len(reads)} steps read, the gradient every prediction received was a "
            "function of that prediction alone (rank correlation "
            f"{min(e['rank_corr'] for e in reads):.4f} over {reads[0]['rows']} rows): the loss "
            "never compared a prediction with its own target. A (B, 1) prediction minus a "
            "(B,) target broadcasts to (B, B), and its mean is minimised by predicting the "
            "targets' mean for every row. Make both the same shape (pred.squeeze(-1), or "
            "target.view(-1, 1)).",
            receiver_made(ctx.ref("backward")), readings=len(reads),
            rank_corr=min(e["rank_corr"] for e in reads), strength=0.9, decisive=True)]

    def _keras(self, ctx: ProbeContext):
        if ctx.loss is not None or getattr(ctx.model, "loss", None) is not None or \
                ctx.model is None or not ctx.train_batches:
            return []  # a compiled Keras loss (even a custom function) matches the shapes
        xs, y = ctx.train_batches[0]
        if getattr(y, "ndim", None) != 1:
            return []
        try:
            out = ctx.model(xs[0][:2] if len(xs) == 1 else [x[:2] for x in xs], training=False)
        except Exception:  # noqa: BLE001 - a model that cannot be called here: no hypothesis
            return []
        shape = tuple(getattr(out, "shape", ()))
        if len(shape) != 2 or shape[-1] != 1:
            return []
        return [self.finding(
            "training_loop", False,
            "The model outputs shape (B, 1) and the targets are (B,); the loss is computed "
            "by your own code (no loss given to compile), where `y - y_pred` of those shapes "
            "broadcasts to (B, B): every prediction is compared with every target, and the "
            "best it can do is predict the targets' mean. A hypothesis, tested by re-running "
            "with the targets shaped (B, 1).",
            _loss_line(ctx.source_files) or ctx.ref("fit"), framework="keras",
            input_shape=[None, 1], target_shape=[None], strength=0.5)]


def _loss_line(sources: dict) -> dict | None:
    """Where a ``train_step`` of the user's code computes its loss.

    The statement binding ``loss`` in ``train_step``; when it calls a method of the same class
    (``self.compute_mse(y, y_pred)``), that method's ``return`` line.
    """
    import ast

    for path, text in (sources or {}).items():
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
            step = methods.get("train_step")
            if step is None:
                continue
            for node in ast.walk(step):
                if isinstance(node, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == "loss" for t in node.targets):
                    call = node.value
                    name = getattr(getattr(call, "func", None), "attr", None)
                    if isinstance(call, ast.Call) and name in methods:
                        ret = next((r for r in ast.walk(methods[name])
                                    if isinstance(r, ast.Return)), None)
                        if ret is not None:
                            return {"file": path, "line": ret.lineno}
                    return {"file": path, "line": node.lineno}
    return None
