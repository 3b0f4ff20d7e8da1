"""The PyTorch side of the interventions (:mod:`model_debugger.interventions`).

Each function ``f(params, torch) -> undo`` installs one change into the run (a global module or
optimizer hook, or a patched function) when torch is imported, and returns what removes it. None
edits the user's code or objects beyond what the change itself is: a learning rate scaled, a
dropout that drops nothing, parameters re-initialised or unfrozen.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .interventions import removes as _removes

_DROPOUTS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
             "feature_alpha_dropout")


def _groups_key(optimizer) -> int:
    """One key for an optimizer and its wrappers: the parameter-group list they share.

    Accelerate's ``AcceleratedOptimizer`` and Lightning's optimizer wrapper hand out the inner
    optimizer's ``param_groups``.
    """
    groups = getattr(optimizer, "param_groups", None)
    return id(groups) if groups is not None else id(optimizer)


def scale_lr(params: dict, torch) -> Callable[[], None]:
    """Multiply every parameter group's learning rate by ``factor`` before the first step.

    Once per optimizer, at its first step; ``initial_lr`` and the ``base_lrs`` of the schedulers
    built on it during the run too, so a schedule keeps the scale.
    """
    factor = float(params["factor"])  # > 0: checked before the run
    seen: set[int] = set()

    def pre_hook(optimizer, args, kwargs):
        if id(optimizer) in seen:
            return None
        seen.add(id(optimizer))
        for group in optimizer.param_groups:
            for key in ("lr", "initial_lr"):
                if isinstance(group.get(key), (int, float)):
                    group[key] = group[key] * factor
        for sched in schedulers.pop(_groups_key(optimizer), ()):
            sched.base_lrs = [lr * factor for lr in sched.base_lrs]
        return None

    # a scheduler recomputes the rate from its base_lrs (LambdaLR warmup, HF's linear decay):
    # those are scaled too, or its first step would undo the intervention
    schedulers: dict[int, list] = {}
    from torch.optim import lr_scheduler

    original_init = lr_scheduler.LRScheduler.__init__

    def __init__(sched, optimizer, *args, **kwargs):
        original_init(sched, optimizer, *args, **kwargs)
        if id(optimizer) not in seen and isinstance(getattr(sched, "base_lrs", None), list):
            schedulers.setdefault(_groups_key(optimizer), []).append(sched)

    lr_scheduler.LRScheduler.__init__ = __init__

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    handle = register_optimizer_step_pre_hook(pre_hook)

    def undo() -> None:
        handle.remove()
        lr_scheduler.LRScheduler.__init__ = original_init
        schedulers.clear()

    return undo


def standardize_inputs(params: dict, torch) -> Callable[[], None]:
    """Standardise the tensor the model is called with, per feature.

    The statistics of the first batch are used for every later call, training or validation.
    Only the outermost call of a module with parameters is changed (the model, not its layers
    nor a loss module).
    """
    stats: dict = {}

    def change(module, args):
        if not args or not isinstance(args[0], torch.Tensor):
            return None
        x = args[0]
        if not x.is_floating_point() or x.ndim < 2 or x.shape[0] < 2:
            return None
        if x.shape[1:] not in stats:
            with torch.no_grad():
                mean = x.detach().mean(dim=0, keepdim=True)
                std = x.detach().std(dim=0, keepdim=True)
                std = torch.where(std > 1e-8, std, torch.ones_like(std))
            stats[x.shape[1:]] = (mean, std)
        mean, std = stats[x.shape[1:]]
        return ((x - mean.to(x.device, x.dtype)) / std.to(x.device, x.dtype), *args[1:])

    return _outermost(torch, change)


def _outermost(torch, fn) -> Callable[[], None]:
    """Call ``fn(module, args)`` on every outermost call of a module with parameters.

    The model, not its layers nor a loss module: a global forward pre-hook counts the call
    depth, a forward hook that always runs counts it down. Calls made while a backward runs
    (activation checkpointing recomputes its blocks then) are not the model's. ``fn`` may
    return new arguments.
    """
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    depth = [0]
    in_backward = getattr(torch._C, "_current_graph_task_id", lambda: -1)

    def pre(module, args):
        depth[0] += 1
        if depth[0] != 1 or next(module.parameters(), None) is None or in_backward() != -1:
            return None
        return fn(module, args)

    def post(module, args, output):
        depth[0] = max(0, depth[0] - 1)

    handles = [register_module_forward_pre_hook(pre),
               register_module_forward_hook(post, always_call=True)]
    return _removes([h.remove for h in handles])


def _before_training(torch, fn) -> Callable[[], None]:
    """Call ``fn(model)`` once per model called before the first optimizer step of the run.

    A model first called once training has begun (an EMA copy, a target network, a submodule
    called on its own for samples) is left alone, and so is every module of a model already
    seen.
    """
    import weakref

    from torch.optim.optimizer import register_optimizer_step_post_hook

    seen: weakref.WeakSet = weakref.WeakSet()
    stepped = [False]

    def first(module, args):
        if not stepped[0] and module not in seen:
            seen.update(module.modules())
            fn(module)
        return None

    def post_hook(optimizer, args, kwargs):
        stepped[0] = True

    return _removes([_outermost(torch, first),
                     register_optimizer_step_post_hook(post_hook).remove])


def _owned(optimizer, models) -> list:
    """The models among ``models`` that have at least one parameter in ``optimizer``."""
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    return [m for m in list(models) if any(id(p) in held for p in m.parameters())]


def default_init(params: dict, torch) -> Callable[[], None]:
    """Re-initialise every layer of each model the framework's default way, before training.

    Each module's own ``reset_parameters`` (``_reset_parameters`` for attention), at the
    model's first call if no optimizer has stepped yet. Embeddings keep their weights (a small
    normal init of embeddings is the transformer norm, and ``initialization`` does not judge
    them).
    """
    def reset(model) -> None:
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, torch.nn.Embedding) or \
                        next(m.parameters(recurse=False), None) is None:
                    continue
                fn = getattr(m, "reset_parameters", None) or getattr(m, "_reset_parameters", None)
                if callable(fn):
                    try:
                        fn()
                    except Exception:  # noqa: BLE001 - a custom reset that cannot run
                        pass

    return _before_training(torch, reset)


def unfreeze(params: dict, torch) -> Callable[[], None]:
    """Let every parameter of each model train.

    ``requires_grad`` is turned on before the model's first call (before training), and at an
    optimizer's first step the parameters of the models it trains that it was not given join
    its first group; a parameter another optimizer holds is never added, nor a model's that
    this optimizer does not train at all (the other network of a GAN, a teacher).
    """
    import weakref

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    models: weakref.WeakSet = weakref.WeakSet()
    stepped: weakref.WeakSet = weakref.WeakSet()
    held: weakref.WeakSet = weakref.WeakSet()  # parameters some optimizer already trains

    def thaw(model) -> None:
        models.add(model)
        for p in model.parameters():
            if p.is_floating_point() and not p.requires_grad:
                p.requires_grad_(True)

    def pre_hook(optimizer, args, kwargs):
        if optimizer in stepped:
            return None
        stepped.add(optimizer)
        mine = [p for g in optimizer.param_groups for p in g["params"]]
        held.update(mine)
        have = {id(p) for p in mine}
        missing = {id(p): p for m in _owned(optimizer, models) for p in m.parameters()
                   if p.requires_grad and id(p) not in have and p not in held}
        if missing:
            optimizer.param_groups[0]["params"].extend(missing.values())
            held.update(missing.values())
        return None

    return _removes([_before_training(torch, thaw),
                     register_optimizer_step_pre_hook(pre_hook).remove])


def train_mode(params: dict, torch) -> Callable[[], None]:
    """Put the models an optimizer trains back in train mode after each of its steps.

    The next training forward then runs in train mode even when the loop never calls
    ``model.train()`` after an evaluation; an evaluation that calls ``model.eval()`` itself
    keeps its mode.
    """
    import weakref

    from torch.optim.optimizer import register_optimizer_step_post_hook

    models: weakref.WeakSet = weakref.WeakSet()

    def seen(module, args):
        models.add(module)
        return None

    def post_hook(optimizer, args, kwargs):
        for model in _owned(optimizer, models):
            if not model.training:
                model.train()

    return _removes([_outermost(torch, seen),
                     register_optimizer_step_post_hook(post_hook).remove])


def zero_grad(params: dict, torch) -> Callable[[], None]:
    """Zero every gradient an optimizer stepped with, in place, right after its step."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def post_hook(optimizer, args, kwargs):
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.zero_()

    return register_optimizer_step_post_hook(post_hook).remove


