"""Syntax layer of the PyTorch lint (:mod:`.torch_lint`): vocabulary, AST helpers, file facts.

The names of torch APIs the rules recognise; small pure functions over ``ast`` nodes and over the
name-to-binding environments that :mod:`._torch_flow` threads through a scope; and ``_Facts``,
what the whole file says about names (models, losses, activation layers, optimizers). Pure
syntax; torch is never imported.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Sequence

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_TRY = (ast.Try, getattr(ast, "TryStar", ast.Try))
_ROOTS = {"torch", "nn", "F", "np", "numpy", "math", "functional", "optim", "torchvision"}
_NUMERIC = {"np", "numpy", "math", "statistics"}
_PASS = {"squeeze", "unsqueeze", "view", "reshape", "flatten", "float", "double", "half", "to",
         "cuda", "cpu", "contiguous", "permute", "transpose", "clamp", "clip", "requires_grad_",
         "view_as", "reshape_as", "type", "bfloat16"}
_MODULE_PASS = {"to", "cuda", "cpu", "float", "double", "half", "train", "eval", "bfloat16",
                "requires_grad_"}
_DETACH = {"detach", "detach_"}
_CUT = {"item", "tolist", "numpy", "argmax", "argmin", "long", "int", "bool", "eq", "ne", "gt",
        "ge", "lt", "le", "size", "dim", "numel", "nonzero", "sign", "round", "floor", "ceil",
        "isnan", "isfinite", "grad"}
_CUT_FUNCS = {"float", "int", "len", "str", "bool", "round", "repr", "format", "print"}
_NOGRAD_ATTRS = {"data", "shape", "grad", "dtype", "device", "ndim", "requires_grad", "is_cuda"}
_ACT_CTOR = {"Softmax": "softmax", "LogSoftmax": "log_softmax", "Sigmoid": "sigmoid"}
_ACT_FN = {"softmax": "softmax", "log_softmax": "log_softmax", "sigmoid": "sigmoid"}
_LOSS_KIND = {"CrossEntropyLoss": "ce", "cross_entropy": "ce", "BCEWithLogitsLoss": "bcel",
              "binary_cross_entropy_with_logits": "bcel", "NLLLoss": "nll", "nll_loss": "nll",
              "BCELoss": "bce", "binary_cross_entropy": "bce"}
_CRITERIA = {"criterion", "loss_fn", "loss_func", "lossfn", "loss_function", "crit", "objective"}
_MISMATCH = {("softmax", "ce"), ("log_softmax", "ce"), ("sigmoid", "bcel")}
_MODULE_SIGNALS = {"eval", "parameters", "named_parameters", "modules", "named_modules",
                   "children", "buffers"}
_OPTIMS = {"SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam",
           "LBFGS", "SparseAdam", "ASGD", "Rprop", "Lion", "Adafactor"}
_BUILTINS = set(dir(builtins))
_WRAPPERS = r"accelerat|fabric|engine|trainer|deepspeed"


def _dotted(node) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _tail(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def _line(node) -> int:
    """The line of the interesting token: ``.detach``/``.backward`` in a chain, else the start."""
    f = node.func if isinstance(node, ast.Call) else node
    return f.end_lineno if isinstance(f, ast.Attribute) else node.lineno


def _pos(n):
    return getattr(n, "lineno", 0), getattr(n, "col_offset", 0)


def _nodes(root) -> list:
    """``root`` and everything under it, without entering nested scopes."""
    out, stack = [], [root]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(c for c in ast.iter_child_nodes(n) if not isinstance(c, _SCOPES))
    return out


def _scan(root, backs: list, train: set) -> None:
    """Collect backward calls and the loops that enclose one, without entering nested scopes."""
    stack = [(root, ())]
    while stack:
        node, loops = stack.pop()
        if _is_backward(node):
            backs.append(node)
            train.update(map(id, loops))
        if isinstance(node, _LOOPS):
            loops = (*loops, node)
        stack.extend((c, loops) for c in ast.iter_child_nodes(node) if not isinstance(c, _SCOPES))


def _args(call: ast.Call) -> list:
    return [*call.args, *(k.value for k in call.keywords)]


def _input(call: ast.Call):
    """The prediction argument of a loss call."""
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg in ("input", "logits")), None)


def _kids(e) -> list:
    """The sub-expressions whose values flow into ``e``."""
    if isinstance(e, (ast.Subscript, ast.Starred)):
        return [e.value]
    if isinstance(e, (ast.Compare, ast.JoinedStr, ast.Constant)):
        return []
    if isinstance(e, (ast.GeneratorExp, ast.ListComp, ast.SetComp)):
        return [e.elt]
    if isinstance(e, ast.Dict):
        return [v for v in e.values if v is not None]
    return [c for c in ast.iter_child_nodes(e) if isinstance(c, ast.expr)]


def _is_backward(n) -> bool:
    return isinstance(n, ast.Call) and _tail(n) == "backward"


def _bw_exprs(call: ast.Call, roots: set) -> list:
    """What a backward call differentiates.

    ``loss`` in ``loss.backward(gradient)``, and in ``torch.autograd.backward(loss)`` /
    ``accelerator.backward(loss)``.
    """
    rd = _dotted(call.func.value) if isinstance(call.func, ast.Attribute) else None
    if isinstance(call.func, ast.Attribute) and not (rd and (
            rd.split(".")[0] in roots or re.search(_WRAPPERS, rd.lower()))):
        return [call.func.value]
    return call.args[:1]


def _const_false(e) -> bool:
    return isinstance(e, ast.Constant) and e.value is False


def _mode_arg(call: ast.Call):
    return call.args[0] if call.args else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)


def _grad_mode(e) -> bool | None:
    """True inside ``no_grad``/``inference_mode``, False inside ``enable_grad``, else None."""
    t = _tail(e) if isinstance(e, ast.Call) else e.attr if isinstance(e, ast.Attribute) else None
    if t in ("no_grad", "inference_mode"):
        return True
    if t == "enable_grad":
        return False
    if t == "set_grad_enabled" and isinstance(e, ast.Call) and e.args:
        a = e.args[0]
        return (not a.value) if isinstance(a, ast.Constant) else None
    return None


def _own(s) -> list:
    """The expressions a statement evaluates itself (not those of its nested blocks)."""
    if isinstance(s, (ast.For, ast.AsyncFor)):
        return [s.iter]
    if isinstance(s, (ast.While, ast.If)):
        return [s.test]
    if isinstance(s, (ast.With, ast.AsyncWith)):
        return [i.context_expr for i in s.items]
    if isinstance(s, ast.Match):
        return [s.subject]
    if isinstance(s, (*_TRY, *_SCOPES)):
        return []
    return [s]


def _bind(target, value, env: dict, add: bool = False) -> dict:
    """A new env where ``target`` is bound to ``value`` (evaluated in ``env``); None unbinds."""
    if isinstance(target, (ast.Tuple, ast.List)):
        for t in target.elts:
            env = _bind(t.value if isinstance(t, ast.Starred) else t, value, env, add)
        return env
    k = _dotted(target)
    if k is None:
        return env
    new = dict(env)
    if value is None:
        new.pop(k, None)
    else:
        new[k] = (env.get(k, ()) if add else ()) + ((value, env),)
    return new


def _merge(a: dict, b: dict) -> dict:
    """Either branch may have run: union of bindings."""
    if a is b:
        return a
    out = dict(a)
    for k, v in b.items():
        old = out.get(k, ())
        if v is not old:
            seen = {id(x[0]) for x in old}
            out[k] = old + tuple(x for x in v if id(x[0]) not in seen)
    return out


def _strip_module(v):
    while (isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute)
           and v.func.attr in _MODULE_PASS):
        v = v.func.value
    return v


class _Facts:
    """What the whole file says about names: models, losses, activation layers, optimizers."""

    def __init__(self, tree: ast.Module, model_names: Sequence[str]):
        self.roots = set(_ROOTS)
        self.models = set(model_names) | {f"self.{n}" for n in model_names}
        self.losses: dict[str, str] = {}
        self.acts: dict[str, tuple] = {}
        self.model_act: dict[str, tuple] = {}
        self.defs: list[tuple] = []
        self.optims: set[str] = set()
        self.linked: set[int] = set()
        self.uses: set[str] = set()
        self.nodes = sorted(ast.walk(tree), key=_pos)
        self.classes: dict[str, ast.ClassDef] = {}
        for n in self.nodes:
            if isinstance(n, ast.Import):
                self.roots.update((a.asname or a.name).split(".")[0] for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                self.roots.update(a.asname or a.name for a in n.names if a.name[:1].islower())
            elif isinstance(n, ast.ClassDef) and any(
                    (_dotted(b) or "").endswith("Module") or _dotted(b) in self.classes
                    for b in n.bases):
                self.classes[n.name] = n
            elif isinstance(n, (ast.Name, ast.Attribute)):
                self.uses.add(n.id if isinstance(n, ast.Name) else n.attr)
            elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                  and n.func.attr in _MODULE_SIGNALS and not (n.func.attr == "eval" and n.args)
                  and _dotted(n.func.value)):
                self.models.add(_dotted(n.func.value))
        self.roots -= self.models
        self.assigns = [(_dotted(t), n.value) for n in self.nodes
                        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None
                        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                        if _dotted(t)]
        for k, v in self.assigns:
            self._assign(k, _strip_module(v))

    def _assign(self, k: str, v) -> None:
        if not isinstance(v, ast.Call):
            return
        d, t = _dotted(v.func) or "", _tail(v) or ""
        mods = d.split(".")[:-1]
        if t.endswith("Loss"):
            self.losses[k] = _LOSS_KIND.get(t, "other")
        elif t in _ACT_CTOR:
            self.acts[k] = (_ACT_CTOR[t], v, f"the nn.{t} layer `{k}`")
        elif "optim" in mods or t in _OPTIMS:
            self.optims.add(k)
        elif (t in ("Sequential", "ModuleList", "ModuleDict", "create_model") or t in self.classes
              or (mods[:1] == ["nn"] or mods[:2] == ["torch", "nn"]) and t[:1].isupper()
              or "models" in mods or (t == "from_pretrained" and "Model" in d)):
            self.models.add(k)
            last = self._seq_last(v) if t == "Sequential" else None
            if isinstance(last, ast.Call) and _tail(last) in _ACT_CTOR:
                entry = (_ACT_CTOR[_tail(last)], last,
                         f"nn.{_tail(last)} as the last layer of `{k}`")
                self.model_act[k] = entry
                if not k.startswith("self."):
                    self.defs.append(entry)

    def _seq_last(self, call: ast.Call):
        """The last layer of an ``nn.Sequential(...)``, following ``*layers`` lists."""
        last = call.args[-1] if call.args else None
        if not (isinstance(last, ast.Starred) and isinstance(last.value, ast.Name)):
            return last
        name, elems = last.value.id, []
        for n in self.nodes:
            if getattr(n, "lineno", 0) >= call.lineno:
                break
            if (isinstance(n, ast.Assign) and isinstance(n.value, (ast.List, ast.Tuple))
                    and any(_dotted(t) == name for t in n.targets)):
                elems = list(n.value.elts)
            elif (isinstance(n, ast.AugAssign) and _dotted(n.target) == name
                  and isinstance(n.value, (ast.List, ast.Tuple))):
                elems += n.value.elts
            elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.args
                  and _dotted(n.func.value) == name and n.func.attr in ("append", "extend")):
                a = n.args[0]
                elems += a.elts if isinstance(a, (ast.List, ast.Tuple)) else [a]
        return elems[-1] if elems else None

    def is_mod(self, d: str | None) -> bool:
        return d is not None and d.split(".")[0] in self.roots

    def model_key(self, call: ast.Call) -> str | None:
        f = call.func
        if _dotted(f) in self.models:
            return _dotted(f)
        if isinstance(f, ast.Attribute) and f.attr == "forward" and _dotted(f.value) in self.models:
            return _dotted(f.value)
        return None

    def loss_kind(self, call: ast.Call) -> str | None:
        """``ce``, ``bcel``, ``nll``, ``bce``, ``other``, ``unknown``; None for a non-loss call."""
        f, t = call.func, _tail(call) or ""
        if isinstance(f, ast.Call):
            ft = _tail(f) or ""
            return _LOSS_KIND.get(ft, "other") if ft.endswith("Loss") else None
        d = _dotted(f)
        if d in self.losses:
            return self.losses[d]
        if t in _LOSS_KIND and t[:1].islower():
            return _LOSS_KIND[t]
        if t.endswith("_loss") or t == "kl_div":
            return "other" if self.is_mod(d) else "unknown"
        return "unknown" if t in _CRITERIA else None

    def is_optimizer(self, recv) -> bool:
        text = ast.unparse(recv).lower()
        return _dotted(recv) in self.optims or (
            ("opt" in text or "scaler" in text) and "sched" not in text)
