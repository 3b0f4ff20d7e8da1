"""Static lint of PyTorch training code: known loop and loss/output pitfalls, found with ``ast``.

Pure syntax analysis; torch is never imported. Each hit names a probe id and a root-cause kind
(DESIGN.md) and the exact line to look at. Names are followed by a small, order-aware data flow
inside each scope (the module body, each function body): enough for the scripts and notebook cells
people write, not a type checker. Rules: ``missing_zero_grad``, ``graph_retention``,
``eval_without_no_grad``, ``eval_mode_not_reset``, ``detached_output``,
``optimizer_recreated`` (all ``training_loop``)
and ``loss_output_mismatch`` (``architecture``). The vocabulary, AST helpers and file-wide facts
live in :mod:`._torch_ast`, the per-scope data flow in :mod:`._torch_flow`; the loop-body rules
and the public API (``LintHit``, ``lint_source``, ``lint_file``) are here.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass

from ._torch_ast import (
    _LOOPS,
    _OPTIMS,
    _TRY,
    _const_false,
    _dotted,
    _Facts,
    _grad_mode,
    _is_backward,
    _line,
    _mode_arg,
    _nodes,
    _pos,
    _tail,
)
from ._torch_flow import _class_outputs, _mismatch_message, _Scope

# every rule this pack reports (``LintHit.rule``); a probe of the same id measures it, or the
# ``lint`` probe's rule table carries its suggestion
RULES = ("missing_zero_grad", "graph_retention", "eval_without_no_grad", "eval_mode_not_reset",
         "detached_output", "optimizer_recreated", "loss_output_mismatch")


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
    loop : tuple of int or None
        First and last line of the outermost loop around ``line`` that calls backward() (a
        training loop), or None. A capture that recorded backward() calls elsewhere in the file
        but none in this span shows that this loop did not run.
    """

    rule: str
    root_cause: str
    file: str
    line: int
    message: str
    loop: tuple[int, int] | None = None


def _builds_optimizer(call: ast.Call) -> bool:
    """``torch.optim.Adam(model.parameters())``, ``optim.SGD(params)``: a new optimizer.

    Not over a list written in place (``SGD([delta])``: an adversarial perturbation's own
    optimizer, new for every batch on purpose).
    """
    t, mods = _tail(call) or "", (_dotted(call.func) or "").split(".")[:-1]
    if not (t in _OPTIMS or (mods[-1:] == ["optim"] and t[:1].isupper())):
        return False
    params = call.args[0] if call.args else next(
        (k.value for k in call.keywords if k.arg == "params"), None)
    return not isinstance(params, (ast.List, ast.Tuple, ast.Set))


def _outside(loop, inner: list, kinds: tuple) -> list:
    """The nodes of ``inner`` (all of ``loop``) not under a node of ``kinds`` nested in it."""
    skip = {id(n) for m in inner if m is not loop and isinstance(m, kinds) for n in _nodes(m)}
    return [n for n in inner if id(n) not in skip]


# why an optimizer built on every step hurts (the lint rule and the probe's finding)
RESTART = ("every one starts with empty state (Adam's moment estimates, SGD's momentum "
           "buffer), so every update is a first step: Adam moves each weight by about the "
           "learning rate in the sign of its gradient, and momentum never builds up. Build the "
           "optimizer once, before the loop.")


def _loop_rules(tree: ast.Module, facts: _Facts) -> list[tuple]:
    """``missing_zero_grad``, ``eval_mode_not_reset``, ``optimizer_recreated``: loop bodies."""
    out = []
    for loop in ast.walk(tree):
        if not isinstance(loop, _LOOPS):
            continue
        inner = _nodes(loop)
        # built on every pass (not in a nested loop, nor under an if/try: switching optimizer
        # at step 1000 is deliberate) of the loop that calls backward() itself
        built = [n for n in _outside(loop, inner, (*_LOOPS, ast.If, *_TRY))
                 if isinstance(n, ast.Call) and _builds_optimizer(n)]
        if built and any(_is_backward(n) for n in _outside(loop, inner, _LOOPS)):
            out.append(("optimizer_recreated", "training_loop", _line(built[0]),
                        f"`{ast.unparse(built[0].func)}(...)` builds a new optimizer on every "
                        f"pass of the loop that calls backward(): {RESTART}"))
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
            # ``optimizer.zero_grad`` without the call: the line meant to reset, doing nothing
            uncalled = [n for n in inner if isinstance(n, ast.Expr) and
                        isinstance(n.value, ast.Attribute) and n.value.attr == "zero_grad"]
            out.append(("missing_zero_grad", "training_loop",
                        _line(uncalled[0]) if uncalled else _line(backs[0]), (
                            f"`{ast.unparse(uncalled[0].value)}` is referenced but never called "
                            "(no parentheses): " if uncalled else "") + (
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
    spans = _training_loops(tree)
    seen: dict[tuple, LintHit] = {}
    for rule, root, line, message in sorted(raw, key=lambda h: (h[2], h[0])):
        loop = max((sp for sp in spans if sp[0] <= line <= sp[1]),
                   key=lambda sp: sp[1] - sp[0], default=None)
        seen.setdefault((rule, line), LintHit(rule, root, filename, line, message, loop))
    return list(seen.values())


def _training_loops(tree: ast.Module) -> list[tuple[int, int]]:
    """Line spans of the loops whose own body (not a nested function) calls backward()."""
    return [(loop.lineno, loop.end_lineno) for loop in ast.walk(tree)
            if isinstance(loop, _LOOPS) and any(_is_backward(n) for n in _nodes(loop))]


def _analyse(tree: ast.Module, model_names: tuple) -> list[tuple]:
    facts = _Facts(tree, model_names)
    _class_outputs(facts)
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
