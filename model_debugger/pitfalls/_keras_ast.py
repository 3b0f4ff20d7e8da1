"""AST machinery behind :mod:`.keras_lint`: scopes, reaching definitions, tracing, Keras vocabulary.

Pure syntax; neither tensorflow nor keras is imported. A name is resolved to the last assignment
that ends before the use in the same scope (a function body or the module), falling back to the
module for names a function reads but never binds. Enough for scripts and notebook cells, not a
type checker: a name bound in a loop, a ``with`` block or by an import resolves to nothing, and
every rule then stays silent.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ._torch_ast import _dotted

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef)
_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)

# loss name with underscores removed, lower-cased -> family
LOSS_FAMILY = {
    "categoricalcrossentropy": "categorical", "categoricalfocalcrossentropy": "categorical",
    "sparsecategoricalcrossentropy": "sparse", "binarycrossentropy": "binary",
    "binaryfocalcrossentropy": "binary",
}
# classes whose first positional parameter is from_logits
_FROM_LOGITS_FIRST = {"CategoricalCrossentropy", "SparseCategoricalCrossentropy",
                      "BinaryCrossentropy"}
# layers that pass the previous layer's output through unchanged in kind (no activation)
_PASS_LAYERS = {"Dropout", "Flatten", "Reshape", "GaussianNoise", "GaussianDropout",
                "AlphaDropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D",
                "ActivityRegularization", "Identity"}
# methods / array functions that keep the data as it is (scale and meaning); tf.data plumbing
_KEEP_METHODS = {"reshape", "astype", "copy", "squeeze", "flatten", "ravel", "transpose",
                 "batch", "shuffle", "prefetch", "cache", "repeat", "take", "skip", "unbatch"}
_KEEP_FUNCS = {"array", "asarray", "expand_dims", "squeeze", "reshape", "cast",
               "convert_to_tensor", "ascontiguousarray", "float32"}


dotted = _dotted  # ``a.b.c`` for a Name/Attribute chain, else None (shared with torch)


def tail(call: ast.AST) -> str | None:
    """The last name of a call's function (``Dense`` for ``layers.Dense(...)``)."""
    if not isinstance(call, ast.Call):
        return None
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def kwarg(call: ast.Call, name: str, index: int | None = None) -> ast.AST | None:
    """The argument ``name=`` of ``call``, or its positional argument ``index``."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    if index is not None and len(call.args) > index \
            and not any(isinstance(a, ast.Starred) for a in call.args[:index + 1]):
        return call.args[index]
    return None


def pos(node: ast.AST) -> tuple[int, int]:
    return (node.lineno, node.col_offset)


def const_str(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


@dataclass(frozen=True)
class Def:
    """One binding of a name: ``kind`` is assign, unpack, aug or opaque."""

    kind: str
    end: tuple[int, int]
    stmt: ast.AST
    value: ast.AST | None = None
    path: tuple[int, ...] = ()


@dataclass(frozen=True)
class Layer:
    """The last effective layer of a model: its output kind and the node that decides it."""

    kind: str  # softmax, sigmoid, linear, other, unknown
    node: ast.AST  # the activation argument, the Softmax/Activation layer or the function call
    dense: bool = False
    units: int | None = None


class Index:
    """File-wide facts: parents, per-scope bindings, classes, functions, every call."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.parent: dict[int, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parent[id(child)] = node
        self.calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=pos)
        self.tails = {tail(c) for c in self.calls}
        self.classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        self.functions = {n.name: n for n in ast.walk(tree) if isinstance(n, _SCOPES)}
        self.defs: dict[int, dict[str, list[Def]]] = {}
        for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, _SCOPES))]:
            table: dict[str, list[Def]] = {}
            for stmt in scope.body:
                self._collect(stmt, table)
            self.defs[id(scope)] = table

    # --- bindings ---------------------------------------------------------------------------

    def _collect(self, node: ast.AST, table: dict) -> None:
        end = (getattr(node, "end_lineno", 0), getattr(node, "end_col_offset", 0))
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self._bind(target, node, node.value, (), end, table)
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            self._bind(node.target, node, node.value, (), end, table)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            table.setdefault(node.target.id, []).append(Def("aug", end, node))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            tend = (node.target.end_lineno, node.target.end_col_offset)
            for name in ast.walk(node.target):
                if isinstance(name, ast.Name):
                    table.setdefault(name.id, []).append(Def("opaque", tend, node))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            for name in ast.walk(node.optional_vars):
                if isinstance(name, ast.Name):
                    table.setdefault(name.id, []).append(Def("opaque", end, node))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                name = (alias.asname or alias.name).split(".")[0]
                table.setdefault(name, []).append(Def("opaque", end, node))
        if isinstance(node, _NESTED):
            if not isinstance(node, ast.Lambda):
                table.setdefault(node.name, []).append(Def("opaque", end, node))
            return
        for child in ast.iter_child_nodes(node):
            self._collect(child, table)

    def _bind(self, target, stmt, value, path, end, table) -> None:
        if isinstance(target, ast.Name):
            table.setdefault(target.id, []).append(
                Def("unpack" if path else "assign", end, stmt, value, path))
        elif isinstance(target, (ast.Tuple, ast.List)):
            for i, elt in enumerate(target.elts):
                if isinstance(elt, ast.Starred):
                    for name in ast.walk(elt):
                        if isinstance(name, ast.Name):
                            table.setdefault(name.id, []).append(Def("opaque", end, stmt))
                else:
                    self._bind(elt, stmt, value, (*path, i), end, table)

    def scope_of(self, node: ast.AST) -> ast.AST:
        cur = self.parent.get(id(node))
        while cur is not None and not isinstance(cur, _SCOPES):
            cur = self.parent.get(id(cur))
        return cur if cur is not None else self.tree

    def reaching(self, name: str, scope: ast.AST, at: tuple[int, int]) -> Def | None:
        """The binding of ``name`` that reaches position ``at`` in ``scope``; None if unknown."""
        own = [d for d in self.defs.get(id(scope), {}).get(name, []) if d.end <= at]
        if own:
            return max(own, key=lambda d: d.end)
        if scope is self.tree or name in {a.arg for a in ast.walk(scope.args)
                                          if isinstance(a, ast.arg)}:
            return None
        glob = self.defs[id(self.tree)].get(name, [])
        return max(glob, key=lambda d: d.end) if glob else None

    def value_of(self, expr: ast.AST, scope: ast.AST, at: tuple[int, int], depth: int = 8):
        """Follow plain ``name = value`` bindings; returns (expr, position it is evaluated at)."""
        while isinstance(expr, ast.Name) and depth > 0:
            d = self.reaching(expr.id, scope, at)
            if d is None or d.kind not in ("assign", "unpack"):
                return expr, at
            value = pick(d.value, d.path)
            if value is None:
                return expr, at
            expr, at, depth = value, pos(d.stmt), depth - 1
        return expr, at

    # --- tracing data back to where it was made -----------------------------------------------

    def trace(self, expr: ast.AST, scope: ast.AST, at: tuple[int, int], slot: int | None = None):
        """Follow data back through bindings and shape-only operations.

        Parameters
        ----------
        expr : ast.AST
            The expression passed on (an argument of ``fit``).
        scope, at :
            Where it is evaluated.
        slot : int or None
            For ``from_tensor_slices((x, y))``: which element to follow (0 inputs, 1 labels).

        Returns
        -------
        tuple
            ``(kind, node, path, chain)``: kind ``expr`` (a node that is not a plain pass-through),
            ``unpack`` (a call unpacked at ``path``), ``aug`` (an augmented assignment) or
            ``unknown``; ``chain`` holds the pass-through calls met on the way, and the marker
            ``"slices"`` when a ``from_tensor_slices`` tuple was entered.
        """
        chain: list = []
        for _ in range(60):
            if isinstance(expr, ast.Name):
                d = self.reaching(expr.id, scope, at)
                if d is None or d.kind == "opaque":
                    return "unknown", expr, (), chain
                if d.kind == "aug":
                    return "aug", d.stmt, (), chain
                value = pick(d.value, d.path)
                if value is None:
                    return "unpack", d.value, d.path, chain
                expr, at = value, pos(d.stmt)
            elif isinstance(expr, ast.Subscript):
                chain.append(expr)
                expr = expr.value
            elif isinstance(expr, ast.Call):
                name = tail(expr)
                if isinstance(expr.func, ast.Attribute) and name in _KEEP_METHODS \
                        and dotted(expr.func.value) not in ("np", "numpy", "tf", "ops"):
                    chain.append(expr)
                    expr = expr.func.value
                elif name in _KEEP_FUNCS and expr.args:
                    chain.append(expr)
                    expr = expr.args[0]
                elif name == "from_tensor_slices" and slot is not None and expr.args \
                        and isinstance(expr.args[0], (ast.Tuple, ast.List)) \
                        and len(expr.args[0].elts) > slot:
                    chain.append("slices")
                    expr = expr.args[0].elts[slot]
                else:
                    return "expr", expr, (), chain
            else:
                return "expr", expr, (), chain
        return "unknown", expr, (), chain

    # --- models -------------------------------------------------------------------------------

    def model_of(self, expr: ast.AST, scope: ast.AST, at: tuple[int, int], depth: int = 0):
        """The node that makes the model ``expr`` holds: a Sequential/Model call or a subclass."""
        if depth > 6:
            return None
        expr, at = self.value_of(expr, scope, at)
        if not isinstance(expr, ast.Call):
            return None
        name = tail(expr)
        if name == "Sequential" or (name in ("Model", "Functional") and self.outputs(expr)):
            return expr
        if isinstance(expr.func, ast.Name) and expr.func.id in self.classes:
            cls = self.classes[expr.func.id]
            return cls if self.is_model_class(cls) else None
        if isinstance(expr.func, ast.Name) and expr.func.id in self.functions:
            fn = self.functions[expr.func.id]
            rets = [r for r in own_nodes(fn) if isinstance(r, ast.Return) and r.value]
            if rets:
                last = max(rets, key=pos)
                return self.model_of(last.value, fn, pos(last), depth + 1)
        return None

    def is_model_class(self, cls: ast.ClassDef, depth: int = 0) -> bool:
        for base in cls.bases:
            name = (dotted(base) or "").split(".")[-1]
            if name in ("Model", "Sequential"):
                return True
            if name in self.classes and depth < 5 and self.is_model_class(self.classes[name],
                                                                           depth + 1):
                return True
        return False

    @staticmethod
    def outputs(call: ast.Call) -> ast.AST | None:
        return kwarg(call, "outputs", 1)

    def last_layer(self, model: ast.AST) -> Layer | None:
        """The last layer that decides the output of ``model`` (None when it cannot be told)."""
        try:
            if isinstance(model, ast.ClassDef):
                return self._class_output(model)
            if tail(model) == "Sequential":
                return self._sequential_output(model, 0)
            return self._output(self.outputs(model), self.scope_of(model), pos(model), None)
        except RecursionError:
            return None

    def adds(self, model: ast.Call) -> list[ast.Call]:
        return [c for c in self.calls if tail(c) == "add" and isinstance(c.func, ast.Attribute)
                and len(c.args) == 1 and self.model_of(c.func.value, self.scope_of(c), pos(c))
                is model]

    def _sequential_output(self, model: ast.Call, depth: int) -> Layer | None:
        scope = self.scope_of(model)
        first, at = self.value_of(kwarg(model, "layers", 0), scope, pos(model))
        items = [(e, scope, at) for e in getattr(first, "elts", [])]
        items += [(c.args[0], self.scope_of(c), pos(c)) for c in self.adds(model)]
        found = None
        for expr, sc, at in reversed(items):
            layer, _ = self.value_of(expr, sc, at)
            if tail(layer) == "Sequential" and depth < 4:
                return _units_from(found, self._sequential_output(layer, depth + 1))
            here = classify_layer(layer)
            if here == "pass":
                continue
            if found is None:
                found = here
                if not _separate_activation(found):
                    return found
            else:  # the layer before a separate Activation: its units
                return _units_from(found, here)
        return found

    def _class_output(self, cls: ast.ClassDef) -> Layer | None:
        calls = [f for f in cls.body if isinstance(f, _SCOPES) and f.name == "call"]
        if not calls:
            return None
        rets = [r for r in own_nodes(calls[0]) if isinstance(r, ast.Return) and r.value]
        if not rets:
            return None
        last = max(rets, key=pos)
        return self._output(last.value, calls[0], pos(last), cls)

    def _attr_layer(self, cls: ast.ClassDef, attr: str) -> ast.AST | None:
        found = None
        for node in ast.walk(cls):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and t.attr == attr \
                            and dotted(t.value) == "self":
                        found = node.value
        return found

    def _output(self, expr, scope, at, cls) -> Layer | None:
        """The layer behind a functional output tensor or the value ``call`` returns."""
        found = None
        for _ in range(30):
            expr, at = self.value_of(expr, scope, at)
            if not isinstance(expr, ast.Call):
                return None
            name = tail(expr)
            if name in ("softmax", "sigmoid") and not isinstance(expr.func, ast.Call) \
                    and dotted(expr.func) not in ("self.softmax", "self.sigmoid"):
                return Layer(name, expr)
            func = expr.func
            if isinstance(func, ast.Attribute) and dotted(func.value) == "self" and cls:
                layer = self._attr_layer(cls, func.attr)
            elif isinstance(func, ast.Name):
                layer, _ = self.value_of(func, scope, at)
            else:
                layer = func
            if not isinstance(layer, ast.Call):
                return None
            if tail(layer) == "Sequential":
                return self._sequential_output(layer, 1)
            here = classify_layer(layer)
            if here != "pass":
                if found is not None:  # the layer before a separate Activation: its units
                    return _units_from(found, here)
                found = here
                if not _separate_activation(found):
                    return found
            if not expr.args:
                return found
            expr = expr.args[0]
        return found


