"""Keras 3 (TensorFlow backend) instrumentation: one :class:`KerasInstrument` per Recorder.

It is built from one mixin per training style; every patch is a handle held by the
:class:`~.instrument.Instrument` base and undone when the capture closes.

The record has the same schema as the PyTorch instrument's (``step``, ``metric``, ``nonfinite``,
``ref``, ``model``, ``optimizer``, ``targets``), so signals and rules work unchanged. Patched while
a capture is active, and where it is handled:

- ``Trainer.compile`` (here): the compile line, the optimizer and the loss;
- ``BaseOptimizer.__init__`` (here): where the optimizer was built;
- ``TensorFlowTrainer.fit`` and ``make_train_function`` (:mod:`.keras_hooks`): a recording
  callback (one ``step`` per batch, epoch metrics including ``val_*``), the fit line, the model
  and what fit received (for Isolate); the train function takes its batch from a timed ``next()``
  (data wait: tf.data, generators, PyDataset), which also yields label statistics and sample
  batches;
- ``keras.Model.__call__`` and ``keras.losses.Loss.__call__`` (:mod:`.keras_hooks`): custom eager
  loops; ``tf.data`` iteration outside ``fit`` (``Dataset.__iter__``, ``OwnedIterator.__next__``)
  is their data wait; ``MeanMetricWrapper.update_state`` pairs an evaluation's inputs with its
  targets when a loop validates with a metric object and no loss;
- ``BaseOptimizer.apply`` and ``tf.GradientTape.gradient`` (:mod:`.keras_steps`): the loss,
  per-variable gradient norms where Keras applies them, one ``step`` event per apply.
"""

from __future__ import annotations

import sys
import weakref

from ._util import RateTrack
from .codeloc import assignment, definition_location, frame_span, user_frame
from .instrument import Instrument
from .keras_callbacks import CallbackTiming
from .keras_hooks import FitHooks, LoopHooks
from .keras_keeper import HeadStats, KerasKeeper, LabelStats, describe_heads, describe_loss
from .keras_steps import StepHooks
from .keras_util import initializing, user_location
from .passes import Passes

RATE_EVERY_FROM, RATE_EVERY = 200, 10  # the learning rate read at every step, then every 10th

# losses under which the output's range is read (regression, raw scores): signals.output_range
_BOUNDED_READ = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
                 "binary_cross_entropy_with_logits")
_HYPER = ("momentum", "nesterov", "beta_1", "beta_2", "epsilon", "rho", "weight_decay",
          "clipnorm", "global_clipnorm", "clipvalue", "amsgrad")


