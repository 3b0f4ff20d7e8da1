"""Interventions: one change installed in a re-run of the artifact, never written to its code.

Isolate confirms a hypothesis by re-running the artifact with one intervention that undoes the
suspected cause (DESIGN.md, "Confirmation by intervention"); Verify-style comparison against an
unmodified re-run then says whether the defining signal moved beyond the seed noise. Each entry
of :data:`INTERVENTIONS` installs itself when the framework it patches is imported (at once in a
kernel, on import in a fresh child) and is removed when the run ends. A step budget stops a run
after ``max_steps`` optimizer steps (a :class:`~model_debugger.artifacts.base.StepBudget`, a
planned stop, like the time limit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from .artifacts.base import Intervention, StepBudget


@dataclass(frozen=True)
class Kind:
    """An intervention kind: what it changes, for which frameworks, and how it is installed.

    ``install(params, framework_module) -> undo`` runs when the framework is imported.
    """

    id: str
    description: str
    frameworks: tuple[str, ...]
    install: Callable


def _groups_key(optimizer) -> int:
    """One key for an optimizer and its wrappers: the parameter-group list they share.

    Accelerate's ``AcceleratedOptimizer`` and Lightning's optimizer wrapper hand out the inner
    optimizer's ``param_groups``.
    """
    groups = getattr(optimizer, "param_groups", None)
    return id(groups) if groups is not None else id(optimizer)


def _scale_lr_torch(params: dict, torch) -> Callable[[], None]:
    """Multiply every parameter group's learning rate by ``factor`` before the first step.

    Once per optimizer, at its first step; ``initial_lr`` and the ``base_lrs`` of the schedulers
    built on it during the run too, so a schedule keeps the scale.
    """
    factor = float(params["factor"])
    if not factor > 0:
        raise ValueError(f"lr_scale needs a factor > 0, not {factor!r}")
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


def _scale_lr_keras(params: dict, keras) -> Callable[[], None]:
    """Multiply a Keras optimizer's learning rate by ``factor``, once per optimizer.

    When ``fit`` starts, and at an optimizer's first ``apply_gradients`` in a custom loop (a
    ``tf.GradientTape`` step, traced or eager: the rate variable is changed eagerly, once).
    """
    from .capture.patches import install

    factor = float(params["factor"])
    if not factor > 0:
        raise ValueError(f"lr_scale needs a factor > 0, not {factor!r}")

    def scale(opt) -> None:
        opt = getattr(opt, "inner_optimizer", opt)  # a LossScaleOptimizer drives its inner one
        if opt is None or getattr(opt, "_model_debugger_scaled", False):
            return
        opt._model_debugger_scaled = True  # first: a second trace (replica) must not scale again
        try:
            lr = getattr(opt, "_learning_rate", None)
            if hasattr(lr, "assign"):  # a variable (a schedule object is left alone)
                import tensorflow as tf

                with tf.init_scope():  # eagerly, even while a tf.function is being traced
                    lr.assign(float(lr.numpy()) * factor)
        except Exception:  # noqa: BLE001 - an intervention must never break the user's step
            pass

    def fit_factory(fit):
        def patched(model, *args, **kwargs):
            scale(getattr(model, "optimizer", None))
            return fit(model, *args, **kwargs)
        return patched

    def apply_factory(apply_gradients):
        def patched(opt, *args, **kwargs):
            scale(opt)
            return apply_gradients(opt, *args, **kwargs)
        return patched

    undo = [install(keras.Model, "fit", fit_factory),
            install(keras.optimizers.Optimizer, "apply_gradients", apply_factory)]

    def remove() -> None:
        for fn in reversed(undo):
            fn()

    return remove


def _standardize_torch(params: dict, torch) -> Callable[[], None]:
    """Standardise the tensor the model is called with, per feature.

    The statistics of the first batch are used for every later call, training or validation.
    Only the outermost call of a module with parameters is changed (the model, not its layers
    nor a loss module): a global forward pre-hook counts the call depth, a forward hook that
    always runs counts it down.
    """
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    depth = [0]
    stats: dict = {}

    def pre(module, args):
        depth[0] += 1
        if depth[0] != 1 or not args or not isinstance(args[0], torch.Tensor) or \
                next(module.parameters(), None) is None:  # a loss module: not the model
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

    def post(module, args, output):
        depth[0] = max(0, depth[0] - 1)

    handles = [register_module_forward_pre_hook(pre),
               register_module_forward_hook(post, always_call=True)]

    def undo() -> None:
        for h in handles:
            h.remove()

    return undo


def _standardize_keras(params: dict, keras) -> Callable[[], None]:
    """Standardise the arrays ``fit`` is given, per feature, by the training inputs' statistics.

    The validation data given to ``fit`` gets the same transform.
    """
    import numpy as np

    from .capture.patches import install

    def scale(x, mean, std):
        return (np.asarray(x, dtype="float32") - mean) / std

    def factory(fit):
        def patched(model, x=None, y=None, *args, **kwargs):
            if isinstance(x, np.ndarray) and x.dtype.kind == "f" and x.ndim >= 2:
                mean, std = x.mean(axis=0), x.std(axis=0)
                std = np.where(std > 1e-8, std, 1.0)
                x = scale(x, mean, std)
                val = kwargs.get("validation_data")
                if isinstance(val, tuple) and len(val) >= 2 and isinstance(val[0], np.ndarray):
                    kwargs["validation_data"] = (scale(val[0], mean, std), *val[1:])
            return fit(model, x, y, *args, **kwargs)
        return patched

    return install(keras.Model, "fit", factory)


INTERVENTIONS: dict[str, Kind] = {
    "standardize_inputs": Kind("standardize_inputs",
                               "standardise the model's inputs per feature (first-batch stats)",
                               ("torch", "keras"),
                               {"torch": _standardize_torch, "keras": _standardize_keras}),
    "lr_scale": Kind("lr_scale", "multiply the learning rate by params['factor']",
                     ("torch", "keras"), {"torch": _scale_lr_torch, "keras": _scale_lr_keras}),
}


def _step_budget_torch(max_steps: int, torch) -> Callable[[], None]:
    count = [0]

    def post_hook(optimizer, args, kwargs):
        count[0] += 1
        if count[0] >= max_steps:
            raise StepBudget(f"stopped after {max_steps} optimizer steps (the step budget)")

    from torch.optim.optimizer import register_optimizer_step_post_hook

    return register_optimizer_step_post_hook(post_hook).remove


def _step_budget_keras(max_steps: int, keras) -> Callable[[], None]:
    from .capture.patches import install

    class _Budget(keras.callbacks.Callback):
        seen = 0

        def on_train_batch_end(self, batch, logs=None):
            _Budget.seen += 1
            if _Budget.seen >= max_steps:
                self.model.stop_training = True

    def factory(fit):
        def patched(model, *args, **kwargs):
            kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), _Budget()]
            return fit(model, *args, **kwargs)
        return patched

    return install(keras.Model, "fit", factory)


def check(intervention: Intervention) -> Kind:
    """The kind of an intervention (ValueError naming the known ones when unknown)."""
    kind = INTERVENTIONS.get(intervention.id)
    if kind is None:
        raise ValueError(f"unknown intervention {intervention.id!r} (known: "
                         f"{', '.join(sorted(INTERVENTIONS))})")
    return kind


@contextlib.contextmanager
def installed(intervention: Intervention | None = None, max_steps: int | None = None):
    """Install ``intervention`` and a step budget for the run inside the block.

    Everything is removed on exit, whatever happened (each piece installs when its framework is
    imported).
    """
    from .capture.imports import when_imported

    pieces: list[tuple[str, Callable]] = []
    if intervention is not None:
        kind = check(intervention)
        for fw in kind.frameworks:
            pieces.append((fw, lambda mod, f=kind.install[fw]: f(intervention.params, mod)))
    if max_steps is not None:
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, not {max_steps!r}")
        budget = {"torch": _step_budget_torch, "keras": _step_budget_keras}
        for fw, fn in budget.items():
            pieces.append((fw, lambda mod, f=fn: f(int(max_steps), mod)))
    undo: list[Callable] = []
    with contextlib.ExitStack() as stack:
        for fw, piece in pieces:
            def on_import(module, piece=piece):
                undo.append(piece(module))
            stack.callback(when_imported(fw, on_import))
        try:
            yield
        finally:
            for fn in reversed(undo):
                fn()


@contextlib.contextmanager
def process_context(seed: int | None, intervention: str | None, max_steps: int | None):
    """What a process a script starts runs in: the run's seed, intervention and step budget.

    The same as the run's own process (``_child``'s ``--seed``, ``--intervention``,
    ``--max-steps``), so that a re-run of a job that spawns its ranks changes one thing on every
    rank (:func:`model_debugger.capture.recorder.set_rank_context`). A module function: the
    ``spawn`` start method pickles it by name.
    """
    if seed is not None:
        from .artifacts.seeding import seed_everything

        seed_everything(seed, lazily=True)
    change = None
    if intervention:
        from .artifacts.base import Intervention

        change = Intervention.from_json(intervention)
    with installed(change, max_steps):
        yield