def _separate_activation(layer) -> bool:
    """An ``Activation`` / ``Softmax`` layer of its own: the units are the previous layer's."""
    return isinstance(layer, Layer) and tail(layer.node) in ("Activation", "Softmax")


def _units_from(found: Layer | None, before) -> Layer | None:
    """``found`` (a separate activation) with the units of the layer ``before`` it."""
    if found is None or not isinstance(before, Layer):
        return found
    return Layer(found.kind, found.node, before.dense, before.units)


def pick(value: ast.AST | None, path: tuple[int, ...]) -> ast.AST | None:
    """The element at ``path`` of a literal tuple/list ``value``; None if it is not literal."""
    for i in path:
        if not isinstance(value, (ast.Tuple, ast.List)) or i >= len(value.elts) \
                or any(isinstance(e, ast.Starred) for e in value.elts):
            return None
        value = value.elts[i]
    return value


def own_nodes(fn: ast.AST):
    """Nodes of a function body, not descending into nested functions, classes or lambdas."""
    stack = list(fn.body)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, _NESTED))


def activation_kind(node: ast.AST | None) -> str:
    """softmax, sigmoid, linear, other or unknown for an ``activation=`` value."""
    if node is None or (isinstance(node, ast.Constant) and node.value is None):
        return "linear"
    name = const_str(node)
    if name is not None:
        name = name.lower()
        return name if name in ("softmax", "sigmoid", "linear") else "other"
    full = dotted(node) or ""
    name = full.split(".")[-1].lower()
    if name in ("softmax", "sigmoid", "linear"):
        return name
    if "activations" in full or full.startswith(("tf.nn.", "nn.", "ops.", "keras.ops")):
        return "other"
    return "unknown"


