"""The Keras :class:`~model_debugger.trainers.Trainer`: clones of the user's model, trained.

Same protocol as :class:`~model_debugger.trainers.torch.TorchTrainer`: nothing touches the
user's objects; every probe trains ``keras.models.clone_model`` copies set to the weights captured
before the first step, with the user's optimizer class and config (or an override) and the
compiled loss. Inputs and targets are NumPy arrays. Keras is imported when a trainer is built.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from .base import SampleTrainer, dropped_calls, init_outlier

_CLIPS = ("clipnorm", "global_clipnorm", "clipvalue")


def from_keeper(keeper) -> KerasTrainer | None:
    """A trainer on a keeper's objects, or None for a model Keras cannot clone.

    The :class:`~model_debugger.capture.keras_keeper.KerasKeeper`'s validation data is read
    first.
    """
    keeper.materialise_validation()
    try:
        return KerasTrainer(keeper.model, keeper.initial_state, keeper.optimizer, keeper.loss,
                            keeper.train_batches, keeper.val_batches,
                            init_args=getattr(keeper, "init_args", None),
                            class_weight=getattr(keeper, "class_weight", None))
    except Exception:  # noqa: BLE001 - a model Keras cannot clone: record-only probes
        return None


class KerasTrainer(SampleTrainer):
    """Train and evaluate copies of a captured Keras model.

    Parameters
    ----------
    model : keras.Model
        The user's model (only cloned, never modified).
    initial_state : list of numpy arrays or None
        ``model.get_weights()`` taken before the first step.
    optimizer : dict
        ``{"cls": optimizer class, "hyper": {"lr": ...}, "config": get_config()}``.
    loss : dict
        :func:`~model_debugger.capture.keras_keeper.describe_loss` of the compiled loss.
    train_batches, val_batches : list of ((x, ...), y) NumPy pairs
    class_weight : list of float, optional
        ``fit``'s ``class_weight`` by class id: the copies train with it (``loss_kwargs``), and
        are evaluated without it, as ``fit`` validates.
    """

    framework = "keras"

    def __init__(self, model, initial_state, optimizer, loss, train_batches, val_batches=(),
                 init_args: tuple | None = None, class_weight: list | None = None):
        import keras

        self.model = model
        self.init_args = init_args  # (args, kwargs) of a subclassed model's constructor
        self.initial_state = initial_state
        self.opt_cls = optimizer.get("cls") or keras.optimizers.Adam
        self.config = dict(optimizer.get("config") or {})
        self.hyper = dict(optimizer.get("hyper") or {"lr": 1e-3})
        obj = loss.get("object")
        self.loss_obj = keras.losses.get(obj) if isinstance(obj, str) else obj
        # compile wraps a loss named by a string in a Loss object, which matches a (B,) target
        # to a (B, 1) output; a plain function the user calls broadcasts, as their run did
        self._match_rank = isinstance(obj, (str, keras.losses.Loss))
        self.loss_name = loss.get("name")
        self.loss_fn = _named(self.loss_obj, self.loss_name)
        # the compiled loss object carries its own options; fit's class weights are kept here
        self.loss_kwargs: dict = {} if class_weight is None else {
            "class_weight": np.asarray(class_weight, dtype=np.float32)}
        self.loss_input_shape = None
        self.inputs, self.targets = _stack(train_batches)
        self.val_inputs, self.val_targets = _stack(val_batches) if val_batches else (None, None)
        self._steps: dict = {}

    @property
    def adam(self):
        """The Adam class, for probes that train with a fixed, well-behaved optimizer."""
        import keras

        return keras.optimizers.Adam

    def fresh_model(self):
        """A clone of the model with its initial weights.

        ``keras.models.clone_model``; a subclassed model Keras cannot clone is built again by
        calling its class with the arguments the capture saw it built with.
        """
        import keras

        try:
            model = _clone(keras, self.model)
        except Exception:  # noqa: BLE001 - a subclass Keras cannot revive from its config
            if self.init_args is None:
                raise
            args, kwargs = self.init_args
            model = type(self.model)(*args, **kwargs)
        _finalize_adapted(model)
        if (not model.built or len(model.weights) != len(self.model.weights)) and \
                self.inputs is not None:  # (a clone after a Lambda is built only up to it)
            first = self._x(tuple(x[:1] for x in self.inputs))
            try:
                model(first)
            except Exception:  # noqa: BLE001 - a subclass builds its layers symbolically at
                _finalize_adapted(model)  # its first call: an adapted Normalization's statistics
                model(first)  # are then tensors of that scratch graph; derived again, eagerly
        if self.initial_state is not None:
            model.set_weights(self.initial_state)
            _finalize_adapted(model)  # the statistics just set, as the tensors the layer reads
        _same_trainable(self.model, model)
        return model

    def optimizer(self, model=None, lr: float | None = None, cls=None):
        """A new optimizer of the user's class and config (``lr`` overrides the rate)."""
        cls = cls or self.opt_cls
        config = {k: v for k, v in self.config.items() if k != "name"}
        config["learning_rate"] = float(lr if lr is not None else self.lr)
        try:
            return cls.from_config(config)
        except Exception:  # noqa: BLE001 - another optimizer class: only the rate carries over
            return cls(learning_rate=config["learning_rate"])

    def settings(self) -> dict:
        """The optimizer settings a probe may suspect, by framework-neutral name.

        ``weight_decay``, ``momentum``, ``beta1`` and ``clip`` (the tighter of the config's norm
        clips), None where the optimizer has none.
        """
        clips = [float(self.config[k]) for k in ("clipnorm", "global_clipnorm")
                 if self.config.get(k) is not None]  # clipvalue is per element: not a norm
        return {"weight_decay": self.config.get("weight_decay"),
                "momentum": self.config.get("momentum"), "beta1": self.config.get("beta_1"),
                "clip": min(clips) if clips else None}

    def with_settings(self, **changes) -> KerasTrainer:
        """A copy of the trainer with some of :meth:`settings` changed (``clip=None``: no clipping)."""
        import copy

        new = copy.copy(self)
        new.config, new._steps = dict(self.config), {}
        keys = {"weight_decay": "weight_decay", "momentum": "momentum", "beta1": "beta_1"}
        for name, value in changes.items():
            if name == "clip":  # one norm clip, or none at all
                new.config.update({k: None for k in _CLIPS}, clipnorm=value)
            elif name in keys:
                new.config[keys[name]] = value
            else:
                raise ValueError(f"unknown optimizer setting {name!r}")
        return new

    def init_outliers(self) -> dict[str, dict]:
        """Initial weights far from Keras' own initialisation (Glorot kernels, zero biases).

        See :func:`~model_debugger.trainers.base.init_outlier`; embeddings and normalisation
        weights are not judged.
        """
        model = self.fresh_model()
        out: dict[str, dict] = {}
        for var in model.weights:
            default = _default_value(var)
            if default is None:
                continue
            odd = init_outlier(np.asarray(var.numpy()), default)
            if odd is not None:
                out[getattr(var, "path", var.name)] = odd
        return out

    def float32_copy(self):
        """A fresh copy whose layers compute in float32, whatever the mixed-precision policy.

        Sequential and functional models are cloned layer by layer with ``dtype="float32"``; a
        subclassed model is built again from the arguments the capture saw, under the
        ``float32`` global policy (its layers take the policy when made). None when neither
        can be done.
        """
        import keras

        try:
            if _graph_model(keras, self.model):
                model = _clone(keras, self.model, dtype="float32")
            elif self.init_args is not None:
                policy = keras.mixed_precision.global_policy()
                keras.mixed_precision.set_global_policy("float32")
                try:
                    args, kwargs = self.init_args
                    model = type(self.model)(*args, **kwargs)
                finally:
                    keras.mixed_precision.set_global_policy(policy)
            else:
                return None
            if not model.built and self.inputs is not None:
                model(self._x(tuple(x[:1] for x in self.inputs)))
            if self.initial_state is not None:
                model.set_weights(self.initial_state)
        except Exception:  # noqa: BLE001 - a model Keras cannot rebuild this way
            return None
        return model

    @staticmethod
    def default_init(model):
        """Give ``model`` (a clone) Keras' default initialisation; returns it."""
        for i, var in enumerate(model.weights):
            default = _default_value(var, seed=i)
            if default is not None:
                var.assign(default.astype(np.dtype(var.dtype)))
        return model

    def subset(self, idx):
        """``(inputs, target)`` rows ``idx`` of the training sample."""
        idx = np.asarray(idx) if not isinstance(idx, slice) else idx
        return tuple(x[idx] for x in self.inputs), self.targets[idx]

    def randperm(self, n: int, seed: int) -> np.ndarray:
        """A seeded permutation of ``range(n)`` (row indices for :meth:`subset`)."""
        return np.random.default_rng(seed).permutation(n)

    def _x(self, inputs):
        """The model's call argument: one array, a list, or a dict for named dict inputs.

        A functional model built on a dict of inputs (``keras.Model({"num": a, "plan": b},
        out)``) takes them by name: the kept tuple is in ``model.inputs`` order (the keeper's
        :meth:`~model_debugger.capture.keras_keeper.KerasKeeper.positional`), which need not
        be the order the dict was written in.
        """
        if len(inputs) == 1:
            return inputs[0]
        struct = getattr(self.model, "_inputs_struct", None)
        if isinstance(struct, dict):  # model.inputs is that struct flattened: packed back
            import keras

            return keras.tree.pack_sequence_as(struct, list(inputs))
        return list(inputs)

    def _loss(self, model, inputs, target, training: bool):
        import tensorflow as tf

        out = model(self._x(inputs), training=training)
        if self._match_rank:
            target = _same_rank(target, out)
        weights = self.loss_kwargs.get("class_weight")
        if training and weights is not None:  # as fit weighs each row by its class
            onehot = target.shape.rank == 2 and target.shape[-1] not in (None, 1)  # static
            ids = tf.argmax(target, axis=1) if onehot else \
                tf.cast(tf.round(tf.reshape(target, [-1])), tf.int64)
            rows = tf.gather(weights, tf.clip_by_value(ids, 0, len(weights) - 1))
            if hasattr(self.loss_obj, "reduction"):  # a Loss object weighs its own rows
                return tf.reduce_mean(self.loss_obj(target, out, sample_weight=rows))
            values = self.loss_obj(target, out)  # a function: one value per row (or more)
            rows = tf.reshape(rows, [-1] + [1] * (len(values.shape) - 1))
            return tf.reduce_mean(values * tf.cast(rows, values.dtype))
        return tf.reduce_mean(self.loss_obj(target, out))

    def without_loss_weights(self) -> KerasTrainer:
        """A copy of the trainer whose copies train without ``fit``'s class weights."""
        new = copy.copy(self)
        new.loss_kwargs = {k: v for k, v in self.loss_kwargs.items() if k != "class_weight"}
        new._steps = {}  # (a traced step holds the trainer it was traced for)
        return new

    def _step_fn(self, model, opt):
        import tensorflow as tf

        variables = model.trainable_variables

        @tf.function(reduce_retracing=True)
        def step(inputs, target):
            with tf.GradientTape() as tape:
                loss = self._loss(model, inputs, target, True)
            grads = tape.gradient(loss, variables)
            if variables:  # a copy as set up may have every layer frozen: nothing to update
                opt.apply_gradients(zip(grads, variables))
            return loss

        return step

    def _cached_step(self, model, lr, opt_cls):
        """One optimizer and traced step per (model, rate, class).

        Fitting the same copy again continues with its optimizer state and costs no new trace.
        """
        key = (id(model), lr, opt_cls)
        cached = self._steps.get(key)
        if cached is None or cached[0]() is not model:
            import weakref

            if len(self._steps) > 32:
                self._steps.clear()
            opt = self.optimizer(model, lr, opt_cls)
            cached = self._steps[key] = (weakref.ref(model), self._step_fn(model, opt))
        return cached[1]

    def fit(self, model, inputs, target, steps: int, lr: float | None = None, batch_size: int = 64,
            seed: int = 0, opt_cls=None, stop_below: float | None = None,
            check=None, every: int = 10, shuffle: bool = True) -> list[float]:
        """Train ``model`` in place for ``steps`` minibatch steps; return the loss per step.

        Stops early when the loss is non-finite or below ``stop_below``. ``check(model)``, when
        given, is called every ``every`` steps and after the last one (to watch held-out rows).
        With ``shuffle=False`` the batches are consecutive rows in their given order, over and
        over (a loader that never shuffles).
        """
        rng = np.random.default_rng(seed)
        step = self._cached_step(model, lr, opt_cls)
        n = int(target.shape[0])
        losses: list[float] = []
        for i in range(steps):
            self.on_time()
            if n <= batch_size:
                idx = slice(None)
            elif shuffle:
                idx = rng.permutation(n)[:batch_size]
            else:
                idx = np.arange(i * batch_size, (i + 1) * batch_size) % n
            value = float(step(tuple(x[idx] for x in inputs), target[idx]))
            losses.append(value)
            if not math.isfinite(value) or (stop_below is not None and value < stop_below):
                break
            if check is not None and (len(losses) % every == 0 or len(losses) == steps):
                check(model)
        return losses

    def sweep(self, lr_min: float, lr_max: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """A geometric learning-rate sweep: rates and smoothed losses.

        As :meth:`TorchTrainer.sweep <model_debugger.trainers.torch.TorchTrainer.sweep>`.
        """
        model = self.fresh_model()
        opt = self.optimizer(model, lr_min)
        rng = np.random.default_rng(0)
        lrs = np.geomspace(lr_min, lr_max, self.steps_within(steps, floor=60))
        step = self._step_fn(model, opt)
        losses, smooth = [], None
        for lr in lrs:
            self.on_time()
            opt.learning_rate = float(lr)  # assigns the optimizer's variable: no retrace
            inputs, target = self.subset(rng.permutation(self.n)[:64])
            value = float(step(inputs, target))  # the loss before this update
            if not math.isfinite(value):
                losses.append(math.inf)
                break
            smooth = value if smooth is None else 0.8 * smooth + 0.2 * value
            losses.append(smooth)
            if smooth > 4 * min(losses):
                break
        return lrs[:len(losses)], np.array(losses)

    warm_up = True  # a Keras step traces on its first call

    def param_count(self) -> int:
        """Parameters of the model."""
        return int(self.model.count_params())

    def frozen_share(self) -> float:
        """Share of the model's weights (by count) in layers that do not train.

        Normalisation statistics (``moving_mean``/``moving_variance``) never train and are not
        counted.
        """
        total = frozen = 0
        for layer in _leaves(self.model):
            size = sum(int(np.prod(w.shape)) for w in layer.weights
                       if "moving" not in getattr(w, "path", getattr(w, "name", "")))
            total += size
            frozen += 0 if layer.trainable else size
        return frozen / total if total else 0.0

    def dropout_rates(self) -> dict[str, float]:
        """The rate of every ``Dropout`` layer, by layer name."""
        import keras

        return {layer.name: float(layer.rate) for layer in _leaves(self.model)
                if isinstance(layer, keras.layers.Dropout)}

    @staticmethod
    def unfreeze(model):
        """Make every layer of ``model`` (a clone, not yet trained) train; returns it."""
        for layer in _leaves(model):
            layer.trainable = True
        model.trainable = True
        return model

    @staticmethod
    def without_dropout(model):
        """Set every ``Dropout`` of ``model`` (a clone, not yet trained) to rate 0; returns it."""
        import keras

        for layer in _leaves(model):
            if isinstance(layer, keras.layers.Dropout):
                layer.rate = 0.0
        return model

    def linear_chains(self) -> list[tuple[str, str]]:
        """Pairs of affine layers (``Dense``, ``Conv*D`` without activation) feeding another one.

        With nothing between them but dropout, a flatten, a batch norm, an average pool or a
        linear ``Activation``: two affine maps in a row are one, so the first adds no capacity.
        Read from the graph of a Sequential or functional model (each layer's input and the
        layer that made it; a layer called more than once, shared, has several inputs and is
        not read); a subclassed model has no graph: one forward pass of a fresh copy is
        traced by the tensors each layer's ``call`` got and gave (an activation applied in
        ``call`` makes a new tensor and breaks the chain).

        Returns
        -------
        list of (str, str)
            Layer names, each pair once.
        """
        import keras

        if not _graph_model(keras, self.model):
            return self._traced_chains()
        passing = _passing(keras)

        def single_input(layer):
            if len(getattr(layer, "_inbound_nodes", ())) != 1:
                return None  # shared, or never called in a graph
            try:
                return layer.input
            except (AttributeError, ValueError, RuntimeError):
                return None

        pairs = []
        for layer in _leaves(self.model):
            if not isinstance(layer, _affine(keras)):
                continue
            made = layer
            tensor = single_input(layer)
            while tensor is not None:
                made = getattr(getattr(tensor, "_keras_history", None), "operation", None)
                if not _passes(keras, made, passing):
                    break
                tensor = single_input(made)
            if made is not layer and isinstance(made, _affine(keras)) and \
                    _starts_chain(keras, made) and len(made._inbound_nodes) == 1:
                pairs.append((made.name, layer.name))
        return list(dict.fromkeys(pairs))

    def _traced_chains(self) -> list[tuple[str, str]]:
        """:meth:`linear_chains` of a subclassed model, from one forward pass of a fresh copy."""
        import keras

        model, passing = self.fresh_model(), _passing(keras)
        leaves, own = _leaves(model), [layer.name for layer in _leaves(self.model)]
        if len(leaves) != len(own):
            return []
        named = {id(layer): name for layer, name in zip(leaves, own, strict=True)}  # (a
        # subclass built again names its layers anew: the pairs name the user's layers)
        made: dict[int, str] = {}  # id of a tensor -> the affine layer behind it
        alive: list = []  # every tensor stays alive during the pass: an id names one
        pairs: list[tuple[str, str]] = []

        def traced(layer, call):
            def wrapper(*args, **kwargs):
                out = call(*args, **kwargs)
                source = made.get(id(args[0])) if args else None
                alive.extend((args[0] if args else None, out))
                if isinstance(layer, _affine(keras)):
                    if source is not None:
                        pairs.append((source, named[id(layer)]))
                    if _starts_chain(keras, layer):
                        made[id(out)] = named[id(layer)]
                elif source is not None and _passes(keras, layer, passing):
                    made[id(out)] = source
                return out
            return wrapper

        users = {id(layer) for layer in _leaves(self.model)}
        if any(id(layer) in users for layer in leaves):
            return []  # the copy shares layers with the user's model (a layer given to the
            # constructor): a wrapper on them would be on the user's model too
        own = [(layer, vars(layer).get("call")) for layer in leaves]  # (an instance's own)
        try:
            for layer in leaves:
                layer.call = traced(layer, layer.call)
            model(self._x(tuple(x[:4] for x in self.inputs)), training=False)
        finally:
            for layer, call in own:
                if call is None:
                    vars(layer).pop("call", None)
                else:
                    vars(layer)["call"] = call
        return list(dict.fromkeys(pairs))

    def discarded_outputs(self) -> list[dict]:
        """Layers whose output ``call`` throws away while their input goes on.

        ``self.drop(x, training=training)`` written without ``x =``. A Sequential or
        functional model holds only the layers on its graph; a subclassed one is read from
        one forward pass of a fresh copy in training mode on a few rows, under a gradient
        tape: the gradient of every tensor the model returns reaches a layer's input but
        none of its outputs, at every call (see the PyTorch trainer's).

        Returns
        -------
        list of dict
            ``{"layer": the user's layer name, "kind": its class, "where": the user's line
            that called it, or None}``.
        """
        import keras
        import tensorflow as tf

        from ..capture.codeloc import user_location

        if _graph_model(keras, self.model):
            return []
        model = self.fresh_model()
        leaves, own = _leaves(model), [layer.name for layer in _leaves(self.model)]
        users = {id(layer) for layer in _leaves(self.model)}
        if len(leaves) != len(own) or any(id(layer) in users for layer in leaves):
            return []  # (see _traced_chains)
        named = {id(layer): name for layer, name in zip(leaves, own, strict=True)}
        calls: list[tuple[str, str, list, list, dict | None]] = []

        def floats(value):
            return [t for t in tf.nest.flatten(value)
                    if tf.is_tensor(t) and t.dtype.is_floating]

        with tf.GradientTape(persistent=True) as tape:
            def traced(layer, call):
                def wrapper(*args, **kwargs):
                    ins = floats((args, kwargs))
                    tape.watch(ins)
                    out = call(*args, **kwargs)
                    outs = [t for t in floats(out) if not any(t is i for i in ins)]
                    if outs:
                        tape.watch(outs)
                        calls.append((named[id(layer)], type(layer).__name__, ins, outs,
                                      user_location()))
                    return out
                return wrapper

            kept = [(layer, vars(layer).get("call")) for layer in leaves]
            try:
                for layer in leaves:
                    layer.call = traced(layer, layer.call)
                rows = [tf.convert_to_tensor(x[:4]) for x in self.inputs]
                tape.watch(floats(rows))
                returned = floats(model(self._x(tuple(rows)), training=True))
            finally:
                for layer, call in kept:
                    if call is None:
                        vars(layer).pop("call", None)
                    else:
                        vars(layer)["call"] = call
            total = tf.add_n([tf.reduce_sum(tf.cast(t, "float32")) for t in returned]) \
                if returned else None
        watched = list({id(t): t for c in calls for t in (*c[2], *c[3])}.values())
        if total is None or not watched:
            return []
        grads = tape.gradient(total, watched)
        return dropped_calls(calls, {id(t) for t, g in zip(watched, grads, strict=True)
                                     if g is not None})

    def passing_on(self, names):
        """``change(model)``: the output of each layer named in ``names`` is passed on.

        What ``x = self.drop(x)`` would do for a ``call`` that writes ``self.drop(x)``: every
        layer called later in the pass with the very tensor such a layer was given gets that
        layer's output instead. The layers are found in the copy at the positions the user's
        model holds them; raises ValueError when the copy does not hold each of them.
        """
        held = self._held_at(names)

        def change(model):
            leaves, found = _leaves(model), held(model)
            targets = {id(layer) for layer in found}
            given: list[tuple] = []  # (the tensor a named layer got, what it gave)

            def wrapped(layer, call):
                def wrapper(*args, **kwargs):
                    if id(layer) in targets:
                        out = call(*args, **kwargs)
                        if args:
                            given.append((args[0], out))
                        return out
                    if args:
                        for was, out in given:
                            if args[0] is was:
                                args = (out, *args[1:])
                                break
                    return call(*args, **kwargs)
                return wrapper

            for layer in leaves:
                layer.call = wrapped(layer, layer.call)
            return model
        return change

    def _held_at(self, names):
        """``held(model)``: the layers of a copy at the positions the user's model holds ``names``.

        A subclass built again names its layers anew. ``held`` raises ValueError when the copy
        does not hold each of them (nothing would change).
        """
        at = [i for i, layer in enumerate(_leaves(self.model)) if layer.name in names]

        def held(model):
            leaves = _leaves(model)
            found = [leaves[i] for i in at if i < len(leaves)]
            if len(at) != len(names) or len(found) != len(names):
                raise ValueError(f"the clone has {len(found)} of the layers {sorted(names)}")
            return found
        return held

    def linear_layers(self) -> list[str]:
        """The names of the model's affine layers (``Dense``, ``Conv*D``), in definition order."""
        import keras

        return [layer.name for layer in _leaves(self.model)
                if isinstance(layer, _affine(keras))]

    def with_activations(self, names):
        """``change(model)``: a ReLU on the output of each affine layer named in ``names``.

        The layers are found in the copy at the positions the user's model holds them (a
        subclass built again names its layers anew). Raises ValueError when the copy does not
        hold each of them (nothing would change).
        """
        held = self._held_at(names)

        def change(model):
            import keras

            for layer in held(model):
                layer.activation = keras.activations.relu
            return model
        return change

    def param_bytes(self) -> int:
        """Bytes of the model's weights."""
        return int(sum(np.prod(w.shape) * np.dtype(w.dtype).itemsize
                       for w in self.model.weights))

    def per_sample_bytes(self, inputs) -> float:
        """Bytes of inputs plus every layer output per sample.

        Every layer output for functional and Sequential models; otherwise inputs and the model
        output only.
        """
        import keras

        model = self.fresh_model()
        total = sum(x.nbytes for x in inputs)
        try:
            layers = [layer for layer in model.layers if not isinstance(layer, keras.InputLayer)]
            outs = keras.Model(model.inputs, [layer.output for layer in layers])(
                self._x(inputs), training=False)
        except Exception:  # noqa: BLE001 - a subclassed model has no symbolic layer outputs
            outs = [model(self._x(inputs), training=False)]
        for out in outs if isinstance(outs, (list, tuple)) else [outs]:
            total += np.asarray(out).nbytes
        return total / max(int(inputs[0].shape[0]), 1)

    def predict(self, model, inputs) -> np.ndarray:
        """``model``'s outputs on ``inputs`` in inference mode (the first, for several)."""
        out = model(self._x(inputs), training=False)
        if isinstance(out, dict):
            out = next(iter(out.values()))
        elif isinstance(out, (list, tuple)):
            out = out[0]
        return np.asarray(out, dtype=np.float64)

    def evaluate(self, model, inputs, target) -> float:
        """Mean loss of ``model`` on the given rows (inference mode)."""
        return float(self._loss(model, inputs, target, False))


def _default_value(var, seed: int = 0) -> np.ndarray | None:
    """A Keras default initial value for a kernel or bias, or None for other weights.

    Glorot-uniform kernels, orthogonal recurrent kernels, zero biases: what ``Dense``, the
    convolutions and the recurrent layers use unless told otherwise.
    """
    import keras

    name = str(getattr(var, "path", var.name)).rsplit("/", 1)[-1]
    shape = tuple(int(d) for d in var.shape)
    if name == "kernel" and len(shape) >= 2:
        init = keras.initializers.GlorotUniform(seed=seed)
    elif name == "recurrent_kernel" and len(shape) == 2:
        init = keras.initializers.Orthogonal(seed=seed)
    elif name == "bias" and len(shape) == 1:
        return np.zeros(shape, dtype="float32")
    else:
        return None
    return np.asarray(init(shape), dtype="float32")


def _affine(keras) -> tuple:
    """The Keras layers that compute an affine map (before their own activation)."""
    layers = keras.layers
    return (layers.Dense, layers.Conv1D, layers.Conv2D, layers.Conv3D)


def _starts_chain(keras, layer) -> bool:
    """Whether an affine layer without activation is suspect (see the PyTorch trainer's).

    Not a grouped convolution nor one that narrows the channels (a linear bottleneck).
    """
    if not _linear(layer.activation):
        return False
    if isinstance(layer, keras.layers.Dense):
        return True
    kernel = getattr(layer, "kernel", None)
    groups = getattr(layer, "groups", 1) or 1
    channels_in = int(kernel.shape[-2]) * groups if kernel is not None else None
    return groups == 1 and (channels_in is None or layer.filters >= channels_in)


def _passing(keras) -> tuple:
    """Layers an affine map passes through and stays affine."""
    layers = keras.layers
    return (layers.Dropout, layers.Flatten, layers.BatchNormalization, layers.Reshape,
            layers.AveragePooling1D, layers.AveragePooling2D, layers.AveragePooling3D,
            layers.GlobalAveragePooling1D, layers.GlobalAveragePooling2D,
            layers.GlobalAveragePooling3D)


def _passes(keras, layer, passing) -> bool:
    """Whether ``layer`` keeps an affine map affine (a passing layer, a linear ``Activation``)."""
    return isinstance(layer, passing) or (isinstance(layer, keras.layers.Activation)
                                          and _linear(layer.activation))


def _linear(activation) -> bool:
    """Whether a Keras activation is the identity (``None``, ``"linear"``)."""
    return activation is None or getattr(activation, "__name__", "") == "linear"


def _leaves(model) -> list:
    """The layers of a (nested) Keras model that hold no layers themselves."""
    out, stack = [], list(getattr(model, "layers", []))
    while stack:
        layer = stack.pop(0)
        inner = getattr(layer, "layers", None)
        if inner:
            stack[:0] = list(inner)
        else:
            out.append(layer)
    return out


def _named(obj, name):
    """The loss callable, named like the PyTorch functional it corresponds to (for baselines)."""
    def loss_fn(target, output):
        return obj(target, output)

    loss_fn.__name__ = name or getattr(obj, "__name__", "loss")
    return loss_fn


def _stack(batches):
    """Concatenate ``[((x, ...), y), ...]`` NumPy pairs whose shapes match the first one."""
    batches = [(i, t) for i, t in batches if t is not None and np.ndim(t) > 0]
    if not batches:
        return None, None
    first_in, first_t = batches[0]
    keep = [(i, t) for i, t in batches
            if len(i) == len(first_in) and t.shape[1:] == first_t.shape[1:]
            and all(a.shape[1:] == b.shape[1:] for a, b in zip(i, first_in))]
    inputs = tuple(np.concatenate([i[k] for i, _ in keep]) for k in range(len(first_in)))
    return _finite_rows(inputs, np.concatenate([t for _, t in keep]))


def _finite_rows(inputs: tuple, target):
    """The rows whose inputs and target hold only finite values (all rows when none does).

    A row with a NaN or inf makes every experiment on the sample diverge at any rate or
    architecture: that is the data's finding (``nonfinite_inputs``), not the model's. Non-finite
    values in every row are kept (an additive mask holds ``-inf`` by design).
    """
    ok = np.ones(len(target), dtype=bool)
    for a in (*inputs, target):
        a = np.asarray(a)
        if len(a) == len(target) and np.issubdtype(a.dtype, np.inexact):
            ok &= np.isfinite(a.reshape(len(a), -1)).all(1)
    if ok.all() or not ok.any():  # every row: inf by design (a padding mask)
        return inputs, target
    return tuple(a[ok] if len(a) == len(target) else a for a in inputs), target[ok]


def _same_rank(target, out):
    """``target`` with the rank of ``out`` where one is the other with a trailing axis of 1.

    What Keras' own loss objects do (a ``(B,)`` target against a ``(B, 1)`` output); a loss
    given as a plain function (``keras.losses.get("binary_crossentropy")``) does not.
    """
    t_rank, o_rank = len(target.shape), len(out.shape)
    if t_rank == o_rank - 1 and out.shape[-1] == 1:
        return target[..., None]
    if t_rank == o_rank + 1 and target.shape[-1] == 1:
        return target[..., 0]
    return target


def _same_trainable(original, copy) -> None:
    """Give ``copy``'s layers the ``trainable`` flags of ``original``'s (a copy "as set up").

    A clone, or a subclass built again from its arguments, starts with every layer trainable;
    the user may have frozen some after building.
    """
    mine = [original, *original._flatten_layers(include_self=False, recursive=True)]
    theirs = [copy, *copy._flatten_layers(include_self=False, recursive=True)]
    if len(mine) != len(theirs):
        return
    for a, b in zip(mine, theirs):
        if type(a) is type(b) and b.trainable != a.trainable:
            b.trainable = a.trainable



def _finalize_adapted(model) -> None:
    """Recompute a ``Normalization``'s statistics eagerly (its ``finalize_state``).

    A clone builds its layers symbolically: a ``Normalization`` adapted in the user's model
    then holds its mean and variance as tensors of that scratch graph, "out of scope" at the
    first real call. ``finalize_state`` derives them again from the layer's variables (which
    ``set_weights`` restores), as Keras does after ``adapt``.
    """
    import keras

    for layer in model._flatten_layers(include_self=False, recursive=True):
        # (a Discretization's boundaries come from an adapt summary a clone lacks: not these)
        if layer.built and isinstance(layer, keras.layers.Normalization) and \
                callable(getattr(layer, "finalize_state", None)):
            try:
                layer.finalize_state()
            except Exception:  # noqa: BLE001 - never adapted (no statistics): as built
                pass


def _graph_model(keras, model) -> bool:
    """A Sequential or functional model (layers Keras can clone one by one)."""
    return isinstance(model, keras.Sequential) or type(model).__name__ == "Functional" or \
        getattr(model, "_is_graph_network", False)


def _clone(keras, model, dtype: str | None = None):
    """``keras.models.clone_model``, a Sequential or functional model's Lambdas keeping their function.

    Keras takes a ``clone_function`` (:func:`_clone_layer`) for those only: a subclassed model
    is cloned from its config, as before. ``dtype``: every cloned layer computes in it.
    """
    def clone():
        if _graph_model(keras, model):
            return keras.models.clone_model(
                model, clone_function=lambda layer: _clone_layer(layer, dtype))
        return keras.models.clone_model(model)

    try:
        return clone()
    except TypeError:
        if not getattr(model, "compiled", False):
            raise
    # Keras compiles a clone of a compiled model from its compile config, which names a loss
    # or metric written as a plain function ("Could not locate function 'gaussian_nll'"):
    # copies train with the trainer's own step, so the clone is made uncompiled
    model.compiled = False
    try:
        return clone()
    finally:
        model.compiled = True


def _clone_layer(layer, dtype: str | None = None):
    """A new layer of the same config; a ``Lambda`` keeps its function object.

    Keras rebuilds a ``Lambda`` from its config by unmarshalling the function's bytecode,
    which safe mode refuses and which loses the function's globals (``keras`` itself in
    ``lambda t: keras.ops.stop_gradient(t)``); the function here is the user's own, already
    running in this process, so the clone shares it.
    """
    import keras

    if isinstance(layer, keras.layers.Lambda):
        config = layer.get_config()
        return keras.layers.Lambda(layer.function, output_shape=layer._output_shape,
                                   mask=layer.mask, arguments=dict(layer.arguments),
                                   name=config.get("name"), dtype=config.get("dtype"),
                                   trainable=config.get("trainable", True))
    config = layer.get_config()
    if dtype is not None and "dtype" in config:
        config["dtype"] = dtype
    new = layer.__class__.from_config(config)
    _same_vocabulary(layer, new)
    return new


def _same_vocabulary(layer, new) -> None:
    """Give ``new`` (a clone of ``layer``) the vocabulary ``layer`` was adapted to.

    ``StringLookup``, ``IntegerLookup``, ``TextVectorization``: an adapted vocabulary lives in a
    lookup table, not in the config or the weights, so a clone's table is empty ("Table not
    initialized" at its first call) and every copy of the model fails.
    """
    get = getattr(layer, "get_vocabulary", None)
    if not callable(get) or not callable(getattr(new, "set_vocabulary", None)):
        return
    try:
        vocabulary = get(include_special_tokens=False)
    except Exception:  # noqa: BLE001 - never adapted, or no table yet: as configured
        return
    if not len(vocabulary):
        return
    try:
        new.set_vocabulary(vocabulary)
    except ValueError:  # output_mode="tf_idf": its weights too
        idf = getattr(layer, "idf_weights", None)
        if idf is None:
            return  # (the copy fails at its first call, as it did without the vocabulary)
        new.set_vocabulary(vocabulary, idf_weights=np.asarray(idf)[-len(vocabulary):])