def dropout_off(params: dict, torch) -> Callable[[], None]:
    """Every dropout module and functional dropout drops nothing.

    The functional dropouts (which the modules call) run at rate 0; an attention kernel's own
    ``dropout_p`` is left as it is.
    """
    from torch.nn import functional

    from .capture.patches import install

    def factory(original):
        def no_drop(input, p=0.5, *args, **kwargs):  # noqa: A002 - torch's own argument name
            return original(input, 0.0, *args, **kwargs)
        return no_drop

    return _removes([install(functional, name, factory) for name in _DROPOUTS
                     if hasattr(functional, name)])


def optimizer_setting(params: dict, torch) -> Callable[[], None]:
    """Set one setting of every parameter group to ``params["value"]``.

    ``params["setting"]`` is ``weight_decay``, ``momentum`` or ``beta1``; set at each
    optimizer's first step.
    """
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    setting, value = params["setting"], float(params["value"])
    seen: set[int] = set()

    def pre_hook(optimizer, args, kwargs):
        if id(optimizer.param_groups) in seen:
            return None
        seen.add(id(optimizer.param_groups))
        for group in optimizer.param_groups:
            if setting == "beta1" and isinstance(group.get("betas"), (tuple, list)):
                group["betas"] = (value, *tuple(group["betas"])[1:])
            elif setting in group:
                group[setting] = value
        return None

    return register_optimizer_step_pre_hook(pre_hook).remove


