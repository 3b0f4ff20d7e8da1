"""``linear_stack``: hidden layers without an activation, so the model is one linear map.

An affine layer (``Dense``/``nn.Linear``, a convolution) whose output goes straight into another
one (at most through dropout, a flatten, a batch norm or an average pool) adds no capacity: two
affine maps in a row are one affine map. A network whose hidden layers all lack their activation is a linear model, and settles at
the linear model's loss on a task that needs more (two moons, XOR, digits): the loss falls,
then stays well above what the data allows. Found on the live model (its graph, or the tensors
one forward pass of a copy hands from module to module), then tested by experiment: two fresh
copies trained on the same rows, one as set up and one with a ReLU after each such layer;
confirmed when that copy reaches a clearly lower held-out loss (on a run that looked healthy,
still slowly falling towards the linear model's loss, the confirmed finding re-classifies it
``loss_not_decreasing``). Located where the activation
goes: where ``forward`` calls the first such module, else the line that built that layer.
"""

from __future__ import annotations

import ast

from ._heldout import SettingExperiment
from ._made import attribute_line
from .base import ProbeContext, register

_CALLS = {"torch": ("Linear", "Conv1d", "Conv2d", "Conv3d"),
          "keras": ("Dense", "Conv1D", "Conv2D", "Conv3D")}  # the calls that build the layers


@register
class LinearStack(SettingExperiment):
    """Linear layers feeding linear layers, and a copy with activations learns clearly better."""

    id = "linear_stack"
    cost = 2
    categories = ("loss_not_decreasing", "convergence_to_wrong_solution", "healthy")
    reveals = "loss_not_decreasing"  # a model that learned what a linear one can, and stopped
    fix = ("Give each hidden layer an activation (activation=\"relu\" on a Dense or a Conv, an "
           "nn.ReLU() after an nn.Linear or nn.Conv): without one, stacked layers are a single "
           "linear layer.")

    def run(self, ctx: ProbeContext):
        """One finding for the chain, confirmed by the experiment; nothing without a chain."""
        tr = ctx.trainer
        try:
            pairs = tr.linear_chains()
        except Exception:  # noqa: BLE001 - a model a copy cannot run: nothing to read
            return []
        if not pairs:
            return []
        firsts = list(dict.fromkeys(a for a, _ in pairs))
        try:
            as_set, relu_loss, confirmed = self.compare(ctx, tr.with_activations(set(firsts)))
        except ValueError:  # the copy does not hold those layers: no experiment to run
            return []
        chain = ", ".join(f"'{a}' -> '{b}'" for a, b in pairs)
        return [self.finding(
            "architecture", confirmed,
            f"Affine layers feed affine layers with no activation between ({chain}): stacked, "
            f"they are one linear map. Two fresh copies trained on the same rows reach a "
            f"held-out loss of {relu_loss:.4g} with a ReLU after {len(firsts)} of them and "
            f"{as_set:.4g} as built"
            + (": the missing activations keep the model linear." if confirmed else
               ": no clearly better, so the linear stack is not what holds the loss up."),
            _where(ctx, firsts[0]), undone=confirmed, strength=0.75 if confirmed else 0.15,
            decisive=confirmed,
            layers=firsts, pairs=[list(p) for p in pairs], heldout_as_built=as_set,
            heldout_with_activations=relu_loss)]


def _where(ctx: ProbeContext, first: str) -> dict | None:
    """The line where layer ``first`` needs its activation, else the model's line.

    The layer call given ``name="<first>"`` (Keras); the one call ``self.<first>(...)`` in a
    ``forward`` (PyTorch: the activation goes around it); else the layer calls (``Dense(``,
    ``nn.Linear(``, ``Conv2d(``...) in source order where the model was built (its class, the statement that
    made it, or the function of this file that statement calls), then in its whole file,
    matched to the model's layers in definition order when both count the same; else
    (PyTorch) the ``self.<attr> = ...`` of its top-level attribute.
    """
    model, tr = ctx.ref("model"), ctx.trainer
    if not model or not model.get("file"):
        return model
    source = ctx.source_files.get(model["file"])
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, TypeError):
        return model
    want = _CALLS.get(tr.framework)
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call) and _tail(n) in want),
                   key=lambda n: (n.lineno, n.col_offset))
    for call in calls:  # a name given in the source says which call made it
        if any(k.arg == "name" and isinstance(k.value, ast.Constant) and k.value.value == first
               for k in call.keywords):
            return {**model, "line": call.lineno}
    if tr.framework == "torch" and "." not in first:  # self.fc1 = nn.Linear(...): the
        # activation goes where forward() calls it
        forwards = [f for f in ast.walk(tree)
                    if isinstance(f, ast.FunctionDef) and f.name == "forward"]
        called = [c.lineno for f in forwards for c in ast.walk(f) if isinstance(c, ast.Call)
                  and isinstance(c.func, ast.Attribute) and c.func.attr == first
                  and isinstance(c.func.value, ast.Name) and c.func.value.id == "self"]
        if len(called) == 1:
            return {**model, "line": called[0]}
    names = tr.linear_layers()
    made = [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.stmt))
            and n.lineno == model.get("line")][:1]
    defs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    builders = {n.name: n for n in defs if sum(d.name == n.name for d in defs) == 1}
    made += [builders[_tail(n)] for m in made for n in ast.walk(m)
             if isinstance(n, ast.Call) and _tail(n) in builders]  # model = make_model()
    for scope in made:
        inside = [c for c in calls if any(c is n for n in ast.walk(scope))]
        if first in names and len(inside) == len(names):
            return {**model, "line": inside[names.index(first)].lineno}
    if first in names and len(calls) == len(names):
        return {**model, "line": calls[names.index(first)].lineno}
    line = attribute_line(source, model.get("line"), first.split(".")[0]) \
        if tr.framework == "torch" else None
    return {**model, "line": line} if line else model


def _tail(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
