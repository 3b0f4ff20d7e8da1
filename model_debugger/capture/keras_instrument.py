"""Keras 3 (TensorFlow backend) instrumentation; every patch is a handle held by the
:class:`~.instrument.Instrument` base and undone when the capture closes.

The record has the same schema as the PyTorch instrument's (``step``, ``metric``, ``nonfinite``,
``ref``, ``model``, ``optimizer``, ``targets``), so signals and rules work unchanged. Patched while
a capture is active:

- ``Trainer.compile``: the compile line, the optimizer and the loss;
- ``TensorFlowTrainer.fit``: a recording callback (one ``step`` per batch, epoch metrics including
  ``val_*``), the fit line, the model and what fit received (for Isolate);
- ``TensorFlowTrainer.make_train_function``: the train function takes its batch from a timed
  ``next()`` (data wait: tf.data, generators, PyDataset), which also yields label statistics and
  sample batches;
- ``BaseOptimizer.apply`` (under ``apply_gradients``): per-variable gradient norms where Keras
  applies them. Inside a traced ``fit`` step the norms and the loss are written to a small variable
  read after each batch; in eager loops they are read directly; in ``tf.function`` custom loops
  they leave the graph through ``tf.py_function``;
- ``tf.GradientTape.gradient``: the loss (the tape's target) and the line computing gradients;
- ``BaseOptimizer.__init__``: where the optimizer was built.
"""

from __future__ import annotations

import math
import sys
import time
import weakref

import numpy as np

from ._util import num, rss_bytes
from .codeloc import assignment, definition_location, user_frame
from .instrument import Instrument
from .keras_hooks import FitHooks, LoopHooks
from .keras_keeper import KerasKeeper, LabelStats, describe_loss
from .keras_util import in_xla, initializing, layer_of, user_location
from .norms import MGN_MAX
from .norms import window as norms_window

_HYPER = ("momentum", "nesterov", "beta_1", "beta_2", "epsilon", "rho", "weight_decay",
          "clipnorm", "global_clipnorm", "clipvalue", "amsgrad")