def clip_off(params: dict, torch) -> Callable[[], None]:
    """Gradient clipping does nothing.

    ``clip_grad_norm_`` still returns the norm, but no gradient is scaled; ``clip_grad_value_``
    leaves the gradients as they are.
    """
    from torch.nn import utils
    from torch.nn.utils import clip_grad

    from .capture.patches import install

    def no_scale(original):
        def scale_nothing(parameters, max_norm, total_norm, *args, **kwargs):
            return None
        return scale_nothing

    def no_value(original):
        def clip_nothing(parameters, clip_value, *args, **kwargs):
            return None
        return clip_nothing

    undo = [install(owner, name, no_scale) for owner in (clip_grad, utils)
            for name in ("_clip_grads_with_norm_", "clip_grads_with_norm_")
            if hasattr(owner, name)]
    undo += [install(owner, "clip_grad_value_", no_value) for owner in (clip_grad, utils)]
    return _removes(undo)



def graph_keeping_detach(torch, sites: list | None = None, only=None) -> Callable:
    """A ``Tensor.detach`` that keeps the graph where your code detaches inside a forward.

    Only calls from the user's code (not the framework's), on tensors that need a gradient,
    while gradients are on and a module's forward runs (``in_forward()``, set by the caller),
    and, given ``only`` (a set of ``(file, line)``), only at those lines; their lines go to
    ``sites``. Elsewhere (``loss.detach()`` for a log) it detaches as usual.
    """
    import sys

    from .capture.codeloc import is_user_file

    original = torch.Tensor.detach

    def detach(t, *args, **kwargs):
        caller = sys._getframe(1)
        if detach.in_forward() and t.requires_grad and torch.is_grad_enabled() and \
                is_user_file(caller.f_code.co_filename) and (
                    only is None or (caller.f_code.co_filename, caller.f_lineno) in only):
            if sites is not None:
                site = {"file": caller.f_code.co_filename, "line": caller.f_lineno}
                if site not in sites:
                    sites.append(site)
            return t
        return original(t, *args, **kwargs)

    detach.in_forward = lambda: True
    detach.original = original
    return detach


