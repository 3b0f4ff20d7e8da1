"""Trainer hooks of the PyTorch instrument (mixed into ``TorchInstrument``): Lightning, HF.

Most users do not write the loop: ``Trainer.fit`` (PyTorch Lightning, ``pytorch_lightning`` or
``lightning.pytorch``) or ``transformers.Trainer.train`` drives it. Steps, gradients and losses
are still read by the generic hooks (backward, optimizer steps, clipping); what only the
trainer knows comes from a callback attached to every trainer built during the capture:

- the metrics the user logs through the trainer's own channel: Lightning's ``self.log`` /
  ``log_dict`` (per step for the values logged per step, per epoch for the aggregated ones, as
  Lightning computed them), HF's ``Trainer.log`` (``on_log``: ``loss``, ``grad_norm``,
  ``eval_loss``, ...); their ``source`` is ``"trainer"``;
- Lightning's sanity-check validation pass is not a validation epoch: its losses are dropped;
- gradient accumulation: Lightning, HF and Accelerate's ``backward`` divide each micro-batch's
  loss by the accumulation steps before ``backward()`` (HF leaves it to a model that takes
  ``num_items_in_batch``), so the step's loss is the *sum* of what was back-propagated, not its
  mean (a ``loss_scaled`` event says so): the loss the user computed, on the scale of the
  validation loss and the constant-predictor baseline, and the one the trainer logs;
- where the evidence points: a ``trainer`` event names the ``fit``/``train`` call line and the
  user's lines (the ``LightningModule``'s ``training_step`` and ``configure_optimizers``, the
  ``TrainingArguments(...)`` and ``Trainer(...)`` lines, also ``ref`` events of those kinds);
  a reference seen at the call line reads as the user's line that decides it
  (``records.TRAINER_REFS``).

Nothing here imports Lightning or transformers: the patches are installed when the user's code
imports them (:func:`~.imports.when_imported`).
"""

from __future__ import annotations

import importlib
import inspect
import sys

from .callback_clock import CallbackClock, noting_init
from .codeloc import is_user_file, user_location
from .imports import when_imported

LIGHTNING = ("pytorch_lightning", "lightning.pytorch")
# keys of HF's log dicts that are no training quantity (timings, counters)
_HF_SKIP = ("epoch", "step", "total_flos")
_HF_SKIP_SUFFIX = ("_runtime", "_per_second")
# the callbacks' hooks a trainer runs around every batch (timed: ``callbacks`` event)
# (Lightning's hooks around backward and the optimizer step run inside the step's own timed
# work: not the loop's time)
PL_HOOKS = ("on_train_batch_start", "on_train_batch_end")
HF_HOOKS = ("on_step_begin", "on_step_end", "on_substep_end", "on_pre_optimizer_step",
            "on_optimizer_step", "on_log")
# a Hugging Face Trainer's own periodic work, configured in TrainingArguments (save_steps, ...)
HF_WORK = (("_save_checkpoint", "checkpoint saving"), ("_evaluate", "evaluation"))


def _code_location(fn) -> dict | None:
    """The user's file and first line of a function (a ``training_step`` override)."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None or not is_user_file(code.co_filename):
        return None
    line = code.co_firstlineno
    try:  # the ``def`` line, past decorators
        lines, start = inspect.getsourcelines(fn)
        for k, text in enumerate(lines):
            if text.lstrip().startswith(("def ", "async def ")):
                line = start + k
                break
    except (OSError, TypeError):
        pass
    return {"file": code.co_filename, "line": line}


def _value(v) -> float | None:
    """A logged value as a float (tensors, numpy scalars, numbers, numeric strings)."""
    try:
        item = getattr(v, "item", None)
        out = float(item() if callable(item) and getattr(v, "numel", lambda: 1)() == 1 else v)
    except (TypeError, ValueError, RuntimeError):
        return None
    return out


def _remove_callback(trainer, cb) -> None:
    """Take our callback out of the user's trainer again."""
    try:
        if hasattr(trainer, "remove_callback"):  # transformers
            trainer.remove_callback(cb)
        elif cb in trainer.callbacks:
            trainer.callbacks.remove(cb)
    except Exception:  # noqa: BLE001 - the trainer's own state is never broken by us
        pass


