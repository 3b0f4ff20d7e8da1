"""Data flow of the PyTorch lint (:mod:`.torch_lint`): one order-aware pass per scope.

``_Scope`` walks a scope body in order, tracking what each name was last bound to, and reports the
flow-based rules (``detached_output``, ``graph_retention``, ``eval_without_no_grad``,
``loss_output_mismatch``); ``_class_outputs`` uses it to find ``forward`` methods that return
activations. Pure syntax; torch is never imported.
"""

from __future__ import annotations

import ast

from ._torch_ast import (
    _ACT_CTOR,
    _ACT_FN,
    _BUILTINS,
    _CUT,
    _CUT_FUNCS,
    _DETACH,
    _LOOPS,
    _MISMATCH,
    _NOGRAD_ATTRS,
    _NUMERIC,
    _PASS,
    _TRY,
    _args,
    _bind,
    _bw_exprs,
    _const_false,
    _dotted,
    _Facts,
    _grad_mode,
    _input,
    _kids,
    _line,
    _merge,
    _mode_arg,
    _nodes,
    _own,
    _pos,
    _scan,
    _strip_module,
    _tail,
)


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


def _class_outputs(facts: _Facts) -> None:
    """Record classes whose ``forward`` always returns softmax/log_softmax/sigmoid output."""
    for name, cls in facts.classes.items():
        fwd = next((b for b in cls.body if isinstance(b, ast.FunctionDef)
                    and b.name == "forward"), None)
        if fwd is None:
            continue
        sc = _Scope(facts, fwd.body, False, "returns")
        sc.run()
        found = [sc.activation(v, env) for v, env in sc.returns]
        if not found or not all(found):
            continue
        kind, node, how = found[0]
        entry = (kind, node, f"{how} returned by `{name}.forward()`")
        facts.defs.append(entry)
        for k, v in facts.assigns:
            v = _strip_module(v)
            if isinstance(v, ast.Call) and _tail(v) == name:
                facts.model_act[k] = entry


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
