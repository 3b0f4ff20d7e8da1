"""The Keras side of the interventions (:mod:`model_debugger.interventions`).

Each function ``f(params, keras) -> undo`` installs one change into the run when Keras is
imported, and returns what removes it. Model-level changes happen when ``fit`` starts (a custom
``tf.GradientTape`` loop gets the optimizer-level ones, at its first ``apply_gradients``).
"""

from __future__ import annotations

from collections.abc import Callable

from .capture.keras_util import fit_owner
from .interventions import removes as _removes

_SETTINGS = {"weight_decay": "weight_decay", "momentum": "momentum", "beta1": "beta_1"}


def _seen_set():
    """A set of objects seen in this run: weak where the objects allow it (ids are reused)."""
    import weakref

    class Seen:
        def __init__(self):
            self.weak, self.strong = weakref.WeakSet(), []

        def add(self, obj) -> bool:
            """True the first time ``obj`` is added."""
            try:
                if obj in self.weak:
                    return False
                self.weak.add(obj)
                return True
            except TypeError:  # not weak-referenceable: keep it alive instead
                if any(o is obj for o in self.strong):
                    return False
                self.strong.append(obj)
                return True

    return Seen()


def _retrace(model) -> None:
    """Drop a model's traced training step so the next ``fit`` traces the changed settings."""
    for attr in ("train_function", "test_function", "predict_function"):
        if getattr(model, attr, None) is not None:
            try:
                setattr(model, attr, None)
            except Exception:  # noqa: BLE001 - a model that guards the attribute
                pass


def _each_optimizer(keras, fn) -> Callable[[], None]:
    """Call ``fn(optimizer)`` once per optimizer.

    When ``fit`` starts (the model's traced step is dropped, so the change is traced in), or at
    its first ``apply_gradients`` in a custom loop (eagerly, even while a step is being traced).
    """
    import contextlib

    from .capture.patches import install

    seen = _seen_set()

    def once(opt) -> bool:
        opt = getattr(opt, "inner_optimizer", opt)  # a LossScaleOptimizer drives its inner one
        if opt is None or not seen.add(opt):  # first: a second trace must not change it again
            return False
        try:
            try:
                import tensorflow as tf

                eager = tf.init_scope()
            except ImportError:  # another Keras backend: nothing is being traced here
                eager = contextlib.nullcontext()
            with eager:
                fn(opt)
        except Exception:  # noqa: BLE001 - an intervention must never break the user's step
            return False
        return True

    def fit_factory(fit):
        def patched(model, *args, **kwargs):
            if once(getattr(model, "optimizer", None)):
                _retrace(model)
            return fit(model, *args, **kwargs)
        return patched

    def apply_factory(apply_gradients):
        def patched(opt, *args, **kwargs):
            once(opt)
            return apply_gradients(opt, *args, **kwargs)
        return patched

    return _removes([install(fit_owner(keras), "fit", fit_factory),
                     install(keras.optimizers.Optimizer, "apply_gradients", apply_factory)])


def _each_model(keras, fn) -> Callable[[], None]:
    """Call ``fn(model)`` once per model, when its first ``fit`` starts (then retraced)."""
    from .capture.patches import install

    seen = _seen_set()

    def factory(fit):
        def patched(model, *args, **kwargs):
            if seen.add(model):
                try:
                    fn(model)
                    _retrace(model)
                except Exception:  # noqa: BLE001 - an intervention must never break fit
                    pass
            return fit(model, *args, **kwargs)
        return patched

    return install(fit_owner(keras), "fit", factory)


def scale_lr(params: dict, keras) -> Callable[[], None]:
    """Multiply each optimizer's learning rate by ``factor`` (a schedule is left alone)."""
    factor = float(params["factor"])  # > 0: checked before the run

    def scale(opt) -> None:
        lr = getattr(opt, "_learning_rate", None)
        if hasattr(lr, "assign"):  # a variable, not a schedule object
            lr.assign(float(lr.numpy()) * factor)

    return _each_optimizer(keras, scale)


def optimizer_setting(params: dict, keras) -> Callable[[], None]:
    """Set one setting of every optimizer to ``params["value"]``.

    ``params["setting"]`` is ``weight_decay`` (0 turns it off), ``momentum`` or ``beta1``.
    """
    setting, value = params["setting"], float(params["value"])
    attr = _SETTINGS[setting]

    def change(opt) -> None:
        if setting == "weight_decay":
            opt.weight_decay = value or None
        elif hasattr(opt, attr):
            setattr(opt, attr, value)  # a plain attribute, read when the step is traced

    return _each_optimizer(keras, change)