class TrainerHooks:
    """Callbacks in Lightning and Hugging Face trainers; how their accumulation scales the loss."""

    def _init_trainer_state(self) -> None:
        self._sum_losses = False  # a trainer divides each micro-batch's loss for accumulation
        self._pl_logged: dict[str, tuple] = {}  # name -> (phase, on_step, on_epoch), this pass
        self._trainer_refs: dict[str, dict] = {}  # kind -> user location
        self._fit_at = None  # the user's ``trainer.fit(...)`` / ``trainer.train()`` line
        self._clock = CallbackClock()  # the trainer's callbacks, timed during fit/train
        self._callback_bases: list[type] = []  # Lightning's and transformers' Callback classes

    def _attach_trainers(self) -> None:
        """Patch the trainers when (if) the user's code imports them."""
        for pkg in LIGHTNING:
            self.hold(when_imported(f"{pkg}.trainer.trainer", self.guard(self._patch_lightning)))
            self.hold(when_imported(f"{pkg}.core.module", self.guard(self._patch_pl_log)))
        self.hold(when_imported("transformers.trainer", self.guard(self._patch_hf)))
        self.hold(when_imported("transformers.training_args", self.guard(self._patch_hf_args)))
        self.hold(when_imported("accelerate.accelerator", self.guard(self._patch_accelerate)))

    def _trainer_ref(self, kind: str, loc: dict | None) -> None:
        if loc is not None:
            self._trainer_refs.setdefault(kind, loc)
            self.ref(kind, loc)

    # -- Lightning -------------------------------------------------------------------------
    def _patch_pl_log(self, module) -> None:
        link = self._link

        def wrap(original):
            def log(pl_module, name, value, *args, **kwargs):
                inst = link()
                if inst is not None:
                    inst.guard(inst._on_pl_log)(pl_module, name, kwargs)
                return original(pl_module, name, value, *args, **kwargs)

            log.__wrapped__ = original
            return log

        self.patch(module.LightningModule, "log", wrap)

    def _on_pl_log(self, pl_module, name, kwargs) -> None:
        trainer = getattr(pl_module, "_trainer", None)
        if trainer is None or getattr(trainer, "sanity_checking", False):
            return
        fx = str(getattr(pl_module, "_current_fx_name", "") or "")
        train = getattr(trainer, "training", False)
        on_step, on_epoch = kwargs.get("on_step"), kwargs.get("on_epoch")
        per_step = fx in ("training_step", "on_train_batch_start", "on_train_batch_end",
                          "on_before_backward", "on_after_backward", "on_before_optimizer_step",
                          "on_before_zero_grad")
        if on_step is None:
            on_step = per_step  # Lightning's defaults: per step in the training step only
        if on_epoch is None:
            on_epoch = not per_step
        self._pl_logged[str(name)] = ("train" if train else "eval", bool(on_step), bool(on_epoch))

    def _patch_lightning(self, module) -> None:
        pkg = module.__name__.rsplit(".trainer.trainer", 1)[0]
        callback_cls = importlib.import_module(f"{pkg}.callbacks").Callback
        link = self._link

        class ModelDebuggerCallback(callback_cls):  # noqa: D101 - see TrainerHooks
            def on_fit_start(self, trainer, pl_module):
                inst = link()
                if inst is not None:
                    inst.guard(inst._on_pl_fit_start)(trainer, pl_module)

            def on_sanity_check_end(self, trainer, pl_module):
                inst = link()
                if inst is not None:
                    inst.losses.eval_losses = []  # a sanity check is not a validation epoch
                    inst._pl_logged.clear()

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                inst = link()
                if inst is not None:
                    inst.guard(inst._emit_pl)(trainer, "train", step=True)

            def on_train_epoch_end(self, trainer, pl_module):
                inst = link()
                if inst is not None:
                    inst.guard(inst._emit_pl)(trainer, "train", step=False)

            def on_validation_end(self, trainer, pl_module):
                inst = link()
                if inst is not None and not trainer.sanity_checking:
                    inst.guard(inst._emit_pl)(trainer, "eval", step=False)

        self._note_callbacks_made(callback_cls)
        self._patch_trainer(module.Trainer, "fit", ModelDebuggerCallback)

    def _note_callbacks_made(self, base: type) -> None:
        """Note where each callback of ``base``'s kind is constructed (``callbacks`` event)."""
        if not self._callback_bases:
            self.hold(self._clock.untime)  # (a run that never returned: restored at the end)
        self._callback_bases.append(base)
        self.patch(base, "__init__", noting_init(self._link, base))

    def _time_trainer(self, trainer) -> int:
        """Time the trainer's callbacks (and a Hugging Face trainer's periodic work).

        Until the run returns (:meth:`_emit_trainer_callbacks`); returns the optimizer steps so
        far.
        """
        self._clock.untime()
        handler = getattr(trainer, "callback_handler", None)
        callbacks = list(getattr(handler, "callbacks", None) or getattr(trainer, "callbacks", None)
                         or ())
        for base in self._callback_bases:
            self._clock.time([cb for cb in callbacks if isinstance(cb, base)],
                             HF_HOOKS if handler is not None else PL_HOOKS, base)
        if handler is not None:
            where = self._trainer_refs.get("trainer_args")
            for name, label in HF_WORK:
                self._clock.time_method(trainer, name, label, where)
        return self._opt_steps

    def _emit_trainer_callbacks(self, steps_before: int | None) -> None:
        out = self._clock.untime()
        if out and steps_before is not None:
            self.rec.emit("callbacks", steps=self._opt_steps - steps_before, callbacks=out)

    def _patch_trainer(self, cls, run: str, callback_cls) -> None:
        """``cls.__init__`` names the user's ``Trainer(...)`` line; ``cls.<run>`` carries a callback.

        The callback is added for the duration of ``fit``/``train`` only (a trainer built before
        the capture gets it too) and removed again: the user's trainer keeps nothing of ours.
        """
        link = self._link

        def wrap_init(original):
            def __init__(trainer, *args, **kwargs):
                original(trainer, *args, **kwargs)
                inst = link()
                if inst is not None:
                    inst.guard(inst._trainer_ref)("trainer", user_location(sys._getframe()))

            __init__.__wrapped__ = original
            return __init__

        def wrap_run(original):
            def run_with_callback(trainer, *args, **kwargs):
                inst = link()
                steps = inst.guard(inst._time_trainer)(trainer) if inst else None
                cb = inst.guard(inst._add_callback)(trainer, callback_cls) if inst else None
                try:
                    return original(trainer, *args, **kwargs)
                finally:
                    if cb is not None:
                        _remove_callback(trainer, cb)
                    inst = link()
                    if inst is not None:  # (the hooks restored even when timing failed)
                        inst.guard(inst._emit_trainer_callbacks)(steps)

            run_with_callback.__wrapped__ = original
            run_with_callback.__name__ = run
            return run_with_callback

        self.patch(cls, "__init__", wrap_init)
        self.patch(cls, run, wrap_run)

    def _add_callback(self, trainer, callback_cls):
        self._fit_at = user_location(sys._getframe())
        cb = callback_cls()
        if hasattr(trainer, "add_callback"):  # transformers
            trainer.add_callback(cb)
        else:
            trainer.callbacks.append(cb)
        return cb

    def _on_pl_fit_start(self, trainer, pl_module) -> None:
        cls = type(pl_module)
        for kind in ("training_step", "configure_optimizers"):
            self._trainer_ref(kind, _code_location(getattr(cls, kind, None)))
        automatic = getattr(pl_module, "automatic_optimization", True)
        k = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        self._scaled_for_accumulation(k if automatic else 1, "lightning accumulate_grad_batches")
        self.rec.emit("trainer", kind="lightning", module=cls.__name__, accumulate=k,
                      automatic=bool(automatic), fit=self._fit_at, refs=dict(self._trainer_refs))

    def _emit_pl(self, trainer, phase: str, step: bool) -> None:
        """Metrics the user logged in this pass, as Lightning reduced them."""
        logged = {n: v for n, v in self._pl_logged.items() if v[0] == phase}
        if not logged:
            return
        metrics = trainer.callback_metrics
        for name, (_, on_step, on_epoch) in logged.items():
            if step and on_step:
                key, out = f"{name}_step" if on_epoch else name, name
            elif not step and on_epoch:
                key = f"{name}_epoch" if on_step else name
                out = key
            else:
                continue
            value = _value(metrics.get(key, metrics.get(name)))
            if value is not None:
                self.rec.metric(out, value, "trainer")
        if not step:
            for name in logged:
                self._pl_logged.pop(name, None)

    # -- Hugging Face ----------------------------------------------------------------------
    def _patch_hf_args(self, module) -> None:
        link = self._link

        def wrap(original):
            def __post_init__(args, *a, **k):
                inst = link()
                if inst is not None:
                    inst.guard(inst._trainer_ref)("trainer_args",
                                                  user_location(sys._getframe()))
                return original(args, *a, **k)

            __post_init__.__wrapped__ = original
            return __post_init__

        self.patch(module.TrainingArguments, "__post_init__", wrap)

    def _patch_hf(self, module) -> None:
        callback_cls = importlib.import_module("transformers.trainer_callback").TrainerCallback
        link = self._link
        self._note_callbacks_made(callback_cls)

        class ModelDebuggerCallback(callback_cls):  # noqa: D101 - see TrainerHooks
            def on_train_begin(self, args, state, control, **kwargs):
                inst = link()
                if inst is not None:
                    inst.guard(inst._on_hf_train_begin)(args)

            def on_log(self, args, state, control, logs=None, **kwargs):
                inst = link()
                if inst is not None and logs:
                    inst.guard(inst._on_hf_log)(logs)

        self._patch_trainer(module.Trainer, "train", ModelDebuggerCallback)

    def _on_hf_train_begin(self, args) -> None:
        k = int(getattr(args, "gradient_accumulation_steps", 1) or 1)
        self._scaled_for_accumulation(k, "transformers gradient_accumulation_steps")
        self.rec.emit("trainer", kind="transformers", accumulate=k,
                      max_grad_norm=getattr(args, "max_grad_norm", None),
                      fit=self._fit_at, refs=dict(self._trainer_refs))

    def _on_hf_log(self, logs: dict) -> None:
        if "train_runtime" in logs:  # the summary after training: averages, not a reading
            return
        for name, v in logs.items():
            name = str(name)
            if name in _HF_SKIP or name.endswith(_HF_SKIP_SUFFIX):
                continue
            value = _value(v)
            if value is not None:
                self.rec.metric(name, value, "trainer")

    # -- Accelerate ------------------------------------------------------------------------
    def _patch_accelerate(self, module) -> None:
        link = self._link

        def wrap(original):
            def backward(accelerator, loss, *args, **kwargs):
                inst = link()
                if inst is not None:
                    k = int(getattr(accelerator, "gradient_accumulation_steps", 1) or 1)
                    if k > 1 and not inst._sum_losses and \
                            "DEEPSPEED" not in str(getattr(accelerator, "distributed_type", "")):
                        inst.guard(inst._scaled_for_accumulation)(
                            k, "accelerate gradient_accumulation_steps")
                return original(accelerator, loss, *args, **kwargs)

            backward.__wrapped__ = original
            return backward

        self.patch(module.Accelerator, "backward", wrap)

    # -- accumulation ----------------------------------------------------------------------
    def _scaled_for_accumulation(self, k: int, by: str) -> None:
        """From now on a step's loss is the sum of its micro-batches' (each divided by ``k``)."""
        if k > 1 and not self._sum_losses:
            self._sum_losses = True
            self.rec.emit("loss_scaled", accumulate=k, by=by)