def keep_graph(params: dict, torch) -> Callable[[], None]:
    """``.detach()`` in your model's forward keeps the graph (gradients reach what it cut off).

    ``params["sites"]`` (``[{"file", "line"}]``, from the finding) limits it to those calls;
    the forward depth is counted per thread (replicas of ``DataParallel`` run on threads).
    """
    import threading

    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    local = threading.local()

    def pre(module, args):
        local.depth = getattr(local, "depth", 0) + 1

    def post(module, args, output):
        local.depth = max(0, getattr(local, "depth", 0) - 1)

    sites = params.get("sites")
    only = {(s["file"], s["line"]) for s in sites} if sites else None
    detach = graph_keeping_detach(torch, only=only)
    detach.in_forward = lambda: getattr(local, "depth", 0) > 0
    handles = [register_module_forward_pre_hook(pre),
               register_module_forward_hook(post, always_call=True)]
    torch.Tensor.detach = detach  # (last: nothing after it can fail and leave it installed)

    def restore() -> None:
        torch.Tensor.detach = detach.original

    return _removes([*[h.remove for h in handles], restore])


def shuffle(params: dict, torch) -> Callable[[], None]:
    """Every ``DataLoader`` over a map-style dataset without its own sampler shuffles.

    ``shuffle`` given as a keyword or positionally (the third argument) is set to True; a
    loader with a sampler, a batch sampler or an iterable dataset is left as it is.
    """
    from torch.utils.data import DataLoader, IterableDataset

    from .capture.patches import install

    def factory(init):
        def patched(self, dataset, *args, **kwargs):
            given = [*args[2:4], kwargs.get("sampler"), kwargs.get("batch_sampler")]
            own_order = any(x is not None for x in given) or isinstance(dataset, IterableDataset)
            if not own_order:
                if len(args) == 2:
                    args = (args[0], True)
                else:
                    kwargs["shuffle"] = True
            return init(self, dataset, *args, **kwargs)
        return patched

    return install(DataLoader, "__init__", factory)


_TRACE_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>[^\n]+)')
_GRAPH_LIMIT = 50000  # nodes hooked per backward (a larger graph keeps the rest unguarded)
_TRACE_BACKWARDS = 8  # backwards traced past from_step at most (anomaly mode costs every op)
# products overflow from large operands, not from a domain's edge (a float16 matmul of a big
# weight): never guarded
_PRODUCTS = ("MmBackward", "AddmmBackward", "BmmBackward", "BaddbmmBackward", "MvBackward",
             "LinearBackward", "ConvolutionBackward", "MulBackward", "MatmulBackward")


def _finite(grads, torch) -> bool:
    """Whether every dense gradient is finite (a sparse one is not looked at)."""
    return all(g is None or g.layout is not torch.strided or bool(g.isfinite().all())
               for g in grads)


def _moderate(grads, torch) -> bool:
    """Whether every gradient is far from overflowing.

    Below the square root of its dtype's largest value: a non-finite value made from these is
    an operation at the edge of its domain, not a product of two huge numbers (an update that
    grew until it overflowed).
    """
    return all(g is None or g.layout is not torch.strided or not g.is_floating_point() or
               g.numel() == 0 or float(g.abs().max()) < torch.finfo(g.dtype).max ** 0.5
               for g in grads)


def _made_at(node) -> dict:
    """The user's frames of the forward call that made ``node`` (anomaly mode's traceback).

    ``{"file", "line", "func", "frames"}``: the innermost user frame, and every user frame from
    the outermost in; empty without a traceback (anomaly mode was off when it was made).
    """
    from .capture.codeloc import is_user_file

    trace = getattr(node, "metadata", {}).get("traceback_") or []
    frames = [{"file": m["file"], "line": int(m["line"]), "func": m["func"].strip()}
              for m in (_TRACE_FRAME.search(s) for s in trace)
              if m and is_user_file(m["file"])]
    return {**frames[-1], "frames": frames[-6:]} if frames else {}


