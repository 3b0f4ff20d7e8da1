"""``graph_retention``: memory growth traced to tensors kept across steps.

Tensors that keep autograd history (each holds its graph), or a container of plain tensors that
holds most of the memory the run grew by (a cache never cleared): in the namespace left after
the run, or measured during it in the loop's frames (``held`` events, :mod:`~model_debugger.
capture.held`), so a local of a function that has returned counts too.
"""

from __future__ import annotations

from ..thresholds import GRAPHS_KEPT
from ._lint import lint_hits, loc
from .base import Probe, ProbeContext, register

MIN_TENSORS = 10
MIN_WHEN_GROWING = 3  # on a run whose memory grows steadily: each kept graph may be a whole epoch's


def retained(namespace: dict, history_only: bool = True) -> dict[str, tuple[int, int]]:
    """Containers in ``namespace`` holding tensors: name -> (count, bytes).

    Only tensors with autograd history (a ``grad_fn``) unless ``history_only`` is False.
    """
    import torch

    found = {}

    def look(name: str, value) -> None:
        items = value.values() if isinstance(value, dict) else value
        count = size = 0
        for item in list(items)[:100000]:
            if isinstance(item, torch.Tensor) and (item.grad_fn is not None or not history_only):
                count += 1
                size += item.numel() * item.element_size()
        if count:
            found[name] = (count, size)

    for name, value in list(namespace.items()):
        if name.startswith("__") or not isinstance(value, (list, tuple, dict, set)):
            continue
        look(name, value)
        if isinstance(value, dict):  # a history dict of lists: history['val_loss']
            for key, inner in list(value.items())[:64]:
                if isinstance(key, (str, int)) and isinstance(inner, (list, tuple)):
                    look(f"{name}[{key!r}]", inner)
    return found


def _growing_line(ctx: ProbeContext, name: str, anywhere: bool = False) -> dict | None:
    """The line in a loop that adds to container ``name`` (``name.append(...)``, ``name[k] =``).

    An attribute of one of the user's objects (``callbacks[0].snapshots``) is added to by a
    method of its class (a callback's ``on_train_batch_end``): ``self.snapshots.append``
    anywhere in the file.
    """
    import ast

    for path, text in (ctx.source_files or {}).items():
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for loop in ast.walk(tree):
            if not (anywhere and isinstance(loop, ast.FunctionDef) or
                    isinstance(loop, (ast.For, ast.While))):
                continue
            for node in ast.walk(loop):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                        node.func.attr in ("append", "extend", "add", "insert") and \
                        isinstance(node.func.value, (ast.Name, ast.Subscript, ast.Attribute)) \
                        and ast.unparse(node.func.value).replace('"', "'") == name:
                    return {"file": path, "line": node.lineno}
                if isinstance(node, ast.Assign) and any(
                        isinstance(t, ast.Subscript) and
                        isinstance(t.value, (ast.Name, ast.Attribute)) and
                        ast.unparse(t.value) == name for t in node.targets):
                    return {"file": path, "line": node.lineno}
    if "." in name and not name.startswith("self."):  # an object's attribute: its own
        return _growing_line(ctx, "self." + name.rsplit(".", 1)[1], anywhere=True)  # method
    return _returned_growing(ctx, name)


def _returned_growing(ctx: ProbeContext, name: str) -> dict | None:
    """Where a container a function of the file made and returned is added to.

    ``activity = attach_monitor(model)`` returning ``log``, whose hook (a nested function)
    runs ``log[name].append(out)``: the container seen as ``activity['act1']`` grows there.
    """
    import ast
    import re

    root = re.match(r"[A-Za-z_]\w*", name)
    if root is None or root.group(0) == "self":
        return None
    for path, text in (ctx.source_files or {}).items():
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        funcs = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and
                    isinstance(node.value.func, ast.Name) and node.value.func.id in funcs and
                    any(isinstance(t, ast.Name) and t.id == root.group(0)
                        for t in node.targets)):
                continue
            func = funcs[node.value.func.id]
            made = {r.value.id for r in ast.walk(func) if isinstance(r, ast.Return) and
                    isinstance(r.value, ast.Name)}
            for call in ast.walk(func):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and \
                        call.func.attr in ("append", "extend", "add", "insert"):
                    base = call.func.value
                    while isinstance(base, ast.Subscript):
                        base = base.value
                    if isinstance(base, ast.Name) and base.id in made:
                        return {"file": path, "line": call.lineno}
    return None


