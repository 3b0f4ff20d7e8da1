"""Where the layer that makes a model's output was built (its file and line).

A finding about the output's activation or range belongs on the line that made the faulty
layer (``self.head = nn.Sequential(nn.Linear(64, 1), nn.ReLU())``), not on the class or the
line that assembled the model. The last leaf module a forward pass of a fresh copy runs names
the attribute (``head`` of ``head.1``); the assignment to ``self.<attr>`` in the model's
class, or the model's own line when it has no such attribute (an ``nn.Sequential`` built in
one call), is where it was made. A Keras model's last layer is found in the source
(:func:`~model_debugger.pitfalls.keras_lint.output_layer_line`).
"""

from __future__ import annotations

import ast


def last_module_name(tr) -> str | None:
    """The qualified name of the last leaf module a forward pass of a fresh copy runs."""
    import torch

    model = tr.fresh_model()
    seen: list[str] = []
    handles = [m.register_forward_hook(lambda _m, _i, _o, name=name: seen.append(name))
               for name, m in model.named_modules() if name and not list(m.children())]
    try:
        with torch.no_grad():
            tr.forward(model, tuple(x[:4] for x in tr.inputs))
    finally:
        for h in handles:
            h.remove()
    return seen[-1] if seen else None


def attribute_line(source: str, cls_line: int | None, attr: str) -> int | None:
    """The line of the last ``self.<attr> = ...`` in the class defined at ``cls_line``.

    Any class of the file when ``cls_line`` names none; None when no assignment is found.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    mine = [c for c in classes if c.lineno == cls_line] or classes
    found = None
    for cls in mine:
        for node in ast.walk(cls):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Attribute) and t.attr == attr and
                       isinstance(t.value, ast.Name) and t.value.id == "self" for t in targets):
                    found = node.lineno
    return found


def output_module_location(ctx) -> dict | None:
    """Where the module making the output of the run's PyTorch model was built, or None."""
    model, tr = ctx.ref("model"), ctx.trainer
    if ctx.framework != "torch" or tr is None or not model or not model.get("file"):
        return None
    source = ctx.source_files.get(model["file"])
    if not isinstance(source, str):
        return None
    try:
        name = last_module_name(tr)
    except Exception:  # noqa: BLE001 - a model a copy cannot run: the model's own line
        return None
    if not name:
        return None
    line = attribute_line(source, model.get("line"), name.split(".")[0])
    return {**model, "line": line} if line else None


def head_location(ctx, head: str, index: int | None = None) -> dict | None:
    """Where the output ``head`` of a multi-output Keras model was made, or None."""
    model = ctx.ref("model")
    if not model or not model.get("file"):
        return None
    text = ctx.source_files.get(model["file"])
    if not isinstance(text, str):
        return None
    from ..pitfalls.keras_lint import head_layer_line

    line = head_layer_line(text, head, index)
    return {**model, "line": line} if line else None


def output_location(ctx) -> dict | None:
    """Where the layer making the run's model output was built, in either framework, or None."""
    model = ctx.ref("model")
    if ctx.framework != "keras":
        return output_module_location(ctx)
    if not model or not model.get("file"):
        return None
    text = ctx.source_files.get(model["file"])
    if not isinstance(text, str):
        return None
    from ..pitfalls.keras_lint import output_layer_line

    line = output_layer_line(text)
    return {**model, "line": line} if line else None