class KerasInstrument(FitHooks, CallbackTiming, LoopHooks, StepHooks, Instrument):
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
        self.heads: HeadStats | None = None  # a model with several outputs: one per output
        self._tf = None
        self._keras = None
        self._opt_locs: dict[int, dict] = {}
        self._opt_built: dict[int, float] = {}  # the rate an optimizer was built with (a number)
        self._opts: dict[int, weakref.ref] = {}
        self._models: dict[int, weakref.ref] = {}
        self._root = None
        self._layouts: dict[tuple, tuple] = {}
        self._updated: set[int] = set()  # ids of the variables some apply updated
        self._stashes: dict[tuple, object] = {}
        self._current: tuple | None = None
        self._pending = None
        self._target = None
        self._call = None
        self._call_depth = 0
        self._flag_pending: list = []  # forwards under a tape without training=True
        self._flag_checked: set[int] = set()  # the models such a forward was looked at for
        self._work_depth = 0  # model calls, tf.function calls, gradients, applies in progress
        self._work_t0 = 0.0  # when the outermost of them began
        self._work = 0.0  # seconds of the model's work since the last step (custom loops)
        self._loop: tuple | None = None  # (thread id, code) of the user's custom loop
        self._init_overhead()
        self._init_held()
        self._keep_gate = None  # a traced loop's batches leave the graph while this is True
        self._fitting = None
        self._stash_of: dict[int, tuple] = {}  # id(model) -> stash key of its traced fit step
        self._fit_depth = 0
        self._timed_batch = False  # the timed train function is running a batch it kept
        self._in_apply = False
        self._data_wait = 0.0
        self._last_step_end = None
        self._passes = Passes()  # batches drawn per pass over each dataset (custom loops)
        self._iterating: dict[int, tuple] = {}  # id(iterator) -> (its dataset's key, weakref)
        self._last_source = None  # the dataset of the last batch drawn in a custom loop
        self._last_drawn = None  # that batch
        self._last_y = None  # the targets of fit's last batch
        self._eval_losses: list = []  # (mean loss, rows) of a custom loop's evaluation batches
        self._unsized: list = []  # (weakref, name) of the models found, until each is built
        self._rates = RateTrack(rec)  # the optimizer's learning rate over the run (``lr``)
        self._rate_of = None  # weakref to the optimizer whose rate is followed
        self._last_x = None
        self._nonfinite_seen = False
        self._epoch_base = 0
        self._steps = 0
        self._gradients = 0  # tape.gradient calls on a scalar loss outside fit
        self._traces = 0  # traces of a custom loop's tf.function step (its applies in a graph)
        self._traced_at: dict | None = None  # the user's line that called it, last trace
        self._grad_traces = 0  # traces that took gradients while no optimizer applied any
        self._tapes_resumed = 0  # GradientTape entries that resumed a tape holding records
        self._tape_resumed_at: dict | None = None
        self._tapes_made = weakref.WeakKeyDictionary()  # persistent tape -> calling frames
        self._tapes_used = weakref.WeakSet()  # persistent tapes a gradient was taken from
        self._traced_gradients = 0  # gradients of a symbolic loss (in a tf.function trace)
        self._grad_traced_at: dict | None = None
        self._unapplied: list = []  # their losses while no optimizer has applied anything
        self._watched: list | None = None  # the first gradient's variables, values (keras_steps)
        self._several_columns = False  # a loss of its own over outputs of several columns
        self._grad_fns: set[int] = set()  # tf.functions whose trace took gradients
        self._eval_seen = False  # the first evaluation forward is referenced (eval_forward)
        self._init_args: dict[int, tuple] = {}  # id(model) -> (weakref, args, kwargs)
        self._gpu = None
        self._mgn_at = 0  # where the next step's window of layer norms starts (norms.py)
        self._fit_steps = 0  # the step count when the running fit began
        self._debug_seen = False  # a debug_mode event was written
        self._init_callbacks()

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
        from tensorflow.python.data.ops import dataset_ops, iterator_ops
        from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

        self.patch(backprop.GradientTape, "gradient",
                   lambda nxt: self._nograph(self._wrap_gradient(nxt)))
        self.patch(backprop.GradientTape, "__enter__",
                   lambda nxt: self._nograph(self._wrap_tape_enter(nxt)))
        self.patch(backprop.GradientTape, "__init__",
                   lambda nxt: self._nograph(self._wrap_tape_init(nxt)))
        self.patch(Function, "__call__", self._wrap_function_call)
        self.patch(dataset_ops.DatasetV2, "__iter__", self._wrap_data)
        self.patch(iterator_ops.OwnedIterator, "__next__", self._wrap_data)
        self.patch(dataset_ops.DatasetV2, "cache", self._wrap_cache)

    def _attach_keras(self) -> None:
        import keras
        from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
        from keras.src.metrics.reduction_metrics import MeanMetricWrapper
        from keras.src.optimizers.base_optimizer import BaseOptimizer
        from keras.src.trainers.trainer import Trainer

        self._keras = keras
        self.patch(Trainer, "compile", self._wrap_compile)
        self.patch(TensorFlowTrainer, "fit", self._wrap_fit)
        self._attach_callbacks()
        self.patch(TensorFlowTrainer, "make_train_function", self._wrap_make_train)
        self.patch(BaseOptimizer, "__init__", self._wrap_opt_init)
        self.patch(BaseOptimizer, "apply", lambda nxt: self._nograph(self._wrap_apply(nxt)))
        self.patch(keras.Model, "__call__", self._wrap_model_call)
        self.patch(keras.Model, "__new__", self._wrap_model_new)
        self.patch(keras.losses.Loss, "__call__", self._wrap_loss_call)
        self.patch(MeanMetricWrapper, "update_state", self._wrap_metric_update)

    def _wrap_model_new(self, original):
        """Remember the arguments a user's ``keras.Model`` subclass was built with.

        Keras cannot clone a subclassed model (``clone_model`` needs a registered class, and
        its automatic config may hold the constructor's defaults, not the arguments given):
        Isolate's copies call the class again with the same arguments instead.
        """
        link = self._link

        def __new__(cls, *args, **kwargs):
            obj = original(cls, *args, **kwargs)
            inst = link()
            if inst is not None and not cls.__module__.startswith("keras") and \
                    len(inst._init_args) < 64:
                inst._init_args[id(obj)] = (weakref.ref(obj), args, kwargs)
            return obj

        __new__.__wrapped__ = original
        return __new__

    def _nograph(self, fn):
        return self._tf.autograph.experimental.do_not_convert(fn)

    def _let_go(self) -> None:
        """After every patch is gone, let go of the user's objects.

        Models trained under capture retrace without the probes; what Isolate needs stays in
        :attr:`keeper`.
        """
        if self._keep_gate is not None:  # the user's traced step keeps the gate: shut it
            self._keep_gate.assign(False)
        self._last_x = self._fitting = self._call = self._target = self._root = None
        self._last_drawn = self._last_y = None
        self._keep_gate = None
        self._pending = None
        self._watched = None
        self._models.clear()
        self._stashes.clear()

    def finish(self) -> None:
        """Flush what is pending when the capture ends."""
        if self._pending is not None:
            vec, layout = self._pending
            self._pending = None
            self._emit_from_vec(vec, layout)
        self._emit_model(last=True)
        self._flush_eval()
        self._emit_targets()
        self._emit_train_flag()
        self._emit_overhead()
        passes = self._passes.event()
        if passes is not None:
            self.rec.emit("passes", **passes)
        self._emit_tape_kept()
        if self._traces:
            self.rec.emit("traces", count=self._traces, steps=self._steps,
                          **(self._traced_at or {}))
        elif self._grad_traces and not self._steps:  # a step that updates by hand, traced
            self.rec.emit("traces", count=self._grad_traces, steps=len(self._unapplied),
                          **(self._grad_traced_at or {}))
        if self._steps:  # imported but not trained with (PyTorch did the training): say nothing
            self.rec.emit("calls", optimizer_steps=self._steps, backward=self._steps)
        elif self._gradients:
            self._emit_unapplied()

    def _emit_targets(self) -> None:
        self._observe_outputs()
        data = self.labels.event()
        if data is not None:
            self.rec.emit("targets", **data)
        for head in self.heads.events() if self.heads is not None else ():
            self.rec.emit("head_targets", **head)
        values = self.labels.values_event()
        if values is not None:
            self.rec.emit("target_values", **values)

    def _observe_outputs(self) -> None:
        """The trained model's outputs on the kept training rows, for the output-range signal.

        Only under a regression loss or a loss on raw scores, where a bounded output (a sigmoid,
        a ReLU) can leave targets out of reach, or a ``train_step`` computing its own loss on
        numeric targets (``target_values``); each head of a multi-output model is read the
        same way. Never raises.
        """
        keeper, heads = self.keeper, self.heads
        bounded = self.labels.loss in _BOUNDED_READ or heads is not None and any(
            st.loss in _BOUNDED_READ for st in heads.stats.values()) or \
            self.labels.loss is None and self.labels.kept >= 2  # its own loss, numeric targets
        xs = keeper.train_batches[0][0] if keeper.train_batches else keeper.heads_x
        if not bounded or keeper.model is None or xs is None or self._several_columns:
            return  # (a loss of its own over several columns: read once, never again)
        link, target = self._link, self._link.target
        link.target = None  # our own call: every wrapper calls straight through
        try:
            rows = min(len(xs[0]), 512)
            x = xs[0][:rows] if len(xs) == 1 else [a[:rows] for a in xs]
            out = keeper.model(x, training=False)
            if not isinstance(out, (list, tuple, dict)):
                if self.labels.loss is None and (len(out.shape) > 2 or len(out.shape) == 2
                                                 and out.shape[-1] != 1):
                    self._several_columns = True  # classes, not one value a row
                    return
                self.labels.observe_outputs(out.numpy() if hasattr(out, "numpy") else out)
            elif heads is not None:
                heads.observe_outputs(out)
        except Exception:  # noqa: BLE001 - a statistic must never break the capture's end
            return
        finally:
            link.target = target

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
        self._on_heads(model)
        opt = getattr(model, "optimizer", None)
        if opt is not None:
            self._on_optimizer(opt, loc)

    def _on_heads(self, model) -> None:
        """Per-output target statistics for a compiled model with several outputs (once)."""
        if self.heads is not None:
            return
        out = getattr(model, "output", None) if getattr(model, "built", False) else None
        # a dict of outputs: Keras matches targets and losses by its keys, in sorted order
        names = sorted(map(str, out)) if isinstance(out, dict) else \
            list(getattr(model, "output_names", None) or ())
        heads = describe_heads(getattr(model, "loss", None), names)
        if heads:
            self.heads = HeadStats(heads, names)

    def _wrap_opt_init(self, original):
        link = self._link

        def __init__(opt, *args, **kwargs):
            original(opt, *args, **kwargs)
            inst = link()
            if inst is not None and id(opt) not in inst._opt_locs:
                loc = user_location(sys._getframe())
                if loc is not None:
                    inst._opt_locs[id(opt)] = loc
                    rate = kwargs.get("learning_rate", args[0] if args else None)
                    if isinstance(rate, (int, float)) and not isinstance(rate, bool) and \
                            type(opt).__name__ != "LossScaleOptimizer":  # (its own 0.0)
                        inst._opt_built[id(opt)] = float(rate)  # (not a schedule)

        __init__.__wrapped__ = original
        return __init__

    def _on_optimizer(self, opt, fallback: dict | None) -> None:
        ref = self._opts.get(id(opt))
        if ref is not None and ref() is opt:
            return
        self._opts[id(opt)] = weakref.ref(opt)
        self._rate_of = self._opts[id(opt)]
        loc = self._opt_locs.get(id(opt)) or fallback
        hyper, config = self._hyper(opt)
        built = self._opt_built.get(id(opt))
        if built is not None:  # what a rate written by hand later (a callback, an assign in
            hyper["lr_built"] = built  # the loop, maybe before the first step) departs from
        self.keeper.on_optimizer(opt, hyper, config)
        self.ref("optimizer", loc, cls=type(opt).__name__)
        self.rec.emit("optimizer", cls=type(opt).__name__, hyper=hyper, location=loc,
                      framework="keras")

    def _hyper(self, opt) -> tuple[dict, dict]:
        """The optimizer's rate and scalar settings, and its whole config, read eagerly.

        ``get_config`` reads variables with ``.numpy()``: inside a traced step (an optimizer
        first seen in ``apply_gradients`` of a ``tf.function``) it fails unless lifted out of
        the graph, and the copies would then train without the user's decay or clipping.
        """
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
        return out, config

    # -- models ----------------------------------------------------------------------------
    def _emit_model(self, last: bool = False) -> None:
        """The ``model`` events of the models found, each once it is built (its size known).

        ``last`` (the capture ends): the ones still unbuilt too, with 0 parameters.
        """
        pending, self._unsized = self._unsized, []
        for ref, name in pending:
            model = ref()
            if model is None:
                continue
            if not model.built and not last:
                self._unsized.append((ref, name))
                continue
            try:
                params = int(model.count_params()) if model.built else 0
            except Exception:  # noqa: BLE001
                params = 0
            modules = [layer.name for layer in getattr(model, "layers", []) if layer.weights]
            self.rec.emit("model", name=name, cls=type(model).__name__, params=params,
                          modules=modules[:500], training=True, framework="keras")

    def _note_rate(self) -> None:
        """The followed optimizer's learning rate now (a variable, or its schedule's value)."""
        opt = self._rate_of() if self._rate_of is not None else None
        if opt is None or self._rates.full or self.rec.step >= RATE_EVERY_FROM and \
                self.rec.step % RATE_EVERY:
            return  # (each read evaluates the schedule: every step early, then every 10th)
        try:
            with self._tf.init_scope():
                lr = opt.learning_rate
                self._rates.note(float(lr.numpy() if hasattr(lr, "numpy") else lr))
        except Exception:  # noqa: BLE001 - a rate that cannot be read here: no event
            return

    def _discover_from_frame(self, model, frame) -> None:
        f = user_frame(frame)
        name, namespace, span = "model", None, None
        depth = 0
        while f is not None and depth < 8 and namespace is None:
            for scope in (f.f_locals, f.f_globals):
                hit = next((k for k, v in list(scope.items()) if v is model), None)
                if hit is not None:
                    name, namespace, span = hit, f.f_globals, frame_span(f, scope)
                    break
            f, depth = f.f_back, depth + 1
        self._on_model(model, name, namespace, span)

    def _discover_from_variables(self, variables, frame) -> None:
        wanted = {id(v) for v in variables}
        model_cls = self._keras.Model
        best = None
        f = user_frame(frame)
        depth = 0
        while f is not None and depth < 8:
            for scope, attributes in ((f.f_locals, True), (f.f_globals, False)):
                for name, obj in _models_in(scope, model_cls, attributes):
                    # no variables (all frozen): the largest
                    score = len(wanted.intersection(id(v) for v in obj.trainable_variables)) \
                        if wanted else len(obj.weights)
                    if score and (best is None or score > best[0]):
                        best = (score, name, obj, f.f_globals, frame_span(f, scope))
            f, depth = f.f_back, depth + 1
        if best is not None:
            self._on_model(best[2], best[1], best[3], best[4])

    def _on_model(self, model, name: str, namespace, span=None) -> None:
        if id(model) in self._models:
            return
        self._models[id(model)] = weakref.ref(model)
        self._root = weakref.ref(model)
        self._unsized.append((weakref.ref(model), name))
        if model.built:  # (a subclassed model is built by its first call: sized at a step)
            self._emit_model()
        self.ref("model", definition_location(model) or assignment(namespace, name, span),
                 name=name)
        with self._tf.init_scope():  # found while a tf.function traces: read the weights eagerly
            self.keeper.on_model(model, namespace)
            made = self._init_args.get(id(model))
            if made is not None and made[0]() is model:
                self.keeper.init_args = made[1:]


def _models_in(scope: dict, model_cls, attributes: bool):
    """``(name, model)`` of the Keras models a scope holds.

    With ``attributes`` (a function's locals), also those held by its objects' attributes:
    a training class keeps its model as ``self.model``, and its ``train_step`` sees only
    ``self``.
    """
    for name, obj in list(scope.items()):
        if isinstance(obj, model_cls):
            yield name, obj
        elif attributes and not isinstance(obj, type) and \
                isinstance(getattr(obj, "__dict__", None), dict):
            for attr, value in list(vars(obj).items()):
                if isinstance(value, model_cls):
                    yield f"{name}.{attr}", value
