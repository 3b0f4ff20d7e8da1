"""Hooks of the Keras instrument, by training style (mixed into ``KerasInstrument``).

- :class:`FitHooks`: ``model.fit`` — a recording callback, a timed train function (data wait,
  sample batches, label statistics), what fit received for Isolate;
- :class:`LoopHooks`: custom ``tf.GradientTape`` loops, eager or in a ``tf.function`` — the loss
  objects and model calls give the training loss, sample batches and label statistics.
"""

from __future__ import annotations

import inspect
import re
import sys
import threading
import time
import weakref

import numpy as np

from . import patches
from .codeloc import is_user_file, user_frame
from .keras_keeper import describe_loss, split_batch, to_numpy
from .keras_steps import UNAPPLIED_MAX
from .keras_util import in_xla, user_location

_PROGRESS = re.compile(r"/step\b|━|\d+/\d+ \[")  # Keras progress bar lines, not user metrics


def _cardinality(dataset) -> int | None:
    """Batches in one pass over a ``tf.data`` dataset (None: unknown or infinite)."""
    try:
        n = int(dataset.cardinality())
    except Exception:  # noqa: BLE001 - not a dataset Keras can size
        return None
    return n if n > 0 else None


def _untimed(model):
    """The undo of a timed train function: after the capture the model retraces without it."""
    ref = weakref.ref(model)

    def undo() -> None:
        model = ref()
        if model is not None and getattr(model.train_function, "_md_timed", False):
            model.train_function = None

    return undo


def _class_weights(weights) -> list[float] | None:
    """``fit``'s ``class_weight`` dict as a list indexed by class id (None: not such a dict)."""
    try:
        pairs = {int(k): float(v) for k, v in dict(weights).items()}
    except (TypeError, ValueError):
        return None
    if not pairs or min(pairs) < 0 or max(pairs) > 10_000:
        return None
    return [pairs.get(c, 1.0) for c in range(max(pairs) + 1)]  # (Keras: 1.0 when not named)


