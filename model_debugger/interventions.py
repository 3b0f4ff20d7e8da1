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

    ``install(params, framework_module) -> undo`` runs when the framework is imported;
    ``validate(params)`` raises ValueError for parameters it cannot install, before any run.
    """

    id: str
    description: str
    frameworks: tuple[str, ...]
    install: Callable
    validate: Callable[[dict], None] | None = None


def removes(undo: list[Callable]) -> Callable[[], None]:
    """One function that calls every ``undo`` function, last installed first."""
    def remove() -> None:
        for fn in reversed(undo):
            fn()
    return remove


def _both(name: str) -> dict[str, Callable]:
    """The torch and Keras installers of one kind, imported when it is installed."""
    def lazy(module: str) -> Callable:
        def install(params: dict, framework):
            import importlib

            return getattr(importlib.import_module(module, __package__), name)(params, framework)
        return install
    return {"torch": lazy("._interventions_torch"), "keras": lazy("._interventions_keras")}


def _kind(id: str, description: str, installer: str, frameworks=("torch", "keras"),
          validate: Callable[[dict], None] | None = None) -> Kind:
    both = _both(installer)
    return Kind(id, description, frameworks, {fw: both[fw] for fw in frameworks}, validate)


SETTINGS = ("weight_decay", "momentum", "beta1")  # what optimizer_setting may change


def _number(value) -> bool:
    import math

    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


def _factor(params: dict) -> None:
    factor = params.get("factor")
    if not _number(factor) or not factor > 0:
        raise ValueError(f"lr_scale needs a finite factor > 0, not {factor!r}")


def _setting(params: dict) -> None:
    setting, value = params.get("setting"), params.get("value")
    if setting not in SETTINGS:
        raise ValueError(f"optimizer_setting needs a setting among {', '.join(SETTINGS)}, not "
                         f"{setting!r}")
    ok = _number(value) and (value >= 0 if setting == "weight_decay" else 0 <= value < 1)
    if not ok:
        raise ValueError(f"optimizer_setting {setting} needs a finite number "
                         f"{'>= 0' if setting == 'weight_decay' else 'in [0, 1)'}, not "
                         f"{value!r}")


def _from_step(params: dict) -> None:
    step = params.get("from_step", 0)
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"guard_backward needs from_step as an int >= 0, not {step!r}")


def _sites(params: dict) -> None:
    sites = params.get("sites")
    if sites is not None and not (isinstance(sites, list) and all(
            isinstance(s, dict) and isinstance(s.get("file"), str) and
            isinstance(s.get("line"), int) for s in sites)):
        raise ValueError(f"keep_graph needs sites as a list of {{file, line}}, not {sites!r}")


INTERVENTIONS: dict[str, Kind] = {k.id: k for k in (
    _kind("standardize_inputs", "standardise the model's inputs per feature (first-batch stats)",
          "standardize_inputs"),
    _kind("lr_scale", "multiply the learning rate by params['factor']", "scale_lr",
          validate=_factor),
    _kind("default_init", "re-initialise every layer the framework's default way before "
          "training", "default_init"),
    _kind("unfreeze", "let every parameter train (and give the optimizer the missing ones)",
          "unfreeze"),
    _kind("dropout_off", "every dropout drops nothing", "dropout_off"),
    _kind("optimizer_setting", "set params['setting'] (weight_decay, momentum or beta1) to "
          "params['value'] in every optimizer", "optimizer_setting", validate=_setting),
    _kind("clip_off", "gradient clipping does nothing", "clip_off"),
    _kind("shuffle", "the training loader (a torch DataLoader without its own sampler, or Keras "
          "fit) shuffles every epoch", "shuffle"),
    _kind("zero_grad", "clear the gradients after every optimizer step", "zero_grad",
          ("torch",)),
    _kind("train_mode", "a model called with gradients on is put back in train mode "
          "(Keras: called with training=True while a gradient tape records)", "train_mode"),
    _kind("match_target_shape", "a 1-D target given to Keras fit becomes (N, 1) when the "
          "model's one output is (N, 1) (a loss written in train_step then pairs each "
          "prediction with its own target)", "match_target_shape", ("keras",)),
    _kind("guard_backward", "an operation that turns finite gradients into non-finite ones "
          "(a square root at 0, a division by 0) hands back 0 instead, and reports where it "
          "was made (from backward params['from_step'] on)", "guard_backward", ("torch",),
          validate=_from_step),
    _kind("keep_graph", "a .detach() in your model's forward (PyTorch) or a stop_gradient in "
          "your code (Keras) keeps the graph (only at params['sites'], a list of {file, line}, "
          "when given)", "keep_graph", validate=_sites),
)}


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

    from .capture.keras_util import fit_owner

    return install(fit_owner(keras), "fit", factory)


def check(intervention: Intervention) -> Kind:
    """The kind of an intervention (ValueError naming the known ones when unknown)."""
    kind = INTERVENTIONS.get(intervention.id)
    if kind is None:
        raise ValueError(f"unknown intervention {intervention.id!r} (known: "
                         f"{', '.join(sorted(INTERVENTIONS))})")
    if kind.validate is not None:
        kind.validate(dict(intervention.params))
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
