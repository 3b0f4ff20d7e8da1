"""The layout of ``model_debugger.capture``: what it may import, no circles, one undo owner.

- every module of ``model_debugger`` is parsed with :mod:`ast` (imports at the top of a module
  and inside functions alike); a module under ``capture/`` imports nothing of ``model_debugger``
  but capture's own modules and the leaf utilities (``records``, ``_validate``, ``safe_write``,
  ``redact``);
- the import graph among capture's modules has no cycle, at module level and with the imports
  made inside functions (a lazy import is still a circle);
- :meth:`Instrument.close` removes every handle it holds, in reverse order, even when one undo
  raises (real torch hooks, real optimizer hooks, real patches).
"""

from __future__ import annotations

import ast
import os

import pytest

import model_debugger

PACKAGE = "model_debugger"
ROOT = os.path.dirname(os.path.abspath(model_debugger.__file__))
ALLOWED = {"records", "_validate", "safe_write", "redact"}  # leaf utilities capture may use


def _modules() -> dict[str, str]:
    """Dotted name -> file of every module of the package."""
    out = {}
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_")) and d != "node_modules"]
        for name in files:
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out[".".join([PACKAGE, *rel])] = os.path.join(folder, name)
    return out


MODULES = _modules()


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _target(name: str) -> str | None:
    """The package module ``name`` lives in (``a.b.c`` may be a name in module ``a.b``)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(module: str, top_level_only: bool = False) -> set[str]:
    """The package modules ``module`` imports (``from . import x`` counts module ``x``)."""
    path = MODULES[module]
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    is_package = os.path.basename(path) == "__init__.py"
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node)
            # ``from .x import y`` imports x (and y when y is a module); ``from . import x``
            # (and ``from .. import redact``) names modules, not the package's own ``__init__``
            names = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
            if node.module is not None or not names:
                names.append(base)
        else:
            continue
        for name in names:
            target = _target(name)
            if target is not None and target != module:
                found.add(target)
    return found


CAPTURE = sorted(m for m in MODULES if m == f"{PACKAGE}.capture" or
                 m.startswith(f"{PACKAGE}.capture."))


def _allowed(name: str) -> bool:
    return name == f"{PACKAGE}.capture" or name.startswith(f"{PACKAGE}.capture.") or \
        name in {f"{PACKAGE}.{leaf}" for leaf in ALLOWED}


def test_the_parser_sees_lazy_and_relative_imports():
    """The graph is right about what it checks: a function-level import of a sibling counts."""
    assert f"{PACKAGE}.capture.recorder" in MODULES
    assert f"{PACKAGE}.capture.torch_instrument" in imports(f"{PACKAGE}.capture.recorder")
    assert f"{PACKAGE}.capture.torch_instrument" not in imports(
        f"{PACKAGE}.capture.recorder", top_level_only=True)
    assert f"{PACKAGE}.capture" in imports(PACKAGE, top_level_only=True)


def test_capture_imports_nothing_above_the_leaf_utilities():
    wrong = {m: sorted(n for n in imports(m) if not _allowed(n)) for m in CAPTURE}
    wrong = {m: names for m, names in wrong.items() if names}
    assert not wrong, f"capture modules import outside capture and {sorted(ALLOWED)}: {wrong}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first search (one per back edge)."""
    found, state, path = [], {}, []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


@pytest.mark.parametrize("top_level_only", [True, False], ids=["top_level", "with_lazy"])
def test_capture_has_no_import_cycle(top_level_only):
    graph = {m: {n for n in imports(m, top_level_only) if n in CAPTURE} for m in CAPTURE}
    # the package __init__ re-exports the recorder: importing a submodule runs it first anyway
    package = f"{PACKAGE}.capture"
    graph = {m: deps - {package} for m, deps in graph.items() if m != package}
    assert not _cycles(graph)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


# -- Instrument.close ---------------------------------------------------------------------------
torch = pytest.importorskip("torch")


def _hook_counts(model) -> dict:
    out = {}
    for name, m in model.named_modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                     "_backward_pre_hooks"):
            out[(name, attr)] = len(getattr(m, attr))
    return out