def clip_off(params: dict, keras) -> Callable[[], None]:
    """No optimizer clips its gradients (``clipnorm``, ``global_clipnorm``, ``clipvalue``)."""
    def change(opt) -> None:
        for attr in ("clipnorm", "global_clipnorm", "clipvalue"):
            if getattr(opt, attr, None) is not None:
                setattr(opt, attr, None)

    return _each_optimizer(keras, change)


def dropout_off(params: dict, keras) -> Callable[[], None]:
    """Every ``Dropout`` layer, and every subclass with its own ``call``, passes its input on."""
    from .capture.patches import install

    def factory(call):
        def passthrough(layer, inputs, *args, **kwargs):
            return inputs
        return passthrough

    classes, stack = [], [keras.layers.Dropout]
    while stack:
        cls = stack.pop()
        if "call" in vars(cls):
            classes.append(cls)
        stack += cls.__subclasses__()
    return _removes([install(cls, "call", factory) for cls in classes])


def train_mode(params: dict, keras) -> Callable[[], None]:
    """A model that trains, called under a recording gradient tape, gets ``training=True``.

    A custom ``train_step`` calling ``self(x)`` (or a tape loop calling ``model(x)``) then runs
    its dropout and batch normalisation as in training; evaluation calls, with no tape
    recording, keep what they were given.
    """
    from tensorflow.python.eager import record

    from .capture.patches import install

    def factory(call):
        def training_call(model, *args, **kwargs):
            given = kwargs.get("training", args[1] if len(args) > 1 else None)
            if record.could_possibly_record() and given is not True and (
                    given is None or model.trainable_weights):  # (a frozen model's
                kwargs.pop("training", None)               # training=False stays)
                args = args[:1] + args[2:]
                kwargs["training"] = True
            return call(model, *args, **kwargs)
        return training_call

    return _removes([install(keras.Model, "__call__", factory)])


def unfreeze(params: dict, keras) -> Callable[[], None]:
    """Every layer of a model trains, set before its first ``fit``."""
    def thaw(model) -> None:
        model.trainable = True
        stack = list(getattr(model, "layers", []))
        while stack:
            layer = stack.pop()
            layer.trainable = True
            stack += list(getattr(layer, "layers", []))

    return _each_model(keras, thaw)


def default_init(params: dict, keras) -> Callable[[], None]:
    """Keras' default initialisation for every model, before its first ``fit``.

    Glorot kernels, orthogonal recurrent kernels, zero biases.
    """
    from .trainers.keras import KerasTrainer

    return _each_model(keras, KerasTrainer.default_init)


def standardize_inputs(params: dict, keras) -> Callable[[], None]:
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

    return install(fit_owner(keras), "fit", factory)


def shuffle(params: dict, keras) -> Callable[[], None]:
    """``fit`` shuffles the training data every epoch (``shuffle=True``, Keras' default).

    A ``tf.data`` dataset is batched before ``fit`` sees it, so its order is left as it is.
    """
    from .capture.patches import install

    def factory(fit):
        def patched(model, *args, **kwargs):
            if len(args) > 8:  # fit(x, y, batch_size, epochs, verbose, callbacks,
                args = (*args[:8], True, *args[9:])  # validation_split, validation_data, shuffle
            elif kwargs.get("shuffle") != "batch":
                kwargs["shuffle"] = True
            return fit(model, *args, **kwargs)
        return patched

    return install(fit_owner(keras), "fit", factory)


_LIBRARIES = ("tensorflow", "keras", "tf_keras", "model_debugger")


def _user_caller(frame):
    """The frame that called a TensorFlow op on the user's behalf, or None for a library's.

    Autograph's wrappers (a traced ``call``) are seen through; the first other frame decides.
    """
    from .capture.codeloc import is_user_file

    while frame is not None and \
            frame.f_globals.get("__name__", "").startswith("tensorflow.python.autograph"):
        frame = frame.f_back
    if frame is None or frame.f_globals.get("__name__", "").startswith(_LIBRARIES) or \
            not is_user_file(frame.f_code.co_filename):
        return None
    return frame


