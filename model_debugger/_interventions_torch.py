"""The PyTorch side of the interventions (:mod:`model_debugger.interventions`).

Each function ``f(params, torch) -> undo`` installs one change into the run (a global module or
optimizer hook, or a patched function) when torch is imported, and returns what removes it. None
edits the user's code or objects beyond what the change itself is: a learning rate scaled, a
dropout that drops nothing, parameters re-initialised or unfrozen.
"""

from __future__ import annotations

from collections.abc import Callable

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
    depth, a forward hook that always runs counts it down. ``fn`` may return new arguments.
    """
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    depth = [0]

    def pre(module, args):
        depth[0] += 1
        if depth[0] != 1 or next(module.parameters(), None) is None:
            return None
        return fn(module, args)

    def post(module, args, output):
        depth[0] = max(0, depth[0] - 1)

    handles = [register_module_forward_pre_hook(pre),
               register_module_forward_hook(post, always_call=True)]

    def undo() -> None:
        for h in handles:
            h.remove()

    return undo


def _once_per_model(torch, fn) -> Callable[[], None]:
    """Call ``fn(model)`` once per model, at its first outermost call (before training)."""
    import weakref

    seen: weakref.WeakSet = weakref.WeakSet()

    def first(module, args):
        if module not in seen:
            seen.add(module)
            fn(module)
        return None

    return _outermost(torch, first)


def default_init(params: dict, torch) -> Callable[[], None]:
    """Re-initialise every layer of each model by its ``reset_parameters``.

    Before the model's first call: the framework's default initialisation instead of the user's.
    """
    def reset(model) -> None:
        with torch.no_grad():
            for m in model.modules():
                if callable(getattr(m, "reset_parameters", None)) and \
                        next(m.parameters(recurse=False), None) is not None:
                    try:
                        m.reset_parameters()
                    except Exception:  # noqa: BLE001 - a custom reset that cannot run
                        pass

    return _once_per_model(torch, reset)


def unfreeze(params: dict, torch) -> Callable[[], None]:
    """Let every parameter of each model train.

    ``requires_grad`` is turned on before the model's first call, and the parameters an optimizer
    was not given are added to it (one new group) at its first step.
    """
    import weakref

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    models: weakref.WeakSet = weakref.WeakSet()
    stepped: set[int] = set()

    def thaw(model) -> None:
        models.add(model)
        for p in model.parameters():
            if p.is_floating_point() and not p.requires_grad:
                p.requires_grad_(True)

    def pre_hook(optimizer, args, kwargs):
        if id(optimizer.param_groups) in stepped:
            return None
        stepped.add(id(optimizer.param_groups))
        have = {id(p) for g in optimizer.param_groups for p in g["params"]}
        missing = [p for m in list(models) for p in m.parameters()
                   if p.requires_grad and id(p) not in have]
        if missing:
            optimizer.add_param_group({"params": list({id(p): p for p in missing}.values())})
        return None

    undo_thaw = _once_per_model(torch, thaw)
    handle = register_optimizer_step_pre_hook(pre_hook)

    def undo() -> None:
        undo_thaw()
        handle.remove()

    return undo


def train_mode(params: dict, torch) -> Callable[[], None]:
    """Put a model back in train mode whenever it is called with gradients on.

    That is a training forward; calls under ``no_grad`` (evaluation) keep the mode they were
    given.
    """
    def check(module, args):
        if torch.is_grad_enabled() and not module.training:
            module.train()
        return None

    return _outermost(torch, check)


def zero_grad(params: dict, torch) -> Callable[[], None]:
    """Clear every gradient an optimizer stepped with, right after its step."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def post_hook(optimizer, args, kwargs):
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None

    return register_optimizer_step_post_hook(post_hook).remove


def dropout_off(params: dict, torch) -> Callable[[], None]:
    """Every dropout drops nothing.

    The functional dropouts (which the modules call) run at rate 0.
    """
    from torch.nn import functional

    from .capture.patches import install

    def factory(original):
        def no_drop(input, p=0.5, *args, **kwargs):  # noqa: A002 - torch's own argument name
            return original(input, 0.0, *args, **kwargs)
        return no_drop

    undo = [install(functional, name, factory) for name in _DROPOUTS
            if hasattr(functional, name)]

    def remove() -> None:
        for fn in reversed(undo):
            fn()

    return remove


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

    undo = [install(clip_grad, "_clip_grads_with_norm_", no_scale)] \
        if hasattr(clip_grad, "_clip_grads_with_norm_") else []
    undo += [install(owner, "clip_grad_value_", no_value) for owner in (clip_grad, utils)]

    def remove() -> None:
        for fn in reversed(undo):
            fn()

    return remove