def _optimizer_hooks(opt) -> tuple:
    from torch.optim import optimizer as optim_mod

    return (len(optim_mod._global_optimizer_pre_hooks),
            len(optim_mod._global_optimizer_post_hooks),
            len(opt._optimizer_step_pre_hooks), len(opt._optimizer_step_post_hooks))


def test_close_removes_every_handle_in_reverse_even_when_one_undo_raises():
    from torch import nn
    from torch.optim import optimizer as optim_mod

    from model_debugger.capture import patches
    from model_debugger.capture.instrument import Instrument
    from model_debugger.capture.recorder import Recorder

    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hooks, opt_hooks, patched = _hook_counts(model), _optimizer_hooks(opt), patches.patched()

    class Owner:
        value = "original"

    inst = Instrument(Recorder(None))
    order: list[str] = []

    def note(name):
        return lambda: order.append(name)

    inst.hold(note("first"))
    inst.hold(model[0].register_forward_hook(lambda *a: None))
    inst.hold(model[0].register_forward_pre_hook(lambda *a: None))
    inst.hold(model[2].register_full_backward_hook(lambda *a: None))
    inst.hold(model[2].register_full_backward_pre_hook(lambda *a: None))
    inst.hold(optim_mod.register_optimizer_step_pre_hook(lambda *a: None))
    inst.hold(optim_mod.register_optimizer_step_post_hook(lambda *a: None))
    inst.hold(opt.register_step_pre_hook(lambda *a: None))
    inst.hold(opt.register_step_post_hook(lambda *a: None))
    inst.patch(Owner, "value", lambda nxt: "patched")

    def broken():
        order.append("broken")
        raise RuntimeError("an undo that fails")

    inst.hold(broken)
    inst.hold(note("last"))
    assert Owner.value == "patched" and _hook_counts(model) != hooks
    assert _optimizer_hooks(opt) == tuple(n + 1 for n in opt_hooks)

    model(torch.randn(2, 3)).sum().backward()
    opt.step()  # the hooks are real: they run
    inst.close()

    assert order == ["last", "broken", "first"]  # reverse order, on past the failure
    assert _hook_counts(model) == hooks
    assert _optimizer_hooks(opt) == opt_hooks
    assert Owner.__dict__["value"] == "original"
    assert patches.patched() == patched
    assert [type(e) for e in inst.undo_errors] == [RuntimeError]
    assert inst._link() is None  # wrappers kept elsewhere only call through from now on
    inst.close()  # idempotent
    assert order == ["last", "broken", "first"]


def test_close_finishes_the_undos_then_raises_an_interrupt():
    from model_debugger.capture.instrument import Instrument
    from model_debugger.capture.recorder import Recorder

    inst = Instrument(Recorder(None))
    order: list[str] = []

    def interrupted():
        raise KeyboardInterrupt

    inst.hold(lambda: order.append("first"))
    inst.hold(interrupted)
    inst.hold(lambda: order.append("last"))
    with pytest.raises(KeyboardInterrupt):
        inst.close()
    assert order == ["last", "first"]


def test_a_torch_capture_leaves_no_hook_behind_even_when_an_undo_raises():
    """A real capture: model pre-hook, global optimizer hooks and patches all go at the end."""
    from torch import nn
    from torch.optim import optimizer as optim_mod

    import model_debugger
    from model_debugger.capture import patches
    from model_debugger.capture.torch_instrument import TorchInstrument

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    hooks, opt_hooks = _hook_counts(model), _optimizer_hooks(opt)
    backward, patched = torch.Tensor.backward, patches.patched()

    def broken():
        raise RuntimeError("an undo that fails")

    with model_debugger.capture(update_every=0, hist_every=0, parse_stdout=False) as rec:
        for _ in range(3):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        assert _hook_counts(model) != hooks  # the instrument keeps the model's inputs
        assert len(optim_mod._global_optimizer_pre_hooks) > opt_hooks[0]
        (inst,) = [i for i in rec._instruments if isinstance(i, TorchInstrument)]
        inst.hold(broken)  # the last registered: undone first, the others after it
    assert [e["t"] for e in rec.events].count("step") == 3
    assert _hook_counts(model) == hooks
    assert _optimizer_hooks(opt) == opt_hooks
    assert torch.Tensor.backward is backward and patches.patched() == patched
    assert [str(e) for e in inst.undo_errors] == ["an undo that fails"]
