"""Shared access to the static lint for probes.

The pitfall pack of the framework the code uses, run once per context, filtered by rule and to
the training loops that ran.
"""

from __future__ import annotations

from .base import ProbeContext


def lint_hits(ctx: ProbeContext, rule: str) -> list:
    """Lint hits of one rule over the context's source files (computed once, cached).

    Each file is linted by the pack of the framework it imports (PyTorch or Keras).
    """
    if ctx.lint is None:
        from ..pitfalls import keras_lint, torch_lint
        from ..pitfalls.detect import framework_of_source

        packs = {"torch": torch_lint, "keras": keras_lint}
        names = [e["name"] for e in ctx.run.of("model") if e.get("name")]
        hits = []
        for path, text in ctx.source_files.items():
            pack = packs.get(framework_of_source(text))
            if pack is not None:
                hits += pack.lint_source(text, path, names)
        ctx.lint = hits
    ran = _ran_at(ctx)
    return [h for h in ctx.lint if h.rule == rule and _ran(h, ran)]


def _ran_at(ctx: ProbeContext) -> dict[str, list[int]]:
    """``{file: [lines]}`` where the capture saw backward()/step() called."""
    out: dict[str, list[int]] = {}
    for e in ctx.run.of("ref"):
        if e.get("kind") in ("backward", "step") and e.get("file"):
            out.setdefault(e["file"], []).append(e["line"])
    return out


def _ran(hit, ran: dict[str, list[int]]) -> bool:
    """False for a hit in a training loop that did not run.

    The capture recorded backward() or step() elsewhere in the same file, never inside this
    loop (a pre-training loop behind
    a flag, an old loop kept for reference). Hits outside training loops, or in files where
    nothing was recorded (the loop lives in another file, a log-only session), are kept.
    """
    span, lines = hit.loop, ran.get(hit.file)
    return span is None or not lines or any(span[0] <= ln <= span[1] for ln in lines)


def loc(hit) -> dict:
    return {"file": hit.file, "line": hit.line}


def summed_loss_line(ctx: ProbeContext) -> dict | None:
    """The line that built a loss summed over the batch, when the training loss was one.

    The capture marks the training loss ``reduction: "sum"`` (``targets`` event); the call
    passing ``reduction="sum"`` (``nn.MSELoss(reduction="sum")``) nearest above the training
    loss call made it (an evaluation's summed loss further down is not it); else the file's
    only such call.
    """
    import ast

    run = getattr(ctx, "run", None)
    ev = run.of("targets") if run is not None else []
    if not ev or ev[-1].get("reduction") != "sum":
        return None
    used = ctx.ref("loss_fn") if hasattr(ctx, "ref") else None
    found = []
    for path, text in (getattr(ctx, "source_files", None) or {}).items():
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        found += [{"file": path, "line": n.lineno} for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and any(
                      k.arg == "reduction" and isinstance(k.value, ast.Constant) and
                      k.value.value == "sum" for k in n.keywords)]
    if used and found:  # the training loss call itself, else the nearest sum above it
        same = [f for f in found if f["file"] == used.get("file")]
        above = [f for f in same if f["line"] <= used.get("line", 0)]
        if above:
            return max(above, key=lambda f: f["line"])
    return min(found, key=lambda f: (f["file"], f["line"])) if len(found) == 1 else None


def undivided_accumulation(ctx: ProbeContext) -> dict | None:
    """The ``backward`` of a loop that accumulates micro-batches without dividing their losses.

    The capture saw several ``backward`` calls per optimizer step (``accumulation``) and no
    trainer scaled them (``loss_scaled``); the tensor back-propagated is a loss as computed,
    never divided (``loss = crit(out, y)`` then ``loss.backward()``, with no ``/ k`` on it):
    each update is the sum of ``backwards`` gradients. ``{"file", "line", "backwards"}``.
    """
    import ast

    run = getattr(ctx, "run", None)
    acc = run.first("accumulation") if run is not None else None
    where = ctx.ref("backward") if hasattr(ctx, "ref") else None
    if not acc or acc.get("backwards", 0) < 2 or run.first("loss_scaled") is not None or \
            not where or not isinstance(where.get("line"), int):
        return None
    text = (getattr(ctx, "source_files", None) or {}).get(where.get("file"))
    try:
        tree = ast.parse(text) if isinstance(text, str) else None
    except (SyntaxError, ValueError):
        tree = None
    call = next((n for n in ast.walk(tree) if isinstance(n, ast.Call) and
                 isinstance(n.func, ast.Attribute) and n.func.attr == "backward" and
                 n.lineno == where["line"]), None) if tree is not None else None
    # ``loss.backward()``, or ``torch.autograd.backward(loss)`` / ``accelerator.backward(loss)``
    tensor = call.args[0] if call is not None and call.args else \
        (call.func.value if call is not None else None)
    if not isinstance(tensor, ast.Name):
        return None  # ((loss / k).backward(): divided on the line itself)
    name, line = tensor.id, where["line"]
    made = [n for n in ast.walk(tree) if getattr(n, "lineno", line) < line and (
        isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                          for t in n.targets) or
        isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name) and
        n.target.id == name)]
    if not made:
        return None
    last = max(made, key=lambda n: n.lineno)
    if isinstance(last, ast.AugAssign) or any(
            isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.Mult))
            for n in ast.walk(last.value)):
        return None  # loss /= k, loss = crit(...) / k (or * 1 / k): divided
    return {"file": where["file"], "line": line, "backwards": int(acc["backwards"])}


def objective_line(ctx: ProbeContext) -> dict | None:
    """The line that computes the value the loop differentiates.

    ``loss = ...`` before ``loss.backward()`` or ``tape.gradient(loss, ...)``: the last
    assignment of that name above the call, in the function that makes it. The call is the one
    on the capture's ``backward`` line, else the only one in a method named ``train_step`` (a
    Keras model that trains itself, where the capture sees only ``fit``), else the file's only
    one. None when no such call or assignment is found.
    """
    import ast

    from ..provenance import own_walk

    used = ctx.ref("backward") if hasattr(ctx, "ref") else None
    calls = []  # (path, function node, call line, differentiated name)
    for path, text in (getattr(ctx, "source_files", None) or {}).items():
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        scopes = [tree] + [n for n in ast.walk(tree)
                           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for scope in scopes:
            for node in own_walk(scope):
                name = _differentiated(node)
                if name is not None:
                    calls.append((path, scope, node.lineno, name))
    chosen = [c for c in calls if used and c[0] == used.get("file") and
              c[2] == used.get("line")] or \
        [c for c in calls if getattr(c[1], "name", "") == "train_step"] or calls
    if len(chosen) != 1 and not (chosen and used and chosen[0][2] == used.get("line")):
        return None
    path, scope, line, name = chosen[0]
    made = [n.lineno for n in own_walk(scope) if isinstance(n, (ast.Assign, ast.AnnAssign,
                                                                   ast.AugAssign))
            and n.lineno <= line and any(isinstance(t, ast.Name) and t.id == name
                                         for t in (n.targets if isinstance(n, ast.Assign)
                                                   else [n.target]))]
    return {"file": path, "line": max(made)} if made else None


def _differentiated(node) -> str | None:
    """``loss`` of ``loss.backward()`` or ``tape.gradient(loss, ...)``, else None."""
    import ast

    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return None
    if node.func.attr == "backward" and isinstance(node.func.value, ast.Name):
        return node.func.value.id
    if node.func.attr == "gradient" and node.args and isinstance(node.args[0], ast.Name):
        return node.args[0].id
    return None