def _as_keywords(bound: inspect.BoundArguments) -> tuple[tuple, dict]:
    """``(args, kwargs)`` of a bound ``fit`` call: the model positionally, the rest by name.

    A patch below the capture's (an intervention's, a step budget's) may add a keyword such
    as ``callbacks``; passed positionally, the same argument would arrive twice.
    """
    args: list = []
    kwargs: dict = {}
    for i, (name, value) in enumerate(bound.arguments.items()):
        kind = bound.signature.parameters[name].kind
        if i == 0 or kind is inspect.Parameter.POSITIONAL_ONLY:
            args.append(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            args.extend(value)
        elif kind is inspect.Parameter.VAR_KEYWORD:
            kwargs.update(value)
        else:
            kwargs[name] = value
    return tuple(args), kwargs


def _rows_from(y, start: int):
    """``y[start:]`` of targets given as an array, or a dict or list of arrays (one per output)."""
    if isinstance(y, dict):
        return {k: v[start:] for k, v in y.items()}
    if isinstance(y, (list, tuple)):
        return type(y)(v[start:] for v in y)
    return y[start:]


class BatchKeeping:
    """Training batches handed to the keeper, and when the data first came round."""

    def _keep_batch(self, x, y) -> None:
        """Keep a batch; a ``rows_repeat`` event when a batch first holds only kept rows.

        That is the end of an epoch (the distinct rows are the dataset), or, early, the same
        few rows fed again and again (a loop that takes the first batch every step).
        """
        before = self.keeper.came_round
        self.keeper.on_batch(x, y, self.rec.epoch)
        if before is None and self.keeper.came_round is not None:
            self.rec.emit("rows_repeat", distinct=int(self.keeper.came_round),
                          step=self.rec.step)


class FitHooks(BatchKeeping):
    """``fit``: callback, timed train function, validation data. Needs the instrument's state."""

    # -- fit -------------------------------------------------------------------------------
    def _wrap_fit(self, original):
        link = self._link
        sig = self._fit_signature(original)

        def fit(model, *args, **kwargs):
            inst = link()
            if inst is None:
                return original(model, *args, **kwargs)
            try:
                bound = sig.bind(model, *args, **kwargs)
            except TypeError:
                return original(model, *args, **kwargs)
            inst.guard(inst._before_fit)(model, bound.arguments, sys._getframe())
            tee = getattr(inst.rec, "_tee", None)
            on_line = getattr(tee, "_on_line", None)
            if on_line is not None:
                tee._on_line = lambda line: None if _PROGRESS.search(line) else on_line(line)
            inst._fit_depth += 1
            try:
                args, kwargs = _as_keywords(bound)
                return original(*args, **kwargs)
            finally:
                inst._fit_depth -= 1
                if on_line is not None:
                    tee._on_line = on_line
                inst.guard(inst._after_fit)(bound.arguments.get("callbacks"))

        fit.__wrapped__ = original
        return fit

    def _after_fit(self, callbacks) -> None:
        """An ``early_stopped`` event for each ``fit`` that returns: whether it ended restored.

        With an ``EarlyStopping`` that stopped it and ``restore_best_weights``, the model
        ``fit`` leaves is the one of its best epoch (``restored``): the epochs after it
        (``patience`` of them, the monitored value getting worse) are the callback waiting,
        not the model's end state. Every ``fit`` writes one (``restored`` False otherwise),
        so a later ``fit`` that trains on is not taken for the restored one.
        """
        self._emit_callbacks(self._steps - self._fit_steps)
        stoppers = [c for c in (callbacks if isinstance(callbacks, (list, tuple)) else ())
                    if isinstance(c, self._keras.callbacks.EarlyStopping)]
        restoring = [c for c in stoppers if getattr(c, "restore_best_weights", False) and
                     getattr(c, "best_weights", None) is not None]
        done = next((c for c in restoring if int(getattr(c, "stopped_epoch", 0) or 0) > 0), None)
        always = int(str(getattr(self._keras, "__version__", "3")).split(".")[0]) >= 3
        keeps = done or (next(iter(restoring), None) if always else None)  # (Keras 3 restores
        # when it did not stop too; tf.keras 2 only when it stopped)
        if keeps is None:
            self.rec.emit("early_stopped", restored=False)
            return
        best = getattr(keeps, "best_epoch", None)
        op = getattr(getattr(keeps, "monitor_op", None), "__name__", "")
        direction = "min" if "less" in op else "max" if "greater" in op else None
        self.rec.emit("early_stopped", monitor=str(getattr(keeps, "monitor", "")),
                      patience=int(getattr(keeps, "patience", 0) or 0),
                      stopped_epoch=int(getattr(keeps, "stopped_epoch", 0) or 0),
                      best_epoch=int(best) if isinstance(best, int) else None,
                      restored=done is not None, restores=True, direction=direction,
                      location=self._clock.where(keeps))

    def _fit_signature(self, original) -> inspect.Signature:
        """The signature of Keras' own ``fit``, whatever wraps it.

        Another patch may sit below the capture's (an intervention's or a step budget's
        ``fit(model, *args, **kwargs)``): bound against that, the ``callbacks`` argument the
        capture adds is no parameter and was silently dropped, and with it every epoch's
        metrics and targets of the run.
        """
        sig = inspect.signature(inspect.unwrap(original))
        if "callbacks" in sig.parameters:
            return sig
        owner = next((k for k in self._keras.Model.__mro__ if "fit" in vars(k)), None)
        real = patches.original(owner, "fit") if owner is not None else None
        return inspect.signature(inspect.unwrap(real)) if real is not None else sig

    def _before_fit(self, model, arguments: dict, frame) -> None:
        loc = user_location(frame)
        if getattr(model, "run_eagerly", False) or self._tf.config.functions_run_eagerly():
            self._debug_mode()  # every step run as Python, op by op
        for kind in ("fit", "backward", "step"):
            self.ref(kind, loc)
        self._discover_from_frame(model, frame)
        opt = getattr(model, "optimizer", None)
        if opt is not None:
            self._on_optimizer(opt, loc)
        if self.keeper.loss is None:
            loss = describe_loss(getattr(model, "loss", None))
            if loss is not None:
                self.keeper.loss = loss
                self.labels.loss, self.labels.keras = loss["name"], loss["keras"]
        self._on_heads(model)
        self.keeper.class_weight = None  # (this fit's: the copies train as the last one did)
        if arguments.get("class_weight") is not None or \
                arguments.get("sample_weight") is not None:
            self.labels.weighted = True  # the loss is on another scale than the prior's
            self.labels.class_weight = _class_weights(arguments.get("class_weight")) \
                if arguments.get("sample_weight") is None else None
            self.keeper.class_weight = self.labels.class_weight
        x, y = arguments.get("x"), arguments.get("y")
        if y is None and x is not None and not hasattr(x, "shape"):
            self.keeper.train_loader = self.keeper.train_loader or x
        val = arguments.get("validation_data")
        split = arguments.get("validation_split") or 0.0
        if val is None and split and hasattr(x, "shape") and y is not None:
            cut = int(len(x) * (1.0 - split))
            val = (x[cut:], _rows_from(y, cut))
        if val is not None and self.keeper.validation is None and not self.keeper.val_batches:
            self.keeper.validation = val
        callbacks = arguments.get("callbacks")
        self._time_callbacks(callbacks)  # the user's own, before the capture's joins them
        if self._loop is None:  # fit is the loop: its time outside the train function is
            self._loop = (threading.get_ident(), None)  # sampled without a loop line of the user's
        self._fit_steps = self._steps
        cb = self._callback()
        if callbacks is not None and hasattr(callbacks, "append") and \
                type(callbacks).__name__ == "CallbackList":
            callbacks.append(cb)
        else:
            arguments["callbacks"] = [*(callbacks or []), cb]
        fn = getattr(model, "train_function", None)
        if fn is not None and not getattr(fn, "_md_timed", False):
            model.train_function = None  # traced before the capture: retrace with the probes
        self._fitting = model
        self._current = self._stash_of.get(id(model))  # traced by an earlier fit of this capture
        self._epoch_base = self.rec.epoch + (1 if self._steps else 0)

    def _callback(self):
        link = self._link
        base = self._keras.callbacks.Callback

        def call(name, *args):
            inst = link()
            if inst is not None:
                inst.guard(getattr(inst, name))(*args)

        class ModelDebuggerCallback(base):
            def on_epoch_begin(self, epoch, logs=None):
                call("_on_epoch_begin", epoch)

            def on_train_batch_end(self, batch, logs=None):
                call("_on_batch_end", logs)

            def on_epoch_end(self, epoch, logs=None):
                call("_on_epoch_end", epoch, logs)

        return ModelDebuggerCallback()

    def _on_epoch_begin(self, epoch: int) -> None:
        self.rec.set_epoch(self._epoch_base + int(epoch), "keras")
        self._last_step_end = None  # the first step of an epoch also holds tracing, validation

    def _on_epoch_end(self, epoch: int, logs) -> None:
        ep = self._epoch_base + int(epoch)
        for name, value in (logs or {}).items():
            if isinstance(value, (int, float, np.floating, np.integer)) or \
                    getattr(value, "shape", None) == ():
                self.rec.metric(name, float(value), "keras", epoch=ep)
        self._emit_targets()

    def _on_batch_end(self, logs) -> None:
        if self._pending is not None:
            vec, layout = self._pending
            self._pending = None
        elif self._current is not None:
            vec, layout = self._stashes[self._current].numpy(), self._layouts[self._current]
        else:
            loss = (logs or {}).get("loss")
            self._emit_step(None if loss is None else float(loss), None, {})
            return
        self._emit_from_vec(vec, layout)

    def _wrap_make_train(self, original):
        link = self._link

        def make_train_function(model, force=False):
            out = original(model, force)
            inst = link()
            fn = getattr(model, "train_function", None)
            if inst is not None and fn is not None and \
                    not getattr(fn, "_md_timed", False):
                model.train_function = inst._timed(model, fn)
                inst.hold(_untimed(model))
            return out

        make_train_function.__wrapped__ = original
        return make_train_function

    def _timed(self, model, fn):
        """The train function, fed one batch taken by a timed ``next()`` (the data wait)."""
        link = self._link
        out_of_range = self._tf.errors.OutOfRangeError

        def train_function(iterator):
            inst = link()
            if inst is None or getattr(model, "steps_per_execution", 1) != 1 or \
                    isinstance(iterator, list):
                return fn(iterator)
            t0 = time.perf_counter()
            try:
                data = next(iterator)
            except out_of_range:
                raise StopIteration from None
            inst._data_wait += time.perf_counter() - t0
            inst.guard(inst._on_data)(data)
            inst._timed_batch = True  # kept here: the traced loss hook must not keep it again
            inst._work_enter()  # the step's own work (the rest: callbacks, fit's bookkeeping)
            try:
                return fn(iter((data,)))
            finally:
                inst._work_exit()
                inst._timed_batch = False

        train_function._md_timed = True
        return train_function

    def _on_data(self, data) -> None:
        x, y = split_batch(data)
        self._last_x, self._last_y = x, y
        self._keep_batch(x, y)
        if y is not None and not isinstance(y, (dict, tuple, list)):
            y = y.numpy() if hasattr(y, "numpy") else y
            self.labels.observe(y)
            self.labels.observe_values(y, self.rec.epoch)
        elif y is not None and self.heads is not None:
            self.heads.observe(y)



class LoopHooks(BatchKeeping):
    """Custom loops: the model's last input, paired with the targets by the loss.

    ``Model.__call__`` remembers the last input (eager, or symbolic while a ``tf.function`` is
    traced); ``Loss.__call__`` pairs it with the targets, as training while a gradient tape
    records, else as validation. In a traced step the pair leaves the graph through
    ``tf.py_function`` until the keeper holds enough batches (a variable gates it, so a full
    keeper costs no host copy per step).
    """

    def _wrap_model_call(self, original):
        link = self._link

        def __call__(model, *args, **kwargs):
            inst = link()
            if inst is None:
                return original(model, *args, **kwargs)
            if args and not inst._fit_depth and not inst._call_depth:
                inst._call = args[0]  # the outermost model's input, not a nested model's
                if not inst._eval_seen and inst._models:
                    inst.guard(inst._note_eval_forward)()
            training = kwargs.get("training", args[1] if len(args) > 1 else None)
            unflagged = not inst._call_depth and id(model) not in inst._flag_checked and \
                training is not True
            work = not inst._fit_depth and inst._tf.executing_eagerly()  # a training forward,
            if work:                                                      # or an evaluation's
                inst._work_enter()
            inst._call_depth += 1
            try:
                out = original(model, *args, **kwargs)
            finally:
                inst._call_depth -= 1
                if work:
                    inst._work_exit()
            if unflagged:  # after the call: a subclassed model is built by its first one
                inst.guard(inst._note_train_flag)(model, training)
            return out

        __call__.__wrapped__ = original
        return __call__

    def _note_train_flag(self, model, training) -> None:
        """A forward under a recording tape without ``training=True``: a candidate, once a model.

        Dropout, batch normalisation and noise layers then run as in inference (a custom
        ``train_step`` calling ``self(x)`` or ``self(x, training=False)``, a tape loop calling
        ``model(x)``). Kept with the layers concerned and the user's line; reported at the end
        (:meth:`_emit_train_flag`) only for a model the optimizer trained: a frozen teacher or
        backbone called so on purpose is not.
        """
        from tensorflow.python.eager import record

        if not record.could_possibly_record():
            return
        self._flag_checked.add(id(model))
        if not model.trainable_weights or self._flag_pending:
            return
        kinds = ("Dropout", "BatchNormalization", "GaussianNoise", "GaussianDropout")
        layers = sorted({type(layer).__name__ for layer in
                         model._flatten_layers(include_self=False, recursive=True)
                         if any(k in type(layer).__name__ for k in kinds)})
        if layers:
            self._flag_pending.append(({id(v) for v in model.trainable_weights}, {
                "training": None if training is None else str(training), "layers": layers,
                "location": user_location(sys._getframe())}))

    def _emit_train_flag(self) -> None:
        """The ``train_flag`` event of the first candidate whose weights an optimizer updated.

        When which variables were updated is unknown, only a call that gave no ``training``.
        """
        for weights, event in self._flag_pending:
            if (weights & self._updated) if self._updated else event["training"] is None:
                self.rec.emit("train_flag", **event)
                return

    def _note_eval_forward(self) -> None:
        """Reference the first evaluation forward: where validation inputs enter the model.

        Eager, no tape recording, after training began (the ``eval_forward`` reference).
        """
        from tensorflow.python.eager import record

        if self._tf.executing_eagerly() and not record.could_possibly_record() and self._steps:
            self._eval_seen = True
            self.ref("eval_forward", user_location(sys._getframe()))

    def _wrap_function_call(self, original):
        """``tf.function`` calls outside ``fit``: the model's work (``bz``) while they run.

        An evaluation between steps is the model's work too, as a forward under ``no_grad`` is
        in PyTorch: only what the loop does outside the model is its own time.
        """
        link = self._link

        def __call__(fn, *args, **kwargs):
            inst = link()
            if inst is None or inst._fit_depth:
                return original(fn, *args, **kwargs)
            inst._work_enter()
            taken, traced, kept = inst._gradients, inst._traced_gradients, len(inst._unapplied)
            try:
                out = original(fn, *args, **kwargs)
            finally:
                inst._work_exit()
            inst.guard(inst._on_function_out)(fn, out, inst._gradients > taken,
                                              inst._traced_gradients > traced,
                                              len(inst._unapplied) > kept)
            return out

        __call__.__wrapped__ = original
        return __call__

    def _on_function_out(self, fn, out, took_gradients: bool, traced: bool = False,
                         kept: bool = False) -> None:
        """A traced step that takes gradients: its scalar loss while no optimizer has applied any.

        Its ``tape.gradient`` runs once, when the function is traced (``traced``: a gradient
        of a symbolic loss; run eagerly, ``run_functions_eagerly``, every call takes one and
        none is a trace); each call's returned loss is what a loop without ``apply_gradients``
        would show (kept as unapplied steps, see
        :meth:`~model_debugger.capture.keras_steps.StepHooks._emit_unapplied`), unless the
        eager gradient already kept this call's loss (``kept``).
        """
        if took_gradients:
            self._grad_fns.add(id(fn))
            if traced and not self._steps:  # traced (again), no optimizer: its own update
                self._grad_traces += 1
                self._grad_traced_at = user_location(sys._getframe()) or self._grad_traced_at
        if self._steps or id(fn) not in self._grad_fns or kept or \
                len(self._unapplied) >= UNAPPLIED_MAX:
            return
        if isinstance(out, (tuple, list)) and out:
            out = out[0]
        tf = self._tf
        if isinstance(out, tf.Tensor) and not tf.is_symbolic_tensor(out) and \
                out.dtype.is_floating and out.shape.num_elements() == 1:
            self._unapplied.append((float(out.numpy().reshape(-1)[0]), time.perf_counter()))

    def _wrap_tape_enter(self, original):
        """``GradientTape.__enter__``: a tape entered again after its gradient was taken.

        A persistent tape made once and entered every step (``self.tape =
        tf.GradientTape(persistent=True)``, then ``with self.tape:``) resumes the same tape: it
        keeps every operation of every step, and the memory it holds grows for the whole run.
        Counted when a persistent tape whose gradient was already taken (``_tapes_used``) is
        entered while it still holds its records (``reset()`` empties it): a tape entered
        twice before its gradient, within one step, is not. Outside ``fit``; written as
        ``tape_kept`` when the capture ends.
        """
        link = self._link

        def __enter__(tape):
            inst = link()
            if inst is not None and tape in inst._tapes_used and \
                    getattr(tape, "_tape", None) is not None and \
                    not getattr(tape, "_recording", False):
                inst.guard(inst._on_tape_resumed)(tape)
            return original(tape)

        __enter__.__wrapped__ = original
        return __enter__

    def _wrap_tape_init(self, original):
        """``GradientTape.__init__``: where a persistent tape is made (``_tapes_made``).

        The calling frames' (file, line) pairs, resolved to the user's line only if that tape
        is ever resumed (a loop that makes a persistent tape per step pays no frame walk).
        """
        link = self._link

        def __init__(tape, *args, **kwargs):
            original(tape, *args, **kwargs)
            inst = link()
            if inst is not None and getattr(tape, "_persistent", False) and \
                    len(inst._tapes_made) < 1024:  # (weak keys: past steps' tapes are gone)
                f, chain = sys._getframe(1), []
                while f is not None and len(chain) < 12:
                    chain.append((f.f_code.co_filename, f.f_lineno))
                    f = f.f_back
                inst._tapes_made[tape] = chain

        __init__.__wrapped__ = original
        return __init__

    def _on_tape_resumed(self, tape) -> None:
        self._tapes_resumed += 1
        if self._tape_resumed_at is None:
            chain = self._tapes_made.get(tape) or []
            made = next(({"file": f, "line": line} for f, line in chain if is_user_file(f)),
                        None)
            self._tape_resumed_at = {"entered": user_location(sys._getframe()), "made": made,
                                     "persistent": bool(getattr(tape, "_persistent", False))}

    def _emit_tape_kept(self) -> None:
        """The ``tape_kept`` event (see :meth:`_wrap_tape_enter`), when a tape was resumed."""
        if self._tapes_resumed:
            at = self._tape_resumed_at or {}
            self.rec.emit("tape_kept", resumed=self._tapes_resumed,
                          steps=self._steps or len(self._unapplied),
                          persistent=at.get("persistent"), made=at.get("made"),
                          entered=at.get("entered"))

    def _wrap_cache(self, original):
        """``Dataset.cache()``: a ``cache_unbounded`` event when what it caches never ends."""
        link = self._link

        def cache(dataset, *args, **kwargs):
            out = original(dataset, *args, **kwargs)
            inst = link()
            if inst is not None:
                inst.guard(inst._on_cache)(dataset, args, kwargs)
            return out

        cache.__wrapped__ = original
        return cache

    def _on_cache(self, dataset, args, kwargs) -> None:
        """An in-memory cache over an infinite dataset (``.repeat().cache()``): it fills forever.

        Every element the pipeline yields (each augmented batch, epoch after epoch) is kept in
        memory and the cache never completes. Cached to a file it grows on disk instead.
        """
        tf = self._tf
        filename = kwargs.get("filename", args[0] if args else "")
        if int(dataset.cardinality()) != int(tf.data.INFINITE_CARDINALITY):
            return
        self.rec.emit("cache_unbounded", in_memory=not filename,
                      location=user_location(sys._getframe()))

    def _wrap_data(self, original):
        """``tf.data`` iteration in a custom loop (making the iterator, taking a batch): data wait.

        Under ``fit`` the train function's own timed ``next()`` counts it; inside the model's
        work (a ``tf.function`` being traced) it is not the loop's wait.
        """
        link = self._link

        def timed(obj, *args, **kwargs):
            inst = link()
            if inst is None or inst._fit_depth or inst._work_depth or \
                    not inst._tf.executing_eagerly() or inst._loop is not None and \
                    inst._loop[0] != threading.get_ident():  # (a consumer on another thread)
                return original(obj, *args, **kwargs)
            t0 = time.perf_counter()
            out = stop = None
            try:
                out = original(obj, *args, **kwargs)
                return out
            except StopIteration:
                stop = True
                raise
            finally:
                inst._data_wait += time.perf_counter() - t0
                inst.guard(inst._count_pass)(obj, out, stop)

        timed.__wrapped__ = original
        return timed

    def _count_pass(self, obj, out, stop) -> None:
        """A custom loop's pass over a dataset: begun (``__iter__``), a batch, or run out.

        The training dataset iterated again after a pass that ran out starts the next epoch
        (the validation losses seen since are written first), as a PyTorch training loader
        does; a loop that takes one batch per ``iter()`` (``next(iter(ds))``) or leaves its
        passes early starts one at its evaluations instead (:meth:`_epoch_at_step`).
        """
        if out is not None and type(obj).__name__ != "OwnedIterator":  # a dataset's __iter__
            if len(self._iterating) > 1024:
                self._iterating.clear()
            key = id(obj)
            self._iterating[id(out)] = (key, weakref.ref(out))
            cut, ran_out = self._passes.begin(key, obj, user_location(sys._getframe()),
                                              _cardinality(obj))
            if cut:
                self.keeper.cut_passes = True  # its last pass drew under half of it
            if key == self._passes.train and ran_out:
                self._next_epoch()
            return
        entry = self._iterating.get(id(obj))
        if entry is None or entry[1]() is not obj:
            return
        if stop:
            self._passes.ran_out(entry[0])
        elif out is not None:
            self._passes.drew(entry[0])
            self._last_source = entry[0]
            if not self._steps:  # a replay's batch when the first step is traced
                self._last_drawn = out

    def _work_enter(self) -> None:
        if not self._work_depth:
            self._work_t0 = time.perf_counter()
            self._note_loop()
        self._work_depth += 1

    def _work_exit(self) -> None:
        if self._work_depth:
            self._work_depth -= 1
            if not self._work_depth:
                self._work += time.perf_counter() - self._work_t0

    def _take_work(self, now: float) -> float | None:
        """The model's work since the last step (None: none seen, e.g. under ``fit``).

        A step emitted inside a ``tf.function`` (the apply's ``py_function``) counts the call
        so far; the rest of the call counts towards the next step.
        """
        if not self._work and not self._work_depth:
            return None
        work = self._work + (now - self._work_t0 if self._work_depth else 0.0)
        self._work = 0.0
        if self._work_depth:
            self._work_t0 = now
        return work

    def _note_loop(self) -> None:
        """Note the training thread and the user's loop function, once.

        The line sampler needs them: a traced step's hooks run on TensorFlow's threads.
        """
        if self._loop is None or (self._loop[1] is None and not self._fit_depth):
            loop = user_frame(sys._getframe())  # (a custom loop after a fit: its own code)
            self._loop = (threading.get_ident(), loop.f_code if loop is not None else None)

    def _wrap_loss_call(self, original):
        link = self._link

        def __call__(loss, y_true, y_pred, *args, **kwargs):
            inst = link()
            work = inst is not None and not inst._fit_depth and inst._tf.executing_eagerly()
            if work:  # an eager loss is the model's work, as the forward before it
                inst._work_enter()
            try:
                out = original(loss, y_true, y_pred, *args, **kwargs)
            finally:
                if work:
                    inst._work_exit()
            inst = link()
            if inst is not None and not inst._fit_depth:
                if inst._tf.executing_eagerly():
                    inst.guard(inst._on_loss_call)(loss, y_true, y_pred, out)
                else:
                    inst.guard(inst._on_traced_loss_call)(loss, y_true)
            return out

        __call__.__wrapped__ = original
        return __call__

    def _describe_loss(self, loss) -> bool:
        """Remember the training loss (its kind names the constant-predictor baseline)."""
        if self.keeper.loss is None:
            desc = describe_loss(loss)
            if desc is None:
                return False
            self.keeper.loss = desc
            self.labels.loss, self.labels.keras = desc["name"], desc["keras"]
            self.ref("loss_fn", user_location(sys._getframe()), name=desc["keras"])
        return self.keeper.loss.get("object") is loss

    def _on_traced_loss_call(self, loss, y_true) -> None:
        """A loss traced inside a ``tf.function`` training step: count its targets when it runs.

        The targets leave the graph through ``tf.py_function`` (as the step's norms do), so the
        label prior / target moments are known for loops that never run eagerly.
        """
        from tensorflow.python.eager import record

        x, self._call = self._call, None
        if not record.could_possibly_record() or in_xla() or not self._describe_loss(loss):
            return
        tf = self._tf
        link = self._link  # the py_function outlives the capture in TensorFlow's registry

        def observe(y):
            inst = link()
            if inst is not None:
                inst.guard(lambda: inst.labels.observe(y.numpy()))()

        tf.py_function(observe, [y_true], [])
        if not (tf.is_tensor(x) and tf.is_symbolic_tensor(x)
                and x.graph is tf.compat.v1.get_default_graph()
                and x.shape.rank and y_true.shape.rank
                and x.shape[:1].is_compatible_with(y_true.shape[:1])):
            return
        if self._keep_gate is None:
            with tf.init_scope():
                self._keep_gate = tf.Variable(True, trainable=False, name="model_debugger_keep")
        gate = self._keep_gate

        def keep(xb, yb):
            inst = link()
            if inst is not None:
                inst.guard(inst._on_traced_batch)(xb.numpy(), yb.numpy())

        def kept():
            tf.py_function(keep, [x, y_true], [])
            return tf.constant(True)  # (a branch of tf.cond must give a value)

        tf.cond(gate, kept, lambda: tf.constant(True))

    def _on_traced_batch(self, x, y) -> None:
        """One training batch of a traced step, kept like an eager one; closes the gate when full.

        Not when the timed train function kept it already (``train_on_batch``).
        """
        if not getattr(self, "_timed_batch", False):
            self._keep_batch(x, y)
        if self.keeper.full(self.rec.epoch) and self._keep_gate is not None:
            self._keep_gate.assign(False)

    def _wrap_metric_update(self, original):
        """``update_state`` of Keras' mean-metric wrappers (accuracies, ...) outside ``fit``.

        A custom loop that validates with a metric object (``val_acc.update_state(y,
        model(x))``) and no loss call still pairs the model's last input with the targets:
        without a tape recording they are validation batches.
        """
        link = self._link

        def update_state(metric, y_true, y_pred, *args, **kwargs):
            out = original(metric, y_true, y_pred, *args, **kwargs)
            inst = link()
            if inst is not None and not inst._fit_depth and inst._tf.executing_eagerly():
                inst.guard(inst._on_metric_call)(y_true)
            return out

        update_state.__wrapped__ = original
        return update_state

    def _on_metric_call(self, y_true) -> None:
        from tensorflow.python.eager import record

        if record.could_possibly_record():  # under a tape: a training metric
            return
        x, self._call = self._call, None
        self._keep_val(x, y_true)

    def _note_eval_loss(self, out, y_true) -> None:
        """An eager evaluation of the training loss object (no tape): one validation batch."""
        rows = getattr(y_true, "shape", (None,))[:1]
        value = float(out) if out is not None and getattr(out, "shape", None) == () else None
        if value is not None and rows and rows[0]:
            self._eval_losses.append((value, int(rows[0])))

    def _next_epoch(self) -> None:
        """A custom loop's epoch ended: its validation losses written, the epoch counted."""
        self._flush_eval()
        self.rec.set_epoch(self.rec.epoch + 1, "dataset")

    def _epoch_at_step(self) -> None:
        """A training step after evaluation losses: the evaluation closed an epoch."""
        if self._eval_losses:
            self._next_epoch()

    def _flush_eval(self) -> None:
        """Record the mean loss of the evaluation just finished (``eval_loss``, a custom loop)."""
        if self._eval_losses:
            total = sum(v * n for v, n in self._eval_losses)
            count = sum(n for _, n in self._eval_losses)
            self._eval_losses = []
            self.rec.metric("eval_loss", total / count, "auto")

    def _keep_val(self, x, y_true) -> None:
        """Keep an evaluation's input and targets as a validation batch (at most 32)."""
        if x is None or self._tf.is_tensor(x) and self._tf.is_symbolic_tensor(x):
            return  # traced earlier, not this eager batch
        y = to_numpy(y_true)
        if len(self.keeper.val_batches) < 32 and hasattr(y, "shape") \
                and getattr(x, "shape", (None,))[:1] == y.shape[:1]:
            self.keeper.val_batches.append(((to_numpy(x),), y))

    def _on_loss_call(self, loss, y_true, y_pred, out=None) -> None:
        from tensorflow.python.eager import record

        x, self._call = self._call, None
        if self._tf.is_tensor(x) and self._tf.is_symbolic_tensor(x):
            x = None  # traced earlier, not this eager batch
        if not record.could_possibly_record():  # no tape: an evaluation
            self._keep_val(x, y_true)
            if self._steps and (self.keeper.loss or {}).get("object") is loss:
                self._note_eval_loss(out, y_true)
            return
        if not self._describe_loss(loss):
            return
        y = to_numpy(y_true)
        self.labels.observe(y)
        if x is not None:
            self._last_x = x
            self._keep_batch(x, y)