@register
class GraphRetention(Probe):
    """Containers of the user's namespace that keep tensors with autograd history."""

    id = "graph_retention"
    categories = ("memory_issue",)
    traces_origin = False  # a cache's line is where it grows, wherever its data came from
    fix = ("Store losses with .item() (or .detach()) so tensors that carry autograd history are "
           "not kept across steps.")

    def run(self, ctx: ProbeContext):
        """Confirmed when one container holds >= 10 tensors with a ``grad_fn``.

        Or when the record measured past steps' losses kept alive (``graphs_kept``, >= 90%),
        located at the lint's line when it has one. Else each lint hit is a hypothesis.
        """
        kept_by_model = _model_state_with_history(ctx)
        if kept_by_model is not None:
            return [kept_by_model]
        hits = lint_hits(ctx, "graph_retention")
        namespace = ctx.namespace
        held = retained(namespace) if namespace else {}
        growing = getattr(ctx.classification, "primary", None) == "memory_issue" and \
            (ctx.signals.get("rss_growth_mb") or ctx.signals.get("cuda_growth_mb") or 0) > 0
        least = MIN_WHEN_GROWING if growing else MIN_TENSORS
        held = {k: v for k, v in held.items() if v[0] >= least}
        growth = ctx.signals.get("rss_slope_mb_per_step")
        if held:
            name, (count, size) = max(held.items(), key=lambda kv: kv[1][0])
            base = name.split("[", 1)[0]
            hit = next((h for h in hits if base in _line(ctx, h)), None)
            where = _growing_line(ctx, name) or (loc(hit) if hit else None) or \
                (loc(hits[0]) if hits else None) or ctx.ref("backward")
            return [self.finding(
                "training_loop", True,
                f"'{name}' holds {count} tensors that still carry autograd history "
                f"(grad_fn): each keeps its whole graph, activations included, alive across "
                f"steps, so memory grows every step"
                f"{f' ({growth:.3g} MB/step measured)' if growth is not None else ''}. Store "
                "`.item()` or `.detach()` values instead.",
                where, variable=name, tensors=count,
                tensor_bytes=size, rss_mb_per_step=growth, strength=0.95)]
        kept = self._held_graphs(ctx, growth)
        if kept is not None:
            return [kept]
        cache = self._cache(ctx, namespace, growth) or self._held(ctx)
        if cache is not None:
            return [cache]
        kept = ctx.signals.get("graphs_kept_share")
        if kept is not None and kept >= GRAPHS_KEPT:
            seen = ctx.run.first("graphs_kept") or {}
            checked = seen.get("checked", 0)
            what, alive = max((("loss tensors", seen.get("alive", 0)),
                               ("predictions", seen.get("outputs_alive", 0))), key=lambda w: w[1])
            return [self.finding(
                "training_loop", True,
                f"{alive} {what} of the {checked} past steps looked at were still alive "
                f"{seen.get('lag')} steps later, each holding its whole autograd graph (the "
                "activations it saved): the loop keeps them, so memory grows every step"
                + (f" ({growth:.3g} MB/step measured)" if growth else "")
                + ". Store `.item()` or `.detach()` values instead.",
                loc(hits[0]) if hits else ctx.ref("backward"), graphs_kept_share=kept,
                rss_mb_per_step=growth, strength=0.9)]
        return [self.finding("training_loop", False, h.message + " (not measured)", loc(h),
                             strength=0.3) for h in hits]

    def _cache(self, ctx: ProbeContext, namespace, growth):
        """A container of plain tensors holding most of the measured memory growth, or None."""
        grown = ctx.signals.get("rss_growth_mb") or ctx.signals.get("cuda_growth_mb")
        if not namespace or not grown or grown <= 0:
            return None
        held = {k: v for k, v in retained(namespace, history_only=False).items()
                if v[0] >= MIN_TENSORS and v[1] / 2**20 >= CACHE_SHARE * grown}
        if not held:
            return None
        name, (count, size) = max(held.items(), key=lambda kv: kv[1][1])
        return _cache_finding(self, ctx, name, count, size, grown, _growing_line(ctx, name))


    def _held_graphs(self, ctx: ProbeContext, growth):
        """Tensors with autograd history piling up in a container while the run was looked at.

        A container in the loop's frames (or a ``self`` attribute, or a dict's list) whose count
        of tensors with a ``grad_fn`` rose to >= ``MIN_WHEN_GROWING`` across the ``held``
        looks. Located where the container is added to: what keeps the graphs, so what
        makes memory grow. When they were made by an evaluation run outside ``no_grad`` (the
        lint's ``eval_without_no_grad``) and the container grew slower than once a step (a
        per-epoch validation history), that evaluation is named too (``made_at``): either
        change ends the growth.
        """
        by: dict[tuple, list] = {}
        for event in ctx.run.of("held"):
            for c in event.get("containers", []):
                if isinstance(c.get("graphs"), int):
                    by.setdefault((c.get("name"), c.get("file"), c.get("func")), []).append(
                        (event["step"], c))
        best = None
        for (name, _file, _func), seen in by.items():
            (s0, first), (s1, last) = seen[0], seen[-1]
            if s1 > s0 and last["graphs"] >= MIN_WHEN_GROWING and \
                    last["graphs"] > first["graphs"] and \
                    (best is None or last["graphs"] > best[1]["graphs"]):
                best = (name, last, (last["graphs"] - first["graphs"]) / (s1 - s0))
        if best is None:
            return None
        name, last, per_step = best
        grows = _growing_line(ctx, name)
        made = _evaluation_feeding(ctx, grows) if per_step < 0.5 else None
        at_eval = made is not None
        where = grows or made or {"file": last["file"], "line": last["line"]}
        return self.finding(
            "training_loop", True,
            f"'{name}' held {last['graphs']} tensors that still carry autograd history at "
            f"step {max(s for s, _ in by[(name, last['file'], last['func'])])} and kept "
            f"gaining them ({per_step:.3g} a step): each keeps its whole graph, activations "
            "included, alive, so memory grows"
            + (f" ({growth:.3g} MB/step measured)" if growth is not None else "")
            + (f". They are made by an evaluation that runs outside torch.no_grad() (line "
               f"{made['line']}): store `.item()` values here, or wrap that evaluation in "
               "`with torch.no_grad():`." if at_eval else
               ". Store `.item()` or `.detach()` values instead."),
            where, variable=name, tensors=last["graphs"], graphs_per_step=per_step,
            rss_mb_per_step=growth, strength=0.9,
            **({"made_at": made} if at_eval else {}))

    def _held(self, ctx: ProbeContext):
        """The same, from the record: a container in the loop's frames that grew during the run.

        Looked at while it ran (``held`` events), so a local of a function that has returned
        since counts too.
        """
        from ..signals import growing_container

        share = ctx.signals.get("held_share")
        if share is None or share < CACHE_SHARE:
            return None
        held = growing_container(ctx.run)
        name, last = held["name"], held["last"]
        where = _growing_line(ctx, name) or {"file": held["file"], "line": held["line"]}
        owner = _owner(where)
        return self.finding(
            owner, True,
            f"'{name}' grew by {held['mb_per_step']:.3g} MB per step while the run was looked "
            f"at ({last['len']} items, {last['bytes'] / 2**20:.1f} MB at the last look), "
            f"{min(share, 1.0):.0%} of the memory growth measured: a cache "
            + _OWNERS[owner], where, variable=name, items=last["len"],
            tensor_bytes=last["bytes"], held_mb_per_step=held["mb_per_step"], held_share=share,
            strength=0.85)


