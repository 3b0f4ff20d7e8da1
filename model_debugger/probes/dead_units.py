"""``dead_units``: activations that never fire (ReLU) or sit saturated (sigmoid/tanh)."""

from __future__ import annotations

from .base import Probe, ProbeContext, register, setting_location

DEAD = 0.5  # share of units dead or saturated in one layer
ROWS = 256


def unit_stats(model, inputs, forward=None) -> dict[str, tuple[str, float]]:
    """Per activation module: ("dead"|"saturated", share of units) on the given inputs.

    ``forward(model, inputs)`` calls the model as the user did (default: ``model(*inputs)``).
    """
    import torch

    stats, handles = {}, []
    kinds = {torch.nn.ReLU: "relu", torch.nn.LeakyReLU: "relu", torch.nn.Sigmoid: "sigmoid",
             torch.nn.Tanh: "tanh"}

    def hook(name, kind):
        def fn(module, inp, out):
            o = out.detach().reshape(out.shape[0], -1).float()
            if kind == "relu":
                share = float(((o > 0).sum(0) == 0).float().mean())
                stats[name] = ("dead", share)
            else:
                lo, hi = (0.01, 0.99) if kind == "sigmoid" else (-0.98, 0.98)
                sat = ((o <= lo) | (o >= hi)).float().mean(0)
                stats[name] = ("saturated", float((sat > 0.9).float().mean()))
        return fn

    for name, m in model.named_modules():
        kind = kinds.get(type(m))
        if kind:
            handles.append(m.register_forward_hook(hook(name, kind)))
    was = model.training
    try:
        model.eval()
        with torch.no_grad():
            if forward is None:
                model(*inputs)
            else:
                forward(model, inputs)
    finally:
        model.train(was)
        for h in handles:
            h.remove()
    return stats


@register
class DeadUnits(Probe):
    """Dead (ReLU) or saturated (sigmoid/tanh) units per activation, trained and at init."""

    id = "dead_units"
    cost = 1
    categories = ("loss_not_decreasing", "gradient_instability")
    needs_live = True
    frameworks = ("torch",)
    fix = ("Use an initialisation and activation that keep units alive (He init, LeakyReLU), or "
           "lower the learning rate.")

    def run(self, ctx: ProbeContext):
        """One confirmed finding for the worst layer with >= 50% of its units dead or saturated.

        Measured on training rows after training and on a fresh copy: already so at initialisation
        is an ``architecture`` cause, only after training a ``hyperparameter`` one (the learning
        rate).
        """
        tr = ctx.trainer
        if tr is None or tr.n == 0:
            return []
        import torch

        if not all(bool(torch.isfinite(p).all()) for p in ctx.model.parameters()):
            return []  # a model ruined by NaN/inf says nothing about its units
        inputs, _ = tr.subset(slice(0, ROWS))
        from ..trainers.torch import copy_model

        after = unit_stats(copy_model(ctx.model).to("cpu"), inputs, tr.forward)
        before = unit_stats(tr.fresh_model(), inputs, tr.forward)
        bad = {n: s for n, s in after.items() if s[1] >= DEAD}
        if not bad:
            return []
        name, (kind, share) = max(bad.items(), key=lambda kv: kv[1][1])
        born = before.get(name, (kind, 0.0))[1] >= DEAD
        cause = "architecture" if born else "hyperparameter"
        why = ("already at initialisation: the architecture/initialisation saturates them"
               if born else "only after training: large updates pushed them there (learning "
               "rate too high)")
        return [self.finding(
            cause, True,
            f"{share:.0%} of the units after '{name}' are {kind} on {len(inputs[0])} training "
            f"rows, {why}. Dead or saturated units pass no gradient.",
            ctx.ref("model") if born else setting_location(ctx.ref("optimizer"), "lr"),
            layers={n: {"kind": k, "share": s} for n, (k, s) in after.items()},
            at_init={n: s for n, (_, s) in before.items()}, strength=0.6)]