def classify_layer(layer: ast.AST) -> Layer | str | None:
    """The output kind of one layer constructor; ``"pass"`` for pass-through layers."""
    name = tail(layer)
    if name is None:
        return None
    if name in _PASS_LAYERS:
        return "pass"
    if name == "Softmax":
        return Layer("softmax", layer)
    if name == "Activation":
        arg = kwarg(layer, "activation", 0)
        return Layer(activation_kind(arg), layer)
    arg = kwarg(layer, "activation", 1 if name == "Dense" else None)
    if arg is None and name != "Dense":
        return Layer("unknown", layer)
    units = kwarg(layer, "units", 0)
    units = units.value if isinstance(units, ast.Constant) and isinstance(units.value, int) \
        else None
    return Layer(activation_kind(arg), arg if arg is not None else layer, name == "Dense", units)


def loss_info(expr: ast.AST | None, index: Index, scope: ast.AST, at) -> tuple | None:
    """``(family, from_logits)`` of a loss expression; from_logits None when not a literal."""
    if expr is None:
        return None
    expr, at = index.value_of(expr, scope, at)
    text = const_str(expr)
    if text is None and isinstance(expr, (ast.Name, ast.Attribute)):
        text = (dotted(expr) or "").split(".")[-1]
    if text is not None:
        family = LOSS_FAMILY.get(text.replace("_", "").lower())
        return (family, False) if family else None
    name = tail(expr)
    family = LOSS_FAMILY.get((name or "").replace("_", "").lower())
    if family is None:
        return None
    flag = kwarg(expr, "from_logits", 0 if name in _FROM_LOGITS_FIRST else None)
    if flag is None:
        return family, False
    if isinstance(flag, ast.Constant) and isinstance(flag.value, bool):
        return family, flag.value
    return family, None