def _model_state_with_history(ctx: ProbeContext):
    """A finding when the trained model keeps a buffer with autograd history.

    A registered buffer a module assigns from its own computation without
    ``detach()`` (``self.running_mean = (1 - m) * self.running_mean + m * x.mean(0)``) holds
    that step's graph, and the next step's value is computed from it: the graphs of every
    step stay chained and alive. Read on the live model after the run (decisive); located at
    the module's ``self.<name> = ...``; the layer's code: ``architecture``.
    """
    import torch

    from ..capture.codeloc import definition_location
    from ._made import attribute_line

    model = ctx.model
    if not isinstance(model, torch.nn.Module):
        return None
    for qual, module in model.named_modules():
        kept = [name for name, t in module.named_buffers(recurse=False)
                if isinstance(t, torch.Tensor) and t.grad_fn is not None]  # (a buffer is state
        # meant to carry no gradient; a plain attribute may hold one step's graph on purpose:
        # a weight-normed weight, an auxiliary loss)
        if not kept:
            continue
        made = definition_location(module) or _class_line(ctx, type(module).__name__)
        line = attribute_line(ctx.source_files.get(made["file"], "") if made else "",
                              made["line"] if made else None, kept[0])
        where = {**made, "line": line} if made and line else made or ctx.ref("model")
        return GraphRetention().finding(
            "architecture", True,
            f"The module '{qual or type(module).__name__}' keeps its buffer "
            f"{', '.join(kept[:3])} as a tensor that still carries autograd history after the "
            "run: it is assigned from "
            "the step's computation without detach(), so each step's value, and the graph "
            "behind it, is built on the last one's and every step's graph stays alive. Assign "
            "it under torch.no_grad() or from .detach()ed values.",
            where, module=qual, state=kept, strength=0.95, decisive=True)
    return None