def guard_backward(params: dict, torch) -> Callable[[], None]:
    """An operation that turns finite gradients into non-finite ones hands back 0 instead.

    Before every backward each node of the graph gets a hook: when the gradients reaching it
    are finite and those it hands back are not (a square root at 0, a norm of a zero vector, a
    division by a zero denominator), the non-finite values become 0, what an epsilon or a clamp
    in that operation gives. From backward number ``params["from_step"]`` (where the
    reproduction first showed a non-finite gradient) until a node has acted, autograd's anomaly
    mode (without its NaN check) keeps each operation's forward traceback, so the record gets
    the operation and the user's line that made it: an ``intervened`` event per operation and
    line, the first five.
    """
    import warnings

    from .capture._util import active_recorder
    from .capture.patches import install

    start = int(params.get("from_step", 0))
    state = {"backwards": 0, "tracing": False, "traced": 0, "reported": set(),
             "before": (False, True)}

    def trace(on: bool) -> None:
        if state["tracing"] != on:
            state["tracing"] = on
            if on:  # (the mode the user's code left, put back when tracing ends)
                state["before"] = (torch.is_anomaly_enabled(),
                                   torch.is_anomaly_check_nan_enabled())
            with warnings.catch_warnings():  # ("Anomaly Detection has been enabled ...")
                warnings.simplefilter("ignore")
                torch.autograd.set_detect_anomaly(*(True, False) if on else state["before"])

    def acted(node) -> None:
        site = _made_at(node)
        key = (type(node).__name__, site.get("file"), site.get("line"))
        if key in state["reported"] or len(state["reported"]) >= 5 or \
                not site and any(k[0] == key[0] for k in state["reported"]):
            return
        state["reported"].add(key)
        trace(False)  # found (located or not): the rest of the run at full speed
        rec = active_recorder()
        if rec is not None:
            rec.emit("intervened", id="guard_backward", backward=state["backwards"],
                     op=type(node).__name__, **site)

    def hook(grad_inputs, grad_outputs, node=None):
        try:
            if _finite(grad_outputs, torch) and not _finite(grad_inputs, torch) and \
                    _moderate(grad_outputs, torch):
                acted(node)
                return tuple(g if g is None or g.layout is not torch.strided else
                             torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0)
                             for g in grad_inputs)
        except Exception:  # noqa: BLE001 - the guard must never break the user's backward
            pass
        return None

    def hooked(roots) -> list:
        handles, seen = [], set()
        stack = [getattr(t, "grad_fn", None) for t in roots]
        while stack and len(seen) < _GRAPH_LIMIT:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if type(node).__name__ != "AccumulateGrad" and \
                    not type(node).__name__.startswith(_PRODUCTS):
                handles.append(node.register_hook(lambda gi, go, n=node: hook(gi, go, n)))
            stack.extend(f for f, _ in node.next_functions)
        return handles

    def factory(backward):
        def guarded(tensors, *args, **kwargs):
            roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ())
            handles = hooked(roots)
            try:
                return backward(tensors, *args, **kwargs)
            finally:
                for h in handles:
                    h.remove()
                state["backwards"] += 1
                if state["backwards"] == start and not state["reported"]:
                    trace(True)  # the next forward is the step that showed it
                elif state["tracing"]:
                    state["traced"] += 1
                    if state["traced"] >= _TRACE_BACKWARDS:  # not shown again: stop paying
                        trace(False)
        return guarded

    def forward_pre(module, args):
        # a trainer may switch anomaly mode off around its loop (Lightning's
        # ``detect_anomaly=False``): on again at every forward while tracing
        if state["tracing"] and not torch.is_anomaly_enabled():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.autograd.set_detect_anomaly(True, check_nan=False)

    from torch.nn.modules.module import register_module_forward_pre_hook

    if start <= 0:
        trace(True)
    return _removes([lambda: trace(False), register_module_forward_pre_hook(forward_pre).remove,
                     install(torch.autograd, "backward", factory)])
