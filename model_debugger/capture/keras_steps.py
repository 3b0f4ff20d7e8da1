"""Gradient and step hooks of the Keras instrument (mixed into ``KerasInstrument``).

What they record:

- ``tf.GradientTape.gradient``: the loss (the tape's target) and, outside ``fit``, the line
  computing gradients (a ``backward`` ``ref``);
- ``BaseOptimizer.apply`` (under ``apply_gradients``): outside ``fit``, the ``step`` line; the
  optimizer and model when not seen yet; per-variable gradient norms where Keras applies them,
  summed per layer. Inside a traced ``fit`` step the norms and the loss are written to a small
  variable read after each batch; in eager loops they are read directly; in ``tf.function``
  custom loops they leave the graph through ``tf.py_function``;
- a ``trained`` event for each new set of variables applied: the model's weight count and how
  many of them the applies so far updated (frozen layers, an optimizer over part of the model);
- one ``step`` event per apply: ``loss``, ``gn``, ``mgn`` (a bounded window of layers, see
  :mod:`.norms`), ``dt``, ``dw``, ``rss``, ``tm``, ``cuda``/``cuda_peak`` on a GPU, and in custom
  loops ``bz`` (the model's work since the last step: model calls, ``tf.function`` calls,
  gradients and applies, timed as they run); the first non-finite loss or gradient norm is a
  ``nonfinite`` event naming the first layer with non-finite weights or output on the last
  batch.

State owned here: the variable layouts, the stashes of traced fit steps, the tape's target and
the step clock.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np

from ._util import forward_fields, num, rss_bytes
from .codeloc import is_user_file, user_frame
from .held import HELD_EVERY, HeldWatch
from .keras_keeper import split_batch
from .keras_util import in_xla, layer_of, user_location
from .norms import MGN_MAX
from .norms import window as norms_window
from .sampler import OverheadWatch

UNAPPLIED_MAX = 100_000  # losses kept of gradients no optimizer applied
# variables of the first gradient watched for updates made by hand, and values compared of each
WATCHED_MAX = 32
WATCHED_VALUES = 4096


def _trace_caller(frame) -> dict | None:
    """The user's line that called the ``tf.function`` being traced at ``frame``.

    The innermost user frame is the traced body (the ``apply_gradients`` line, or a helper it
    calls); past it, TensorFlow's tracing frames; the next user frame is the call.
    """
    inner = user_frame(frame)
    crossed = False
    f = inner.f_back if inner is not None else None
    while f is not None:
        name = f.f_code.co_filename
        if "__autograph_generated" in name:
            pass  # autograph's copy of a traced function's body: still inside the trace
        elif is_user_file(name):
            if crossed:
                return {"file": name, "line": f.f_lineno}
        else:
            crossed = True
        f = f.f_back
    return None


def _head(tf, v) -> np.ndarray | None:
    """A copy of the first :data:`WATCHED_VALUES` values of variable ``v`` (None: unreadable).

    Only that slice is read and kept (a big embedding is not copied whole).
    """
    try:
        return np.array(tf.reshape(tf.convert_to_tensor(v), [-1])[:WATCHED_VALUES].numpy(),
                        copy=True)
    except Exception:  # noqa: BLE001 - a variable that cannot be read (graph mode, a mirror)
        return None


def _finite(y) -> bool:
    """Whether targets ``y`` (an array, a tensor, a dict or list of them, or None) are finite.

    None (unknown) counts as finite; non-numeric targets too.
    """
    if y is None:
        return True
    if isinstance(y, dict):
        return all(_finite(v) for v in y.values())
    if isinstance(y, (list, tuple)):
        return all(_finite(v) for v in y)
    arr = np.asarray(y.numpy() if hasattr(y, "numpy") else y)
    return arr.dtype.kind not in "fc" or bool(np.isfinite(arr).all())


class StepHooks(OverheadWatch, HeldWatch):
    """``GradientTape.gradient`` and ``BaseOptimizer.apply``: the loss and norms of each step."""

    def _debug_mode(self) -> None:
        """A ``debug_mode`` event, once: steps run eagerly (``run_eagerly``)."""
        if not self._debug_seen:
            self._debug_seen = True
            self.rec.emit("debug_mode", mode="run_eagerly")

    def _idle(self) -> bool:
        """Outside the model's work: no model call, ``tf.function``, gradient or apply running.

        (The line sampler asks, from its own thread.)
        """
        return not self._work_depth

    def _wrap_gradient(self, original):
        link = self._link

        def gradient(tape, target, sources, *args, **kwargs):
            inst = link()
            if inst is None:
                return original(tape, target, sources, *args, **kwargs)
            inst.guard(inst._on_gradient)(target, sources)
            if not inst._fit_depth and getattr(tape, "_persistent", False):
                inst._tapes_used.add(tape)  # resumed after this: kept across steps (tape_kept)
            work = not inst._fit_depth
            if work:
                inst._work_enter()
            try:
                return original(tape, target, sources, *args, **kwargs)
            finally:
                if work:
                    inst._work_exit()

        gradient.__wrapped__ = original
        return gradient

    def _on_gradient(self, target, sources) -> None:
        tf = self._tf
        if isinstance(target, (tf.Tensor, tf.Variable)) and target.dtype.is_floating and \
                target.shape.rank is not None and target.shape.num_elements() == 1:
            self._target = target
            if not self._fit_depth:
                self.ref("backward", user_location(sys._getframe()))
                if tf.config.functions_run_eagerly():
                    self._debug_mode()
                self._gradients += 1
                if tf.is_symbolic_tensor(target):
                    self._traced_gradients += 1  # taken while a tf.function is traced
                if self._watched is None and not self._steps:
                    self._watch_sources(sources)
                if not self._steps and len(self._unapplied) < UNAPPLIED_MAX and \
                        not tf.is_symbolic_tensor(target):  # eager: its value is at hand
                    self._unapplied.append((float(target.numpy().reshape(-1)[0]),
                                            time.perf_counter()))

    def _watch_sources(self, sources) -> None:
        """Keep the gradient's trainable variables and a copy of their first values.

        When no optimizer applies anything, whether the loop updates these variables itself
        (``v.assign_sub(lr * g)``) is measured, not assumed: :meth:`_emit_unapplied` compares.
        Only trainable floating-point variables count (moving statistics and seed states change
        without any update), at most :data:`WATCHED_MAX`, their first :data:`WATCHED_VALUES`
        values read outside any ``tf.function`` being traced (``init_scope``). A gradient
        taken with respect to no variable (an input's, for a saliency map) watches nothing:
        the next one is looked at. Variables that cannot be read are left out.
        """
        tf = self._tf
        flat = [v for v in tf.nest.flatten(sources)  # tf.Variable or keras.Variable
                if callable(getattr(v, "assign", None)) and getattr(v, "trainable", True)
                and getattr(getattr(v, "dtype", None), "is_floating",
                            "float" in str(getattr(v, "dtype", "")))]
        if not flat:
            return
        watched = []
        with tf.init_scope():
            for v in flat[:WATCHED_MAX]:
                first = _head(tf, v)
                if first is not None:
                    watched.append((v, first))
        self._watched = watched  # (empty: none readable, ``updated`` is left out)

    def _updated_by_hand(self) -> tuple[int, int] | None:
        """``(changed, read)``: watched variables that changed since, of those read again.

        None when none was watched or none could be read again.
        """
        if not self._watched:
            return None
        tf = self._tf
        changed = read = 0
        with tf.init_scope():
            for v, before in self._watched:
                now = _head(tf, v)
                if now is None:
                    continue
                read += 1
                changed += not np.array_equal(now, before, equal_nan=True)
        return (changed, read) if read else None

    def _emit_unapplied(self) -> None:
        """A custom loop took gradients but no optimizer applied them: say so, truthfully.

        Each eager ``tape.gradient`` call's loss becomes a step (the loss a loop without
        ``apply_gradients`` shows), and an ``unapplied`` event counts the gradients taken and
        how many of the first gradient's variables changed since (``updated``: a loop that
        applies its gradients by hand, ``v.assign_sub(lr * g)``, trains without an optimizer);
        the ``calls`` event has no optimizer step.
        """
        last = None
        for i, (loss, at) in enumerate(self._unapplied):  # dt: from one step's loss to the next
            self.rec.emit("step", i=i, ep=0, loss=num(loss), gn=None,
                          dt=None if last is None else at - last, dw=None, tm=True)
            last = at
        self.rec.step = len(self._unapplied)
        updated = self._updated_by_hand()
        self.rec.emit("unapplied", gradients=self._gradients, steps=len(self._unapplied),
                      **({} if updated is None else
                         {"updated": updated[0], "watched": updated[1]}))
        self.rec.emit("calls", optimizer_steps=0, backward=self._gradients)

    def _wrap_apply(self, original):
        link = self._link

        def apply(opt, grads, trainable_variables=None):
            inst = link()
            if inst is None or inst._in_apply:
                return original(opt, grads, trainable_variables)
            grads = list(grads)
            if trainable_variables is not None:
                trainable_variables = list(trainable_variables)
            inst._in_apply = True
            try:
                post = inst.guard(inst._before_apply)(opt, grads, trainable_variables)
                work = not inst._fit_depth
                if work:
                    inst._work_enter()
                try:
                    out = original(opt, grads, trainable_variables)
                finally:
                    if work:
                        inst._work_exit()
                if post is not None:
                    inst.guard(post)()
                return out
            finally:
                inst._in_apply = False

        apply.__wrapped__ = original
        return apply

    def _before_apply(self, opt, grads, variables):
        tf = self._tf
        if variables is None:
            variables = list(getattr(opt, "_trainable_variables", None) or [])
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        if not pairs and self._fit_depth:
            return None
        # outside fit, an apply that updates nothing (every layer frozen, no gradient reaching
        # any variable) is still the loop's step: recorded, with nothing updated
        frame = sys._getframe()
        if not self._fit_depth:
            self.ref("step", user_location(frame))
        if id(opt) not in self._opts:
            self._on_optimizer(opt, None)
        if not self._models:
            self._discover_from_variables([v for _, v in pairs], frame)
        if not self._steps:  # the weights of a model built by its first call, before any update
            with tf.init_scope():
                self.guard(self.keeper.keep_initial_weights)()
        key = tuple(id(v) for _, v in pairs)
        if key not in self._layouts:
            self.guard(self._note_updated)([v for _, v in pairs])
            names: list[str] = []
            index = []
            for _, v in pairs:
                layer = layer_of(v)
                if layer not in names:
                    names.append(layer)
                index.append(names.index(layer))
            self._layouts[key] = (names, np.array(index, dtype=np.intp))
        layout = self._layouts[key]
        vec = self._vector(pairs)
        if tf.executing_eagerly():
            if self._fit_depth:
                return lambda: setattr(self, "_pending", (vec.numpy(), layout))
            return lambda: self._emit_from_vec(vec.numpy(), layout)
        if self._fit_depth:
            stash = self._stashes.get(key)
            if stash is None:
                with tf.init_scope():
                    stash = tf.Variable(tf.zeros([len(pairs) + 2]), trainable=False,
                                        name="model_debugger_stash")
                self._stashes[key] = stash
            stash.assign(vec)
            self._current = self._stash_of[id(self._fitting)] = key
            return None
        self._traces += 1  # a custom loop's step traced (again): where it was called from
        self._traced_at = _trace_caller(sys._getframe()) or self._traced_at
        if not in_xla():
            link = self._link  # the py_function outlives the capture in TensorFlow's registry

            def step(v):
                inst = link()
                if inst is not None:
                    inst.guard(inst._emit_from_vec)(v.numpy(), layout)

            tf.py_function(step, [vec], [])
        return None

    def _note_updated(self, variables) -> None:
        """A ``trained`` event: how much of the model the applies seen so far update.

        The model's size counts the weights of its layers that train or were frozen
        (``trainable=False``), not statistics that never train (normalisation moments).
        """
        model = self._root() if self._root is not None else None
        if model is None or len(self._layouts) >= 8:
            return
        self._updated.update(id(v) for v in variables)
        sizes = {}
        for layer in model._flatten_layers(include_self=False, recursive=True):
            for w in layer.weights if not layer.trainable else layer.trainable_weights:
                if "moving" not in getattr(w, "path", ""):
                    sizes[id(w)] = int(np.prod(w.shape))
        self.rec.emit("trained", params=sum(sizes.values()),
                      updated=sum(n for i, n in sizes.items() if i in self._updated))

    def _vector(self, pairs):
        """``[has_loss, loss, |g_1|, ..., |g_n|]`` as one float32 tensor (graph or eager)."""
        tf = self._tf
        target, self._target = self._target, None
        eager = tf.executing_eagerly()
        usable = target is not None and (
            not tf.is_symbolic_tensor(target) if eager else
            (tf.is_symbolic_tensor(target)
             and target.graph is tf.compat.v1.get_default_graph()))
        if usable:
            head = [tf.constant(1.0), tf.reshape(tf.cast(target, tf.float32), [])]
        else:
            head = [tf.constant(0.0), tf.constant(0.0)]
        norms = []
        for g, _ in pairs:
            if isinstance(g, tf.IndexedSlices):
                g = g.values
            norms.append(tf.norm(tf.cast(tf.reshape(g, [-1]), tf.float32)))
        return tf.stack(head + norms)

    # -- steps -----------------------------------------------------------------------------
    def _emit_from_vec(self, vec, layout) -> None:
        vec = np.asarray(vec, dtype=np.float64)
        names, index = layout
        loss = float(vec[1]) if vec[0] > 0 else None
        norms = vec[2:]
        with np.errstate(over="ignore", invalid="ignore"):
            sq = np.zeros(len(names))
            np.add.at(sq, index, norms * norms)
            per_layer = np.sqrt(sq)
            total = float(np.sqrt(sq.sum()))
        mgn = dict(zip(names, per_layer.tolist())) if self.cfg.module_norms else {}
        if len(mgn) > MGN_MAX:  # a window of the layers per step (see norms.py)
            if not self._mgn_at:
                self.rec.emit("module_norms", modules=len(mgn), per_step=MGN_MAX)
            mgn, self._mgn_at = norms_window(mgn, self._mgn_at), self._mgn_at + MGN_MAX
        if not self._nonfinite_seen:
            if loss is not None and not math.isfinite(loss):
                self._nonfinite_seen = True
                self._forward = {}
                module = self._localize()
                self.rec.emit("nonfinite", step=self.rec.step, what="loss", value=str(loss),
                              module=module, replay=None, **self._forward)
            elif not math.isfinite(total):
                self._nonfinite_seen = True
                bad = [n for n, v in zip(names, per_layer) if not math.isfinite(v)]
                self.rec.emit("nonfinite", step=self.rec.step, what="grad", value=str(total),
                              module=bad[-1] if bad else None)
        self._emit_step(loss, total, mgn)

    def _emit_step(self, loss, gn, mgn) -> None:
        if self._unsized:
            self._emit_model()  # built by now (a subclassed model's first call)
        self._note_rate()
        if not self._fit_depth:
            self._epoch_at_step()  # (a custom loop's evaluation since the last step)
        now = time.perf_counter()
        dt = now - self._last_step_end if self._last_step_end is not None else None
        self._last_step_end = now
        step = {"i": self.rec.step, "ep": self.rec.epoch, "loss": num(loss), "gn": num(gn),
                "dt": dt, "dw": self._data_wait, "rss": rss_bytes()}
        work = self._take_work(now)  # a custom loop: forward, backward and step (LoopHooks)
        if work is not None:  # the rest of the step is the loop's own work
            step["bz"] = work
            self._passes.trains(self._last_source)
            if dt is not None and self._loop is not None:
                self._watch_overhead(dt, self._data_wait, step["bz"], *self._loop)
        if mgn:
            step["mgn"] = {k: num(v) for k, v in mgn.items()}
        step["tm"] = True
        device = self._device_memory()
        if device is not None:
            step["cuda"], step["cuda_peak"] = device
        self._data_wait = 0.0
        self.rec.emit("step", **step)
        self.rec.step += 1
        self._steps += 1
        self._last_drawn = None  # (kept for a replay of the first step only)
        if not self.rec.step % HELD_EVERY and self._held_due(self.rec.step):
            self.guard(self._look_held)(self.rec.step)  # the containers the loop keeps (held.py)
        if self.cfg.hist_every and self._steps % self.cfg.hist_every == 0:
            self._emit_targets()

    def _device_memory(self):
        tf = self._tf
        if self._gpu is None:
            self._gpu = bool(tf.config.list_physical_devices("GPU"))
        if not self._gpu:
            return None
        try:
            info = tf.config.experimental.get_memory_info("GPU:0")
            return int(info["current"]), int(info["peak"])
        except Exception:  # noqa: BLE001 - no memory info for this device
            self._gpu = False
            return None

    def _localize(self) -> str | None:
        """The first layer holding non-finite weights or giving non-finite output on the last batch.

        Functional and Sequential models only. Keras applies a step's update before the capture
        reads its loss: on the first step the weights read are the update's (non-finite
        everywhere once a non-finite loss was back-propagated), so the forward is replayed on a
        copy at the weights from before it (the keeper's initial weights), on the last inputs
        (else the first kept ones, else the batch a traced loop drew). Every layer finite there,
        with finite targets: ``self._forward`` (:func:`~._util.forward_fields` of the model's
        output).
        """
        model = self._root() if self._root else None
        if model is None:
            return None
        layers = [layer for layer in getattr(model, "layers", [])]
        initial = self.keeper.initial_state if not self._steps else None
        x, y = self._replay_batch()
        probe = None
        if x is not None:
            try:
                probe = self._keras.Model(model.inputs, [layer.output for layer in layers])
                if initial is not None:  # the same graph at the weights the step started from
                    probe = self._keras.models.clone_model(probe)
                    probe.set_weights(initial)
            except Exception:  # noqa: BLE001 - a subclassed model has no symbolic outputs
                probe = None
        if probe is None or initial is None:  # the weights as the update left them
            for layer in layers:
                for w in layer.weights:
                    if not np.isfinite(np.asarray(w.numpy(), dtype=np.float64)).all():
                        return layer.name
        if probe is None:
            return None
        try:
            outs = probe(x, training=False)
        except Exception:  # noqa: BLE001 - inputs the copy cannot take
            return None
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        for layer, out in zip(layers, outs):
            arr = np.asarray(out)
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                return layer.name
        made = [i for i, layer in enumerate(layers)
                if any(layer.output is o for o in getattr(model, "outputs", None) or ())]
        if initial is not None and len(made) == 1 and _finite(y):  # one output, finite
            self._forward = forward_fields(outs[made[0]])
        return None

    def _replay_batch(self) -> tuple:
        """``(inputs, targets)`` of the batch to replay: the last, else one kept, else drawn."""
        x, y = self._last_x, getattr(self, "_last_y", None)
        if x is None or self._tf.is_tensor(x) and self._tf.is_symbolic_tensor(x):
            x, y = None, None
            if self.keeper.train_batches:
                (kept, y), = self.keeper.train_batches[:1]
                x = kept[0] if len(kept) == 1 else list(kept)
        if x is None and self._last_drawn is not None:  # a traced step: the batch drawn
            x, y = split_batch(self._last_drawn)
        return x, y