def _class_line(ctx: ProbeContext, name: str) -> dict | None:
    """Where the user's sources define a class ``name`` (one definition only), or None."""
    import ast

    found = []
    for path, text in (ctx.source_files or {}).items():
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        found += [{"file": path, "line": n.lineno} for n in ast.walk(tree)
                  if isinstance(n, ast.ClassDef) and n.name == name]
    return found[0] if len(found) == 1 else None


def _evaluation_feeding(ctx: ProbeContext, grows: dict | None) -> dict | None:
    """The lint's evaluation outside ``no_grad`` that made what is added at ``grows``, or None.

    The hit must be the line that made what is added (``val_loss = crit(model(Xv), yv)``
    then appended), or lie in a function of the file whose result is what is added
    (``val_loss, acc = self.evaluate()`` then appended).
    """
    import ast

    from ..provenance import data_origin

    hits = lint_hits(ctx, "eval_without_no_grad")
    if not hits or grows is None:
        return None
    text = ctx.source_files.get(grows["file"])
    try:
        tree = ast.parse(text) if text else None
    except (SyntaxError, ValueError):
        tree = None
    if tree is None:
        return None
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    origin = data_origin(grows) or grows
    stmts = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and not isinstance(
        n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.While, ast.If,
            ast.With, ast.Try)) and n.lineno <= origin["line"] <= (n.end_lineno or n.lineno)]
    called = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)
              for st in stmts for n in ast.walk(st) if isinstance(n, ast.Call)}
    spans = [(f.lineno, f.end_lineno or f.lineno) for f in funcs if f.name in called]
    return next((loc(h) for h in hits if h.file == grows["file"] and
                 (any(a <= h.line <= b for a, b in spans) or
                  abs(h.line - origin["line"]) <= 1)), None)


CACHE_SHARE = 0.5  # of the memory growth measured, held by one container of tensors


# who adds to a cache of plain tensors that is never cleared, by the root cause it makes
_OWNERS = {"training_loop": "the loop adds to every step and never clears.",
           "data": "the data pipeline (a dataset, a transform, a collate function) adds to "
                   "for every sample it makes and never clears."}


def _owner(where: dict | None) -> str:
    """``data`` when the line adding to a cache is in the code that makes the batches."""
    from ..provenance import in_data_pipeline

    return "data" if in_data_pipeline(where) else "training_loop"


def _cache_finding(probe, ctx, name, count, size, growth_mb, line):
    where = line or ctx.ref("backward")
    owner = _owner(line)
    return probe.finding(
        owner, True,
        f"'{name}' holds {count} tensors ({size / 2**20:.1f} MB), at least half of the "
        f"{growth_mb:.1f} MB the process grew by during the run: a cache " + _OWNERS[owner],
        where, variable=name, tensors=count, tensor_bytes=size, rss_growth_mb=growth_mb,
        strength=0.85)


def _line(ctx: ProbeContext, hit) -> str:
    text = ctx.source_files.get(hit.file, "").splitlines()
    return text[hit.line - 1] if 0 < hit.line <= len(text) else ""
