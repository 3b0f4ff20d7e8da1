"""Static lint of PyTorch training code: known loop and loss/output pitfalls, found with ``ast``.

Pure syntax analysis; torch is never imported. Each hit names a probe id and a root-cause kind
(DESIGN.md) and the exact line to look at. Names are followed by a small, order-aware data flow
inside each scope (the module body, each function body): enough for the scripts and notebook cells
people write, not a type checker. Rules: ``missing_zero_grad``, ``graph_retention``,
``eval_without_no_grad``, ``eval_mode_not_reset``, ``detached_output`` (all ``training_loop``)
and ``loss_output_mismatch`` (``architecture``).
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LintHit:
    """One pitfall found in the source.

    Attributes
    ----------
    rule : str
        The probe id (``missing_zero_grad``, ``loss_output_mismatch``, ...).
    root_cause : str
        The root-cause kind (``training_loop`` or ``architecture``).
    file, line : str, int
        Where to look (1-based line).
    message : str
        What is wrong and the causal chain, in plain words.
    """

    rule: str
    root_cause: str
    file: str
    line: int
    message: str


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
    """What a backward call differentiates: ``loss`` in ``loss.backward(gradient)``, and in
    ``torch.autograd.backward(loss)`` / ``accelerator.backward(loss)``."""
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

    def class_outputs(self) -> None:
        """Record classes whose ``forward`` always returns softmax/log_softmax/sigmoid output."""
        for name, cls in self.classes.items():
            fwd = next((b for b in cls.body if isinstance(b, ast.FunctionDef)
                        and b.name == "forward"), None)
            if fwd is None:
                continue
            sc = _Scope(self, fwd.body, False, "returns")
            sc.run()
            found = [sc.activation(v, env) for v, env in sc.returns]
            if not found or not all(found):
                continue
            kind, node, how = found[0]
            entry = (kind, node, f"{how} returned by `{name}.forward()`")
            self.defs.append(entry)
            for k, v in self.assigns:
                v = _strip_module(v)
                if isinstance(v, ast.Call) and _tail(v) == name:
                    self.model_act[k] = entry

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


class _Scope:
    """One order-aware pass over a scope body, tracking what each name was last bound to.

    ``mode`` is ``"rules"`` (report hits), ``"infer"`` (find calls whose result feeds a loss) or
    ``"returns"`` (collect return values).
    """

    def __init__(self, facts: _Facts, body: list, no_grad: bool, mode: str, hits=None):
        self.f, self.body, self.ng, self.mode = facts, body, no_grad, mode
        self.hits = hits if hits is not None else []
        backs: list = []
        self.train_loops: set[int] = set()
        for s in body:
            _scan(s, backs, self.train_loops)
        self.targets = {x.id for c in backs for e in _bw_exprs(c, facts.roots)
                        for x in ast.walk(e) if isinstance(x, ast.Name)} - facts.roots
        self.eval_state: dict[str, bool] = {}
        self.eval_calls: list = []
        self.live: set[int] = set()
        self.returns: list = []
        self.budget = 0

    def run(self) -> None:
        self._block(self.body, {}, self.ng, ())
        for c in self.eval_calls:
            if id(c) not in self.live:
                m = self.f.model_key(c)
                self.hit("eval_without_no_grad", c, (
                    f"`{m}(...)` runs after `{m}.eval()` outside torch.no_grad() / "
                    "torch.inference_mode(): autograd still records the graph and keeps every "
                    "intermediate activation alive while the output lives, so evaluation costs "
                    "training-level memory and time (and a kept output holds its graph). Wrap "
                    "evaluation in `with torch.no_grad():`."))

    def hit(self, rule: str, node, message: str, root: str = "training_loop") -> None:
        self.hits.append((rule, root, _line(node), message))

    def _spent(self, d: int) -> bool:
        self.budget -= 1
        return d > 40 or self.budget < 0

    def _block(self, body, env, ng, loops):
        for s in body:
            env = self._stmt(s, env, ng, loops)
        return env

    def _stmt(self, s, env, ng, loops):
        for e in _own(s):
            for n in sorted((n for n in _nodes(e) if isinstance(n, ast.Call)), key=_pos):
                self._call(n, env, ng, loops)
        if self.mode == "rules":
            self._accumulate(s, env, ng, loops)
        if isinstance(s, _LOOPS):
            if not isinstance(s, ast.While):
                env = _bind(s.target, None, env)
            env = _merge(env, self._block(s.body, env, ng, loops + (s,)))
            return self._block(s.orelse, env, ng, loops)
        if isinstance(s, ast.If):
            return _merge(self._block(s.body, env, ng, loops),
                          self._block(s.orelse, env, ng, loops))
        if isinstance(s, (ast.With, ast.AsyncWith)):
            for it in s.items:
                mode = _grad_mode(it.context_expr)
                ng = ng if mode is None else mode
                if it.optional_vars is not None:
                    env = _bind(it.optional_vars, it.context_expr, env)
            return self._block(s.body, env, ng, loops)
        if isinstance(s, _TRY):
            env = self._block(s.body, env, ng, loops)
            for h in s.handlers:
                env = _merge(env, self._block(h.body, env, ng, loops))
            return self._block(s.finalbody, self._block(s.orelse, env, ng, loops), ng, loops)
        if isinstance(s, ast.Match):
            out = env
            for case in s.cases:
                out = _merge(out, self._block(case.body, env, ng, loops))
            return out
        if isinstance(s, ast.Assign):
            for t in s.targets:
                env = _bind(t, s.value, env)
        elif isinstance(s, ast.AnnAssign) and s.value is not None:
            env = _bind(s.target, s.value, env)
        elif isinstance(s, ast.AugAssign):
            env = _bind(s.target, s.value, env, add=True)
        elif isinstance(s, ast.Return) and s.value is not None:
            self.returns.append((s.value, env))
        return env

    def _call(self, n: ast.Call, env, ng, loops) -> None:
        if self.mode == "infer":
            if self.f.loss_kind(n):
                self.budget = 4000
                self._callers(_input(n), env, 0)
            return
        if self.mode != "rules":
            return
        f, t = n.func, _tail(n)
        recv = f.value if isinstance(f, ast.Attribute) else None
        rd = _dotted(recv)
        if rd in self.f.models and t == "eval" and not n.args:
            self.eval_state[rd] = True
        elif rd in self.f.models and t == "train":
            self.eval_state[rd] = _const_false(_mode_arg(n))
        if not ng and self.eval_state.get(self.f.model_key(n) or ""):
            self.eval_calls.append(n)
        if t == "backward":
            live, det = [], []
            for e in _bw_exprs(n, self.f.roots):
                self.budget = 4000
                a, b = self._trace(e, env, 0)
                live, det = live + a, det + b
            self.live.update(map(id, live))
            if det and not live:
                self.hit("detached_output", det[0], (
                    f"`{ast.unparse(det[0])}` cuts the model output from autograd before it "
                    "reaches the loss that backward() is called on: the loss has no path back "
                    "to the weights, so their gradients stay None/zero, the optimizer step "
                    "changes nothing and the loss does not decrease. Remove the "
                    "`.detach()` / `.data`."))
        if t in ("append", "extend", "insert") and recv is not None and n.args:
            self._retain(n, recv, n.args[-1], env, ng, loops)
        kind = self.f.loss_kind(n)
        inp = _input(n) if kind else None
        self.budget = 4000
        act = self.activation(inp, env) if inp is not None else None
        if act:
            if kind != "unknown":
                self.f.linked.add(id(act[1]))
            if (act[0], kind) in _MISMATCH:
                self.hit("loss_output_mismatch", act[1], _mismatch_message(act[0], act[2]),
                         "architecture")

    def _accumulate(self, s, env, ng, loops) -> None:
        """``total += loss`` / ``total = total + loss`` inside a training loop."""
        if isinstance(s, ast.AugAssign) and isinstance(s.op, (ast.Add, ast.Sub)):
            self._retain(s, s.target, s.value, env, ng, loops)
        elif (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.value, ast.BinOp)
              and isinstance(s.value.op, (ast.Add, ast.Sub)) and _dotted(s.targets[0])):
            k, left, right = _dotted(s.targets[0]), s.value.left, s.value.right
            other = right if _dotted(left) == k else left if _dotted(right) == k else None
            if other is not None:
                self._retain(s, s.targets[0], other, env, ng, loops)

    def _retain(self, node, holder, value, env, ng, loops) -> None:
        loop = next((x for x in reversed(loops) if id(x) in self.train_loops), None)
        while isinstance(holder, ast.Subscript):
            holder = holder.value
        key = _dotted(holder)
        if loop is None or ng or key is None or key.split(".")[0] in self.targets:
            return
        for s in loop.body:  # a holder rebuilt every step keeps nothing across steps
            if isinstance(s, (ast.Assign, ast.AnnAssign)) and key in {
                    _dotted(t) for t in (s.targets if isinstance(s, ast.Assign) else [s.target])
            } and key not in {_dotted(x) for x in ast.walk(s.value)}:
                return
            if (isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
                    and _tail(s.value) == "clear" and _dotted(s.value.func.value) == key):
                return
        self.budget = 4000
        if self._carries(value, env, 0):
            self.hit("graph_retention", node, (
                f"`{ast.unparse(node).strip()}` keeps a tensor that carries autograd history "
                f"in `{key}` across training steps: each kept tensor holds its whole graph and "
                "the activations it saved alive, so memory grows every iteration until it runs "
                "out. Keep `.item()` (or `.detach()`) instead, or compute it under "
                "torch.no_grad()."))

    def _bindings(self, e, env):
        k = _dotted(e)
        return env.get(k, ()) if k is not None else ()

    def _carries(self, e, env, d) -> bool:
        """Whether ``e`` holds autograd history (a model output or the backward loss)."""
        if e is None or self._spent(d):
            return False
        if isinstance(e, ast.Call):
            f, t = e.func, _tail(e)
            if self.f.model_key(e):
                return True
            if t in _CUT | _DETACH:
                return False
            if isinstance(f, ast.Attribute) and not self.f.is_mod(_dotted(f.value)):
                return self._carries(f.value, env, d + 1)
            if (isinstance(f, ast.Name) and t in _CUT_FUNCS) or (
                    _dotted(f) or "").split(".")[0] in _NUMERIC:
                return False
            if self.f.is_mod(_dotted(f)) or self.f.loss_kind(e):
                return any(self._carries(a, env, d + 1) for a in _args(e))
            return False
        if isinstance(e, (ast.Name, ast.Attribute)):
            if isinstance(e, ast.Name) and e.id in self.targets:
                return True
            b = self._bindings(e, env)
            if b:
                return any(self._carries(v, ve, d + 1) for v, ve in b)
            return (isinstance(e, ast.Attribute) and e.attr not in _NOGRAD_ATTRS
                    and self._carries(e.value, env, d + 1))
        return any(self._carries(c, env, d + 1) for c in _kids(e))

    def _trace(self, e, env, d) -> tuple[list, list]:
        """(model calls reaching ``e`` with gradient, detach nodes cutting a model output)."""
        if e is None or self._spent(d):
            return [], []
        live, det = [], []
        if isinstance(e, ast.Call):
            f, t = e.func, _tail(e)
            if self.f.model_key(e):
                return [e], []
            if isinstance(f, ast.Attribute) and t in _DETACH:
                a, b = self._trace(f.value, env, d + 1)
                return [], ([e] if a else []) + b
            if t in _CUT or (isinstance(f, ast.Name) and t in _CUT_FUNCS):
                return [], []
            parts = _args(e)
            if isinstance(f, ast.Attribute) and not self.f.is_mod(_dotted(f.value)):
                parts = [f.value, *parts]
        elif isinstance(e, ast.Attribute) and e.attr == "data":
            a, b = self._trace(e.value, env, d + 1)
            return [], ([e] if a else []) + b
        elif isinstance(e, (ast.Name, ast.Attribute)):
            b = self._bindings(e, env)
            if b:
                for v, ve in b:
                    x, y = self._trace(v, ve, d + 1)
                    live, det = live + x, det + y
                return live, det
            ok = isinstance(e, ast.Attribute) and e.attr not in _NOGRAD_ATTRS
            return self._trace(e.value, env, d + 1) if ok else ([], [])
        else:
            parts = _kids(e)
        for p in parts:
            x, y = self._trace(p, env, d + 1)
            live, det = live + x, det + y
        return live, det

    def activation(self, e, env, d: int = 0):
        """``(kind, node, description)`` when ``e`` is a softmax/log_softmax/sigmoid output."""
        if d == 0:
            self.budget = 4000
        if e is None or self._spent(d):
            return None
        while True:
            if (isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute)
                    and e.func.attr in _PASS and not self.f.is_mod(_dotted(e.func.value))):
                e = e.func.value
            elif isinstance(e, ast.Subscript):
                e = e.value
            else:
                break
        if isinstance(e, ast.Call):
            f, t, k = e.func, _tail(e), _dotted(e.func)
            if k in self.f.acts:
                return self.f.acts[k]
            if k in self.f.model_act:
                return self.f.model_act[k]
            if isinstance(f, ast.Call) and _tail(f) in _ACT_CTOR:
                return _ACT_CTOR[_tail(f)], f, f"nn.{_tail(f)}()"
            if t in _ACT_FN:
                return _ACT_FN[t], e, f"`{ast.unparse(f)}(...)`"
            if t == "log":
                inner = e.args[0] if self.f.is_mod(_dotted(f)) and e.args else (
                    f.value if isinstance(f, ast.Attribute) else None)
                a = self.activation(inner, env, d + 1)
                if a and a[0] == "softmax":
                    return "log_softmax", a[1], f"log() of {a[2]}"
            return None
        for v, ve in self._bindings(e, env):
            a = self.activation(v, ve, d + 1)
            if a:
                return a
        return None

    def _callers(self, e, env, d) -> None:
        """Mark as models the callables whose result reaches a loss input."""
        if e is None or self._spent(d):
            return
        if isinstance(e, ast.Call):
            f, k = e.func, _dotted(e.func)
            if (k and (isinstance(f, ast.Name) or k.startswith("self.")) and not self.f.is_mod(k)
                    and k.split(".")[-1] not in _BUILTINS and not self.f.loss_kind(e)
                    and k not in self.f.acts and k not in self.f.optims):
                self.f.models.add(k)
            elif isinstance(f, ast.Attribute) and not self.f.is_mod(_dotted(f.value)):
                self._callers(f.value, env, d + 1)
            elif self.f.is_mod(k):
                for a in _args(e):
                    self._callers(a, env, d + 1)
            return
        if isinstance(e, (ast.Name, ast.Attribute)):
            for v, ve in self._bindings(e, env):
                self._callers(v, ve, d + 1)
            return
        for c in _kids(e):
            self._callers(c, env, d + 1)


def _mismatch_message(kind: str, how: str) -> str:
    if kind == "log_softmax":
        return (f"double log-softmax: {how} already gives log-probabilities and "
                "CrossEntropyLoss applies log_softmax again. log_softmax is idempotent, so this "
                "is numerically harmless, but it is a sign of confusion about what the loss "
                "expects: feed raw logits to CrossEntropyLoss, or keep log_softmax with NLLLoss.")
    if kind == "sigmoid":
        return (f"{how} squashes the output to probabilities, but BCEWithLogitsLoss / "
                "binary_cross_entropy_with_logits applies the sigmoid itself: the loss sees "
                "sigmoid(sigmoid(z)), confined to (0.5, 0.73), so predictions can never reach 0 "
                "or 1 and gradients stay small. Drop the sigmoid (or use BCELoss on "
                "probabilities).")
    return (f"{how} turns logits into probabilities, but CrossEntropyLoss / F.cross_entropy "
            "applies log_softmax itself and expects raw logits: the loss becomes "
            "log_softmax(softmax(z)), which is bounded, so gradients shrink as the softmax "
            "saturates and training stalls or converges slowly. Return logits and apply softmax "
            "only to report probabilities.")


def _loop_rules(tree: ast.Module, facts: _Facts) -> list[tuple]:
    """``missing_zero_grad`` and ``eval_mode_not_reset``: properties of one loop body."""
    out = []
    for loop in ast.walk(tree):
        if not isinstance(loop, _LOOPS):
            continue
        inner = _nodes(loop)
        calls = sorted((n for n in inner if isinstance(n, ast.Call)), key=_pos)
        backs = [c for c in calls if _is_backward(c)]
        if not backs:
            continue
        steps = [c for c in calls if _tail(c) == "step" and isinstance(c.func, ast.Attribute)
                 and facts.is_optimizer(c.func.value)]
        zeroed = any(_tail(c) == "zero_grad" for c in calls) or any(
            (isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "grad"
                                               for t in n.targets))
            or (isinstance(n, ast.Call) and _tail(n) in ("zero_", "fill_")
                and isinstance(n.func, ast.Attribute)
                and any(isinstance(x, ast.Attribute) and x.attr == "grad"
                        for x in ast.walk(n.func.value)))
            for n in inner)
        if steps and not zeroed:
            opt = ast.unparse(steps[0].func.value)
            out.append(("missing_zero_grad", "training_loop", _line(backs[0]), (
                f"this loop calls backward() and `{opt}.step()` but never zero_grad(): "
                "backward() adds into .grad, so every step applies the sum of all gradients "
                "since the start; the effective step keeps growing, and the loss oscillates or "
                "diverges. Call `optimizer.zero_grad()` once per step (or set .grad = None).")))
        modes = [(ast.unparse(c.func.value), c) for c in calls
                 if isinstance(c.func, ast.Attribute) and not facts.is_mod(_dotted(c.func.value))
                 and ((c.func.attr == "eval" and not c.args)
                      or (c.func.attr == "train" and _dotted(c.func.value) in facts.models))]
        for recv, c in modes:
            is_eval = c.func.attr == "eval" or _const_false(_mode_arg(c))
            if is_eval and not any(r == recv and m.func.attr == "train"
                                   and not _const_false(_mode_arg(m)) for r, m in modes):
                out.append(("eval_mode_not_reset", "training_loop", _line(c), (
                    f"`{recv}.eval()` is called inside the training loop but `{recv}.train()` "
                    "never is: after the first pass the model trains in eval mode, so dropout "
                    "is off and batch norm uses its running statistics instead of batch "
                    "statistics; regularisation silently disappears and the loss behaves "
                    f"differently from the first epoch. Call `{recv}.train()` at the start of "
                    "every epoch.")))
    return out


def lint_source(source: str, filename: str, model_names: Sequence[str] = ()) -> list[LintHit]:
    """Lint PyTorch training code.

    Parameters
    ----------
    source : str
        Python source (a script or the cells of a notebook joined together).
    filename : str
        Reported as ``LintHit.file``.
    model_names : sequence of str
        Names known to hold the model (from the capture). When empty, candidates are inferred
        from calls whose result reaches a loss; names assigned from nn.Module constructors and
        receivers of ``.eval()`` / ``.parameters()`` are models either way.

    Returns
    -------
    list of LintHit
        Sorted by line, one per (rule, line); empty when the source does not parse.
    """
    if not any(w in source for w in ("backward", ".eval(", "oftmax", "igmoid")):
        return []  # no rule can fire
    try:
        tree = ast.parse(source, filename=filename)
    except (SyntaxError, ValueError):
        return []
    try:
        raw = _analyse(tree, tuple(model_names))
    except RecursionError:  # pathologically nested expressions: no verdict rather than a crash
        return []
    seen: dict[tuple, LintHit] = {}
    for rule, root, line, message in sorted(raw, key=lambda h: (h[2], h[0])):
        seen.setdefault((rule, line), LintHit(rule, root, filename, line, message))
    return list(seen.values())


def _analyse(tree: ast.Module, model_names: tuple) -> list[tuple]:
    facts = _Facts(tree, model_names)
    facts.class_outputs()
    scopes = [(tree.body, False)] + [
        (fn.body, any(_grad_mode(dec) for dec in fn.decorator_list))
        for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not model_names:
        for body, ng in scopes:
            _Scope(facts, body, ng, "infer").run()
    raw: list[tuple] = []
    for body, ng in scopes:
        _Scope(facts, body, ng, "rules", raw).run()
    losses = {"ce": {"CrossEntropyLoss", "cross_entropy"} & facts.uses,
              "bcel": {"BCEWithLogitsLoss", "binary_cross_entropy_with_logits"} & facts.uses}
    for kind, node, how in facts.defs:
        if id(node) not in facts.linked and losses["bcel" if kind == "sigmoid" else "ce"]:
            raw.append(("loss_output_mismatch", "architecture", _line(node),
                        _mismatch_message(kind, how)))
    return raw + _loop_rules(tree, facts)


def lint_file(path: str, model_names: Sequence[str] = ()) -> list[LintHit]:
    """Read ``path`` and lint it (see :func:`lint_source`); a file that does not parse gives []."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        return lint_source(fh.read(), str(path), model_names)