class KerasInstrument(FitHooks, LoopHooks, Instrument):
    """Instruments Keras / TensorFlow training for one Recorder.

    Parameters
    ----------
    rec : Recorder
        Where the events go.
    """

    def __init__(self, rec) -> None:
        super().__init__(rec)
        self.keeper = KerasKeeper()
        self.labels = LabelStats()
        self._tf = None
        self._keras = None
        self._opt_locs: dict[int, dict] = {}
        self._opts: dict[int, weakref.ref] = {}
        self._models: dict[int, weakref.ref] = {}
        self._root = None
        self._layouts: dict[tuple, tuple] = {}
        self._stashes: dict[tuple, object] = {}
        self._current: tuple | None = None
        self._pending = None
        self._target = None
        self._call = None
        self._fitting = None
        self._stash_of: dict[int, tuple] = {}  # id(model) -> stash key of its traced fit step
        self._fit_depth = 0
        self._in_apply = False
        self._data_wait = 0.0
        self._last_step_end = None
        self._last_x = None
        self._nonfinite_seen = False
        self._epoch_base = 0
        self._steps = 0
        self._gpu = None
        self._mgn_at = 0  # where the next step's window of layer norms starts (norms.py)

    # -- attach / close --------------------------------------------------------------------
    def attach(self, name: str) -> None:
        """Patch what the imported module offers (``tensorflow`` or ``keras``), once each."""
        def ready(mod: str) -> bool:  # the module whose import just finished counts as ready
            return mod in sys.modules and (mod == name or not initializing(mod))

        if self._tf is None and ready("tensorflow"):
            self._attach_tf(sys.modules["tensorflow"])
        if self._keras is None and self._tf is not None and ready("keras"):
            self._attach_keras()

    def _attach_tf(self, tf) -> None:
        from tensorflow.python.eager import backprop

        self._tf = tf
        self.patch(backprop.GradientTape, "gradient",
                   lambda nxt: self._nograph(self._wrap_gradient(nxt)))

    def _attach_keras(self) -> None:
        import keras
        from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
        from keras.src.optimizers.base_optimizer import BaseOptimizer
        from keras.src.trainers.trainer import Trainer

        self._keras = keras
        self.patch(Trainer, "compile", self._wrap_compile)
        self.patch(TensorFlowTrainer, "fit", self._wrap_fit)
        self.patch(TensorFlowTrainer, "make_train_function", self._wrap_make_train)
        self.patch(BaseOptimizer, "__init__", self._wrap_opt_init)
        self.patch(BaseOptimizer, "apply", lambda nxt: self._nograph(self._wrap_apply(nxt)))
        self.patch(keras.Model, "__call__", self._wrap_model_call)
        self.patch(keras.losses.Loss, "__call__", self._wrap_loss_call)

    def _nograph(self, fn):
        return self._tf.autograph.experimental.do_not_convert(fn)

    def _let_go(self) -> None:
        """After every patch is gone (models trained under capture retrace without the probes):
        let go of the user's objects; what Isolate needs stays in :attr:`keeper`."""
        self._last_x = self._fitting = self._call = self._target = self._root = None
        self._pending = None
        self._models.clear()
        self._stashes.clear()

    def finish(self) -> None:
        """Flush what is pending when the capture ends."""
        if self._pending is not None:
            vec, layout = self._pending
            self._pending = None
            self._emit_from_vec(vec, layout)
        self._emit_targets()
        if self._steps:  # imported but not trained with (PyTorch did the training): say nothing
            self.rec.emit("calls", optimizer_steps=self._steps, backward=self._steps)

    def _emit_targets(self) -> None:
        data = self.labels.event()
        if data is not None:
            self.rec.emit("targets", **data)

    # -- compile / optimizer ---------------------------------------------------------------
    def _wrap_compile(self, original):
        link = self._link

        def compile(model, *args, **kwargs):
            out = original(model, *args, **kwargs)
            inst = link()
            if inst is not None:
                inst.guard(inst._after_compile)(model)
            return out

        compile.__wrapped__ = original
        return compile

    def _after_compile(self, model) -> None:
        loc = user_location(sys._getframe())
        self.ref("compile", loc)
        loss = describe_loss(getattr(model, "loss", None))
        if loss is not None:
            self.keeper.loss = loss
            self.labels.loss, self.labels.keras = loss["name"], loss["keras"]
        opt = getattr(model, "optimizer", None)
        if opt is not None:
            self._on_optimizer(opt, loc)

    def _wrap_opt_init(self, original):
        link = self._link

        def __init__(opt, *args, **kwargs):
            original(opt, *args, **kwargs)
            inst = link()
            if inst is not None and id(opt) not in inst._opt_locs:
                loc = user_location(sys._getframe())
                if loc is not None:
                    inst._opt_locs[id(opt)] = loc

        __init__.__wrapped__ = original
        return __init__

    def _on_optimizer(self, opt, fallback: dict | None) -> None:
        ref = self._opts.get(id(opt))
        if ref is not None and ref() is opt:
            return
        self._opts[id(opt)] = weakref.ref(opt)
        loc = self._opt_locs.get(id(opt)) or fallback
        hyper = self._hyper(opt)
        self.keeper.on_optimizer(opt, hyper)
        self.ref("optimizer", loc, cls=type(opt).__name__)
        self.rec.emit("optimizer", cls=type(opt).__name__, hyper=hyper, location=loc,
                      framework="keras")

    def _hyper(self, opt) -> dict:
        out: dict = {}
        with self._tf.init_scope():  # read variables eagerly even while a step is traced
            try:
                lr = opt.learning_rate
                out["lr"] = float(f"{float(lr.numpy() if hasattr(lr, 'numpy') else lr):.7g}")
            except Exception:  # noqa: BLE001 - a schedule that cannot be evaluated here
                pass
            try:
                config = opt.get_config()
            except Exception:  # noqa: BLE001
                config = {}
        for key in _HYPER:
            v = config.get(key)
            if isinstance(v, (int, float, bool)) and v is not None:
                out[key] = v
        return out

    # -- models ----------------------------------------------------------------------------
    def _discover_from_frame(self, model, frame) -> None:
        f = user_frame(frame)
        name, namespace = "model", None
        depth = 0
        while f is not None and depth < 8 and namespace is None:
            for scope in (f.f_locals, f.f_globals):
                hit = next((k for k, v in list(scope.items()) if v is model), None)
                if hit is not None:
                    name, namespace = hit, f.f_globals
                    break
            f, depth = f.f_back, depth + 1
        self._on_model(model, name, namespace)

    def _discover_from_variables(self, variables, frame) -> None:
        wanted = {id(v) for v in variables}
        model_cls = self._keras.Model
        best = None
        f = user_frame(frame)
        depth = 0
        while f is not None and depth < 8:
            for scope in (f.f_locals, f.f_globals):
                for name, obj in list(scope.items()):
                    if isinstance(obj, model_cls):
                        score = len(wanted.intersection(id(v) for v in obj.trainable_variables))
                        if score and (best is None or score > best[0]):
                            best = (score, name, obj, f.f_globals)
            f, depth = f.f_back, depth + 1
        if best is not None:
            self._on_model(best[2], best[1], best[3])

    def _on_model(self, model, name: str, namespace) -> None:
        if id(model) in self._models:
            return
        self._models[id(model)] = weakref.ref(model)
        self._root = weakref.ref(model)
        try:
            params = int(model.count_params()) if model.built else 0
        except Exception:  # noqa: BLE001
            params = 0
        modules = [layer.name for layer in getattr(model, "layers", []) if layer.weights]
        self.rec.emit("model", name=name, cls=type(model).__name__, params=params,
                      modules=modules[:500], training=True, framework="keras")
        self.ref("model", definition_location(model) or assignment(namespace, name), name=name)
        self.keeper.on_model(model, namespace)

    # -- gradients -------------------------------------------------------------------------
    def _wrap_gradient(self, original):
        link = self._link

        def gradient(tape, target, sources, *args, **kwargs):
            inst = link()
            if inst is not None:
                inst.guard(inst._on_gradient)(target)
            return original(tape, target, sources, *args, **kwargs)

        gradient.__wrapped__ = original
        return gradient

    def _on_gradient(self, target) -> None:
        tf = self._tf
        if isinstance(target, (tf.Tensor, tf.Variable)) and target.dtype.is_floating and \
                target.shape.rank is not None and target.shape.num_elements() == 1:
            self._target = target
            if not self._fit_depth:
                self.ref("backward", user_location(sys._getframe()))

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
                out = original(opt, grads, trainable_variables)
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
        if not pairs:
            return None
        frame = sys._getframe()
        if not self._fit_depth:
            self.ref("step", user_location(frame))
        if id(opt) not in self._opts:
            self._on_optimizer(opt, None)
        if not self._models:
            self._discover_from_variables([v for _, v in pairs], frame)
        key = tuple(id(v) for _, v in pairs)
        if key not in self._layouts:
            names: list[str] = []
            index = []
            for _, v in pairs:
                layer = layer_of(v)
                if layer not in names:
                    names.append(layer)
                index.append(names.index(layer))
            self._layouts[key] = (names, np.array(index))
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
        if not in_xla():
            link = self._link  # the py_function outlives the capture in TensorFlow's registry

            def step(v):
                inst = link()
                if inst is not None:
                    inst.guard(inst._emit_from_vec)(v.numpy(), layout)

            tf.py_function(step, [vec], [])
        return None

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
                self.rec.emit("nonfinite", step=self.rec.step, what="loss", value=str(loss),
                              module=self._localize(), replay=None)
            elif not math.isfinite(total):
                self._nonfinite_seen = True
                bad = [n for n, v in zip(names, per_layer) if not math.isfinite(v)]
                self.rec.emit("nonfinite", step=self.rec.step, what="grad", value=str(total),
                              module=bad[-1] if bad else None)
        self._emit_step(loss, total, mgn)

    def _emit_step(self, loss, gn, mgn) -> None:
        now = time.perf_counter()
        dt = now - self._last_step_end if self._last_step_end is not None else None
        self._last_step_end = now
        step = {"i": self.rec.step, "ep": self.rec.epoch, "loss": num(loss), "gn": num(gn),
                "dt": dt, "dw": self._data_wait, "rss": rss_bytes()}
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
        """The first layer holding non-finite weights, or producing non-finite output on the
        last batch (functional and Sequential models)."""
        model = self._root() if self._root else None
        if model is None:
            return None
        layers = [layer for layer in getattr(model, "layers", [])]
        for layer in layers:
            for w in layer.weights:
                if not np.isfinite(np.asarray(w.numpy(), dtype=np.float64)).all():
                    return layer.name
        if self._last_x is None:
            return None
        try:
            probe = self._keras.Model(model.inputs, [layer.output for layer in layers])
            outs = probe(self._last_x, training=False)
        except Exception:  # noqa: BLE001 - a subclassed model has no symbolic outputs
            return None
        for layer, out in zip(layers, outs if isinstance(outs, (list, tuple)) else [outs]):
            arr = np.asarray(out)
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                return layer.name
        return None