def graph_keeping_stop_gradient(original, sites: list | None = None, only=None) -> Callable:
    """A ``stop_gradient`` that keeps the graph where your code calls it.

    Only calls from the user's code (not the framework's) and, given ``only`` (a set of
    ``(file, line)``), only at those lines; their lines go to ``sites``. The op becomes an
    identity: the forward values are the same, gradients flow through.
    """
    import sys

    import tensorflow as tf

    @tf.autograph.experimental.do_not_convert
    def stop_gradient(x, *args, **kwargs):
        if _symbolic(x):  # building a functional model: its node passes on when it runs
            return original(x, *args, **kwargs)
        caller = _user_caller(sys._getframe(1))
        if caller is not None and (
                only is None or (caller.f_code.co_filename, caller.f_lineno) in only):
            if sites is not None:
                site = {"file": caller.f_code.co_filename, "line": caller.f_lineno}
                if site not in sites:
                    sites.append(site)
            return tf.identity(x)
        return original(x, *args, **kwargs)

    return stop_gradient


def _symbolic(x) -> bool:
    """Whether ``x`` is a Keras symbolic tensor (a functional model being built)."""
    try:
        import keras

        return isinstance(x, keras.KerasTensor)
    except (ImportError, AttributeError):
        return False


def stop_gradient_owners(keras) -> list:
    """The modules through which code calls ``stop_gradient``: ``tf`` and ``keras.ops``."""
    import tensorflow as tf

    return [m for m in (tf, getattr(keras, "ops", None)) if hasattr(m, "stop_gradient")]


def install_graph_keeping(keras, sites: list | None = None, only=None,
                          symbolic: list | None = None) -> list[Callable[[], None]]:
    """Install the graph-keeping ``stop_gradient``; return what removes it.

    The functions your code calls (``tf.stop_gradient``, ``keras.ops.stop_gradient``: see
    :func:`graph_keeping_stop_gradient`), and the ``StopGradient`` operation a functional
    model holds (``keras.ops.stop_gradient`` on a symbolic input makes one node of the graph;
    only user code builds such graphs, so every one passes its input on, whatever ``only``
    says). Each time such a node runs, ``symbolic`` (when given) gets a mark.
    """
    from .capture.patches import install

    undo = [install(owner, "stop_gradient",
                    lambda original: graph_keeping_stop_gradient(original, sites, only))
            for owner in stop_gradient_owners(keras)]
    try:
        from keras.src.ops.core import StopGradient
    except ImportError:  # another Keras layout: the functions only
        return undo

    def passthrough(call):
        def call_kept(op, variable, *args, **kwargs):
            if symbolic is not None and not symbolic:
                symbolic.append(True)
            return variable
        return call_kept

    return undo + [install(StopGradient, "call", passthrough)]


def keep_graph(params: dict, keras) -> Callable[[], None]:
    """``tf.stop_gradient`` / ``keras.ops.stop_gradient`` in your code keep the graph.

    ``params["sites"]`` (``[{"file", "line"}]``, from the finding) limits the function calls
    to those lines; a functional model's ``stop_gradient`` nodes all pass their input on.
    """
    sites = params.get("sites")
    only = {(s["file"], s["line"]) for s in sites} if sites else None
    return _removes(install_graph_keeping(keras, only=only))


def match_target_shape(params: dict, keras) -> Callable[[], None]:
    """A 1-D target given to ``fit`` becomes ``(N, 1)`` when the model's one output is ``(N, 1)``.

    A ``train_step`` that computes its own loss (``y - y_pred`` of shapes ``(B,)`` and
    ``(B, 1)``) then compares each prediction with its own target, not with every target of
    the batch. The validation targets get the same shape. Arrays only (a dataset keeps its
    shapes).
    """
    import numpy as np

    from .capture.patches import install

    def column(y):
        return y.reshape(-1, 1) if isinstance(y, np.ndarray) and y.ndim == 1 else y

    def first_row(x):
        if isinstance(x, dict):
            return {k: first_row(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(first_row(v) for v in x)
        return x[:1] if hasattr(x, "shape") else x

    def one_column_output(model, x) -> bool:
        try:
            out = model(first_row(x))  # one row (of each named input): never the whole set
        except Exception:  # noqa: BLE001 - cannot tell: leave the targets as they are
            return False
        shape = getattr(out, "shape", None)
        return shape is not None and len(shape) == 2 and shape[-1] == 1

    def factory(fit):
        def patched(model, x=None, y=None, *args, **kwargs):
            if isinstance(y, np.ndarray) and y.ndim == 1 and one_column_output(model, x):
                y = column(y)
                val = kwargs.get("validation_data")
                if isinstance(val, tuple) and len(val) >= 2:
                    kwargs["validation_data"] = (val[0], column(val[1]), *val[2:])
            return fit(model, x, y, *args, **kwargs)
        return patched

    return install(fit_owner(keras), "fit", factory)
