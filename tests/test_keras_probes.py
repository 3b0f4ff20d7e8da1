"""Isolate on real in-process Keras captures: the KerasTrainer, the probe context, probes.

Each training snippet runs under ``model_debugger.capture()``; the context is built from the
record and the capture's KerasKeeper with this file as the user's source, as the CLI child does.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from model_debugger.probes.batch_memory import requested_bytes

HERE = os.path.abspath(__file__)


def test_tensorflow_oom_message_gives_the_requested_bytes():
    msg = ("{{function_node __wrapped__Fill}} OOM when allocating tensor with shape[1024,64] "
           "and type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu")
    assert requested_bytes(msg) == 1024 * 64 * 4
    assert requested_bytes(msg.replace("float", "double")) == 1024 * 64 * 8
    assert requested_bytes("Tried to allocate 2.00 GiB") == 2 * 2**30


@pytest.fixture(scope="module")
def tk():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    pytest.importorskip("tensorflow")
    import keras

    return keras


def line_of(marker: str) -> int:
    with open(HERE, encoding="utf-8") as fh:
        hits = [i for i, line in enumerate(fh, 1) if line.rstrip().endswith(f"# <{marker}>")]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def problem(n=1024, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 10)).astype("float32")
    return X, (X[:, :3].sum(axis=1) > 0).astype("int64")


def captured(keras, lr: float, epochs: int = 3, val: bool = True, misaligned: bool = False):
    import model_debugger
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    X, y = problem()
    if misaligned:  # the labels re-ordered apart from the rows they belong to
        y = np.random.default_rng(7).permutation(y)
    Xv, yv = problem(256, seed=1)
    with model_debugger.capture() as rec:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(32, activation="tanh"),
                                  keras.layers.Dense(2)])  # <model>
        opt = keras.optimizers.SGD(learning_rate=lr, momentum=0.5)  # <opt>
        model.compile(optimizer=opt,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(X, y, batch_size=64, epochs=epochs, verbose=0,
                  validation_data=(Xv, yv) if val else None)  # <fit>
    source = {HERE: open(HERE, encoding="utf-8").read()}
    return model, build_context(Run(rec.events), rec.keeper, source, budget=60.0)


def test_a_subclassed_model_with_an_adapted_normalization_is_copied_and_trained(tk):
    """A clone builds its layers in a scratch graph: the adapted Normalization's mean and
    variance were that graph's tensors, "out of scope" at the copy's first call, and every
    probe that trains a copy failed. The copy now predicts as the user's model did at the start
    and trains."""
    import model_debugger
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    keras = tk

    class Scaled(keras.Model):
        def __init__(self, width=16, **kwargs):
            super().__init__(**kwargs)
            self.norm = keras.layers.Normalization()
            self.hidden = keras.layers.Dense(width, activation="relu")
            self.head = keras.layers.Dense(1, activation="sigmoid")

        def call(self, x, training=False):
            return self.head(self.hidden(self.norm(x)))

    X, y = problem()
    X = X * 40.0 + 300.0  # raw scales the adapted layer removes
    with model_debugger.capture() as rec:
        keras.utils.set_random_seed(0)
        model = Scaled()
        model.norm.adapt(X)
        start = model(X[:8]).numpy()
        model.compile(optimizer="adam", loss="binary_crossentropy")
        model.fit(X, y.astype("float32"), batch_size=64, epochs=2, verbose=0)
    ctx = build_context(Run(rec.events), rec.keeper, {}, budget=60.0)
    fresh = ctx.trainer.fresh_model()
    np.testing.assert_allclose(fresh(X[:8]).numpy(), start, rtol=1e-5, atol=1e-6)
    inputs, target = ctx.trainer.subset(ctx.trainer.randperm(ctx.trainer.n, 0)[:256])
    losses = ctx.trainer.fit(fresh, inputs, target, 20, lr=0.01)
    assert len(losses) == 20 and np.isfinite(losses).all()


def test_context_and_trainer_from_a_keras_capture(tk):
    from model_debugger.trainers.keras import KerasTrainer

    model, ctx = captured(tk, 0.05)
    assert ctx.framework == "keras" and ctx.live and isinstance(ctx.trainer, KerasTrainer)
    tr = ctx.trainer
    assert tr.n == 1024 and tr.inputs[0].shape == (1024, 10) and tr.lr == 0.05
    assert ctx.train_xy[0].shape == (1024, 10) and ctx.val_xy[0].shape == (256, 10)
    assert ctx.loss["name"] == "cross_entropy" and ctx.ref("optimizer")["line"] == line_of("opt")
    trained = [w.copy() for w in model.get_weights()]
    fresh = tr.fresh_model()
    for a, b in zip(fresh.get_weights(), ctx.initial_state):
        np.testing.assert_array_equal(a, b)
    assert not np.allclose(trained[0], ctx.initial_state[0])  # initial weights, not trained ones
    opt = tr.optimizer(fresh, lr=0.2)
    assert type(opt).__name__ == "SGD" and math.isclose(float(opt.learning_rate), 0.2,
                                                        rel_tol=1e-6)
    assert opt.get_config()["momentum"] == 0.5
    inputs, target = tr.subset(tr.randperm(tr.n, 0)[:256])
    before = tr.evaluate(fresh, inputs, target)
    losses = tr.fit(fresh, inputs, target, 40, lr=0.1)
    assert len(losses) == 40 and losses[-1] < losses[0]
    assert tr.evaluate(fresh, inputs, target) < before
    for a, b in zip(model.get_weights(), trained):  # the user's model is untouched
        np.testing.assert_array_equal(a, b)
    lrs, curve = tr.sweep(1e-5, 10.0, 60)
    assert len(lrs) == len(curve) >= 10 and np.isfinite(curve[0])


def test_lr_too_low_is_confirmed_at_the_optimizer_line(tk):
    from model_debugger.probes import run_probes

    _, ctx = captured(tk, 1e-5, epochs=2, val=False)
    assert ctx.classification.primary == "loss_not_decreasing"
    report = run_probes(ctx)
    confirmed = [f for f in report.findings if f.confirmed]
    assert confirmed and confirmed[0].root_cause == "hyperparameter"
    assert confirmed[0].check in ("lr_range", "overfit_small_batch")
    assert confirmed[0].location == {"file": HERE, "line": line_of("opt")}
    assert "lr_range" in report.probe_seconds  # the sweep ran on the Keras copy


def test_healthy_keras_run_gives_no_confirmed_finding(tk):
    from model_debugger.probes import PROBES, run_probes

    _, ctx = captured(tk, 0.05, epochs=4)
    assert ctx.classification.primary == "healthy"
    ids = [pid for pid, cls in PROBES.items() if "keras" in cls.frameworks]
    findings = run_probes(ctx, ids).findings
    assert not [(f.check, f.explanation) for f in findings if f.confirmed and
                not f.evidence.get("probe_error")]
    assert not [f for f in findings if f.evidence.get("probe_error")], findings


def test_misaligned_labels_are_found_on_the_keras_copy(tk):
    from model_debugger.probes import run_probes

    _, ctx = captured(tk, 0.05, epochs=2, misaligned=True)
    assert ctx.classification.primary == "loss_not_decreasing"
    [f] = run_probes(ctx, ["label_alignment"]).findings
    assert (f.check, f.root_cause, f.confirmed) == ("label_alignment", "data", True)
    ev = f.evidence
    assert 0.97 <= ev["heldout_loss_real"] / ev["heldout_loss_shuffled"] <= 1.03, ev
    assert ev["heldout_loss_real"] <= 1.1 * ev["constant_loss"]  # the copies did learn the prior
    assert f.location["file"] == HERE
    lines = open(HERE, encoding="utf-8").read().splitlines()
    # located where the labels were made (the permutation), seen used at the fit call
    assert "permutation(y)" in lines[f.location["line"] - 1]
    assert "model.fit(" in lines[f.location["used_at"] - 1]


def _keras_layers_case(keras, frozen: bool, rate: float):
    """A Keras MLP with its hidden layers frozen (or not) and a dropout of ``rate``."""
    import model_debugger
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    X, y = problem()
    with model_debugger.capture() as rec:
        keras.utils.set_random_seed(0)
        hidden = keras.layers.Dense(64, activation="relu")
        hidden2 = keras.layers.Dense(6, activation="relu")  # a narrow layer before the dropout
        layered = keras.Sequential([keras.Input((10,)), hidden, hidden2,
                                    keras.layers.Dropout(rate),  # <keras-dropout>
                                    keras.layers.Dense(2)])
        if frozen:
            hidden.trainable = hidden2.trainable = False  # <keras-frozen>
        layered.compile(optimizer=keras.optimizers.Adam(1e-2),
                        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        layered.fit(X, y, batch_size=64, epochs=2, verbose=0)
    source = {HERE: open(HERE, encoding="utf-8").read()}
    return build_context(Run(rec.events), rec.keeper, source, budget=60.0)


@pytest.mark.parametrize("frozen,rate,pid,tag", [
    (True, 0.1, "frozen_parameters", "keras-frozen"),
    (False, 0.9, "dropout_rate", "keras-dropout"),
])
def test_frozen_layers_and_heavy_dropout_confirmed_on_keras_copies(tk, frozen, rate, pid, tag):
    from model_debugger.probes import run_probes

    ctx = _keras_layers_case(tk, frozen, rate)
    assert ctx.trainer.frozen_share() > (0.5 if frozen else -1) and \
        max(ctx.trainer.dropout_rates().values()) == pytest.approx(rate)
    [f] = run_probes(ctx, [pid]).findings
    assert (f.check, f.root_cause, f.confirmed) == (pid, "architecture", True), f
    assert f.location == {"file": HERE, "line": line_of(tag)}


def test_frozen_and_dropout_probes_quiet_on_a_keras_model_that_trains_everything(tk):
    from model_debugger.probes import run_probes

    ctx = _keras_layers_case(tk, False, 0.1)
    assert ctx.trainer.frozen_share() == 0.0
    assert run_probes(ctx, ["frozen_parameters", "dropout_rate", "linear_stack"]).findings == ()


def _linear_stack_case(keras, build=None):
    """``build()``'s model (else a Sequential built here) trained on XOR of two signs, and its Isolate context."""
    import model_debugger
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    rng = np.random.default_rng(3)
    X = rng.standard_normal((1024, 2)).astype("float32")
    y = (X[:, 0] * X[:, 1] > 0).astype("int64")
    with model_debugger.capture() as rec:
        keras.utils.set_random_seed(0)
        if build is None:
            flat = keras.Sequential([keras.Input((2,)), keras.layers.Dense(32),  # <keras-linear-seq>
                                     keras.layers.Dropout(0.05), keras.layers.Dense(32),
                                     keras.layers.Dense(2)])
        else:
            flat = build()
        flat.compile(optimizer=keras.optimizers.Adam(1e-2),
                     loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        flat.fit(X, y, batch_size=64, epochs=4, verbose=0)
    source = {HERE: open(HERE, encoding="utf-8").read()}
    return build_context(Run(rec.events), rec.keeper, source, budget=60.0)


def _confirmed_linear_stack(ctx, tag):
    from model_debugger.probes import run_probes

    [f] = run_probes(ctx, ["linear_stack"]).findings
    assert (f.check, f.root_cause, f.confirmed) == ("linear_stack", "architecture", True), f
    assert f.location == {"file": HERE, "line": line_of(tag)}, (f.evidence, ctx.ref("model"))
    assert f.evidence["heldout_with_activations"] < 0.8 * f.evidence["heldout_as_built"]


def test_keras_sequential_dense_layers_without_activation_are_a_linear_stack(tk):
    """Hidden Dense layers with no activation (a Dropout between two) make the model linear:
    read from the model's graph and confirmed on a clone with ReLUs; located at the first."""
    keras = tk
    ctx = _linear_stack_case(keras, None)
    pairs = ctx.trainer.linear_chains()
    assert len(pairs) == 2 and pairs[0][1] == pairs[1][0]  # Dense -> Dense -> Dense
    _confirmed_linear_stack(ctx, "keras-linear-seq")


def test_keras_functional_dense_layers_without_activation_are_a_linear_stack(tk):
    """The same in a functional model: a linear ``Activation`` layer between two Dense layers
    keeps the chain (a ReLU layer would end it)."""
    keras = tk

    def functional():
        inp = keras.Input((2,))
        h = keras.layers.Dense(32, name="first")(inp)  # <keras-linear-fn>
        h = keras.layers.Activation("linear")(h)
        h = keras.layers.Dense(32, name="second")(h)
        return keras.Model(inp, keras.layers.Dense(2, name="head")(h))

    ctx = _linear_stack_case(keras, functional)
    assert ctx.trainer.linear_chains() == [("first", "second"), ("second", "head")]
    _confirmed_linear_stack(ctx, "keras-linear-fn")


def _subclassed(keras, relu_between: bool):
    class Flat(keras.Model):
        def __init__(self, width=32):
            super().__init__()
            self.hidden = keras.layers.Dense(width)
            self.drop = keras.layers.Dropout(0.05)
            self.mid = keras.layers.Dense(width)
            self.out = keras.layers.Dense(2)

        def call(self, x, training=False):
            h = self.drop(self.hidden(x), training=training)  # <keras-linear-sub>
            if relu_between:
                h = keras.ops.relu(h)
            return self.out(self.mid(h))

    return Flat


def test_keras_subclassed_dense_layers_without_activation_are_a_linear_stack(tk):
    """A subclassed model has no graph to read: one forward pass of a fresh copy is traced by
    the tensors each layer's ``call`` hands on (a dropout passes the chain on, an activation in
    ``call`` ends it), the pair names the user's layers although the copy is named anew, and
    the copy with a ReLU after the first two layers learns XOR clearly better."""
    keras = tk
    ctx = _linear_stack_case(keras, lambda: _subclassed(keras, False)())
    names = [layer.name for layer in ctx.trainer.model.layers]
    assert ctx.trainer.linear_chains() == [(names[0], names[2]), (names[2], names[3])]
    from model_debugger.probes import run_probes

    [f] = run_probes(ctx, ["linear_stack"]).findings
    assert (f.check, f.root_cause, f.confirmed) == ("linear_stack", "architecture", True), f
    assert f.evidence["heldout_with_activations"] < 0.8 * f.evidence["heldout_as_built"]
    assert not [layer for layer in ctx.trainer.model.layers if "call" in vars(layer)]
    assert not [layer for layer in ctx.trainer.fresh_model().layers if "call" in vars(layer)]
    with_relu = _linear_stack_case(keras, lambda: _subclassed(keras, True)())
    names = [layer.name for layer in with_relu.trainer.model.layers]
    assert with_relu.trainer.linear_chains() == [(names[2], names[3])]


def test_the_trace_of_a_subclass_leaves_layers_it_shares_with_the_user_alone(tk):
    """A subclass given a layer in its constructor is rebuilt with that same layer object: the
    trace would wrap the user's own layer, so it reads nothing there; no ``call`` is left on
    any layer."""
    keras = tk

    class Wrap(keras.Model):
        def __init__(self, body, **kwargs):
            super().__init__(**kwargs)
            self.body = body
            self.head = keras.layers.Dense(2)

        def call(self, x, training=False):
            return self.head(self.body(x))

    ctx = _linear_stack_case(keras, lambda: Wrap(keras.layers.Dense(8)))
    assert ctx.trainer.linear_chains() == []
    assert not [layer for layer in ctx.trainer.model.layers if "call" in vars(layer)]


def test_keras_convolutions_without_activation_chain_through_average_pools(tk):
    """Conv2D layers without activation are affine too: through a batch norm and an average
    pool the chain goes on into the next convolution and the Dense head; a max pool, which is
    not affine, ends it."""
    from model_debugger.trainers.keras import KerasTrainer

    keras = tk
    layers = keras.layers
    inp = keras.Input((8, 8, 1))
    h = layers.Conv2D(4, 3, padding="same", name="c1")(inp)
    h = layers.MaxPooling2D(name="max")(h)
    h = layers.Conv2D(4, 3, padding="same", name="c2")(h)
    h = layers.BatchNormalization(name="bn")(h)
    h = layers.AveragePooling2D(2, name="avg")(h)
    h = layers.Conv2D(4, 3, padding="same", name="c3", activation="relu")(h)
    h = layers.Conv2D(4, 3, padding="same", name="c4")(h)
    h = layers.GlobalAveragePooling2D(name="gap")(h)
    model = keras.Model(inp, layers.Dense(2, name="head")(h))
    x = np.zeros((8, 8, 8, 1), "float32")
    tr = KerasTrainer(model, None, {"cls": keras.optimizers.SGD, "config": {}},
                      {"name": "mse"}, [((x,), np.zeros((8, 2), "float32"))])
    assert tr.linear_chains() == [("c2", "c3"), ("c4", "head")]


def test_a_subclassed_model_with_an_adapted_normalization_is_copied(tk):
    """A subclassed model builds its layers symbolically at its first call, so a copy's adapted
    ``Normalization`` held its mean and variance as tensors of that scratch graph, "out of
    scope" at the first real call: every probe that trains a copy failed. The copy standardises
    as the user's model does at its initial weights."""
    from model_debugger.probes import run_probes

    keras = tk

    class Tagger(keras.Model):
        def __init__(self, n_out, **kwargs):
            super().__init__(**kwargs)
            self.norm = keras.layers.Normalization()
            self.hidden = keras.layers.Dense(16, activation="relu")
            self.out = keras.layers.Dense(n_out)

        def call(self, x, training=False):
            return self.out(self.hidden(self.norm(x)))

    rng = np.random.default_rng(0)
    X = (rng.random((512, 10)) * 50).astype("float32")
    y = rng.integers(0, 3, 512)

    def build():
        model = Tagger(3)
        model.norm.adapt(X)
        return model

    ctx = _keras_context(keras, build, X, y)
    model = ctx.trainer.model
    copy = ctx.trainer.fresh_model()
    assert np.allclose(np.asarray(copy.norm(X[:4])), np.asarray(model.norm(X[:4])), atol=1e-4)
    report = run_probes(ctx, ["initialization", "lr_range"])
    assert not [f for f in report.findings if f.evidence.get("probe_error")], report.findings


def _mean_square_of_the_first_column(y_true, y_pred):
    import keras

    return keras.ops.mean(keras.ops.square(y_true - y_pred[:, :1]))


def test_a_functional_model_compiled_with_a_plain_function_loss_is_copied(tk):
    """Keras compiles a clone of a compiled model from its compile config, and a loss written as
    a plain function cannot be found by name there ("Could not locate function"): every probe
    that trains a copy failed. The copy is cloned uncompiled (the trainer has its own step) and
    the user's model stays compiled."""
    from model_debugger.probes import run_probes

    keras = tk
    rng = np.random.default_rng(0)
    X = rng.random((512, 4)).astype("float32")
    y = 2 * X[:, :1]

    def build():
        inp = keras.Input((4,))
        h = keras.layers.Dense(8, activation="relu")(inp)
        out = keras.layers.Concatenate()([keras.layers.Dense(1)(h), keras.layers.Dense(1)(h)])
        return keras.Model(inp, out)

    import model_debugger
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    with model_debugger.capture() as rec:
        model = build()
        model.compile(optimizer="adam", loss=_mean_square_of_the_first_column)
        model.fit(X, y, epochs=1, batch_size=64, verbose=0)
    ctx = build_context(Run(rec.events), rec.keeper, {}, budget=30.0)
    assert ctx.trainer.fresh_model() is not None and model.compiled
    report = run_probes(ctx, ["initialization", "lr_range"])
    assert not [f for f in report.findings if f.evidence.get("probe_error")], report.findings


def _keras_context(keras, build, X, y):
    """``build()``'s model compiled and fitted one epoch under capture; its Isolate context."""
    import model_debugger
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    with model_debugger.capture() as rec:
        model = build()
        model.compile(optimizer="adam",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(X, y, epochs=1, batch_size=64, verbose=0)
    return build_context(Run(rec.events), rec.keeper, {}, budget=30.0)


def test_a_float16_policy_without_a_gpu_is_timed_against_float32(tk, monkeypatch):
    """``mixed_float16`` on a CPU: the probe times a copy of the model under the policy against
    one whose layers compute in float32 and reveals a performance problem when float16 is
    clearly slower, located at the policy. A model Keras cannot rebuild in float32 falls back
    to timing matrix products (the timings are made up here: a shared test machine's are no
    assertion; the copies are real)."""
    import model_debugger
    from model_debugger.probes import compute_settings as cs
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    keras = tk
    assert cs._matmul_seconds(__import__("tensorflow"), "float32", size=32, repeats=2) > 0
    X, y = problem()
    try:
        with model_debugger.capture() as rec:
            keras.mixed_precision.set_global_policy("mixed_float16")  # <keras-policy>
            half = keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="relu"),
                                     keras.layers.Dense(2, dtype="float32")])
            half.compile(optimizer="adam",
                         loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            half.fit(X, y, batch_size=64, epochs=1, verbose=0)
        ctx = build_context(Run(rec.events), rec.keeper,
                            {HERE: open(HERE, encoding="utf-8").read()}, budget=60.0)
        monkeypatch.setattr(cs, "MIN_RUN_SECONDS", 0.0)
        tr = ctx.trainer
        full = tr.float32_copy()
        assert [layer.compute_dtype for layer in full.layers] == ["float32", "float32"]
        assert [layer.compute_dtype for layer in tr.fresh_model().layers] == \
            ["float16", "float32"]
        # compile wrapped Adam in a LossScaleOptimizer: the copies are built from Adam
        assert tr.opt_cls is keras.optimizers.Adam
        assert tr.throughput(64, steps=2, model=full) > 0
        seen = []

        def timed(ratio):
            def throughput(batch, steps=20, model=None):
                in_half = model.layers[0].compute_dtype == "float16"
                seen.append(in_half)
                return 100.0 / ratio if in_half else 100.0
            return throughput

        for ratio, found in ((4.0, True), (1.0, False)):
            monkeypatch.setattr(tr, "throughput", timed(ratio))
            got = run_probes(ctx, ["compute_settings"]).findings
            assert bool(got) == found, got
            if found:
                [f] = got
                assert (f.root_cause, f.confirmed) == ("hardware", True)
                assert f.evidence["policy"] == "mixed_float16"
                assert f.evidence["timed"] == "model_steps"
                assert f.evidence["gain"] == 4.0
                assert f.location == {"file": HERE, "line": line_of("keras-policy")}
        assert seen.count(True) == seen.count(False) == 2 * cs.ROUNDS  # alternated rounds
        monkeypatch.setattr(tr, "float32_copy", lambda: None)
        monkeypatch.setattr(cs, "_matmul_seconds",
                            lambda tf, dtype: 0.01 * (4.0 if dtype == "float16" else 1))
        [f] = run_probes(ctx, ["compute_settings"]).findings
        assert f.evidence["timed"] == "matmul"
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("beta_2,lr,confirmed", [(0.9, 1e-3, True), (0.9999, 3.0, False)])
def test_a_momentum_that_blows_up_late_is_replayed_as_long_as_the_run(tk, beta_2, lr, confirmed):
    """Adam's betas swapped (``beta_1=0.999, beta_2=0.9``) train well for a few hundred steps,
    then the steps grow and the loss blows up: a 100-step comparison of held-out losses cannot
    see it. The copies train at the run's batch size for as many steps as the run took to blow
    up, and half again: as set up they blow up, with ``beta_1=0.9`` they do not (confirmed, at
    the optimizer). With a rate of 3.0 both blow up: the beta is not the cause, and the held-out
    comparison that follows says so too."""
    import model_debugger
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    keras = tk
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(6, 30)) * 1.5
    y = rng.integers(0, 6, 3000)
    X = (centers[y] + rng.normal(size=(3000, 30))).astype("float32")
    with model_debugger.capture() as rec:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((30,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(64, activation="relu"), keras.layers.Dense(6)])
        opt = keras.optimizers.Adam(lr, beta_1=0.999, beta_2=beta_2)  # <keras-betas>
        model.compile(optimizer=opt,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(X, y, batch_size=32, epochs=6 if confirmed else 3, verbose=0)
    ctx = build_context(Run(rec.events), rec.keeper,
                        {HERE: open(HERE, encoding="utf-8").read()}, budget=60.0)
    assert ctx.classification.primary == "gradient_instability"
    onset = ctx.signals["loss_blowup_step"]
    assert 20 < onset < 300
    [f] = run_probes(ctx, ["optimizer_settings"]).findings
    assert f.confirmed == confirmed, f.explanation
    assert f.evidence["setting"] == "beta1"
    replay = f.evidence if confirmed else f.evidence["replay"]  # (else the held-out
    assert replay["onset_step"] == onset and replay["replay_steps"] >= onset  # comparison)
    if confirmed:
        assert all(p >= 2.0 for p in f.evidence["peak_as_set"])
        assert all(p < 2.0 for p in f.evidence["peak_usual"])
        assert f.location["line"] == line_of("keras-betas")


def test_one_hot_targets_of_labels_counted_from_one_name_no_class(tk):
    """Ratings 1..5 one-hot encoded with depth 5: the rating-5 rows are all zeros (TensorFlow
    says nothing). A fifth of the kept targets name no class: a data finding at the encoding
    line; labels shifted to 0..4 are quiet."""
    import tensorflow as tf

    import model_debugger
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    keras = tk
    rng = np.random.default_rng(5)
    X = rng.standard_normal((640, 6)).astype("float32")
    ratings = np.digitize(X[:, 0] + 0.3 * X[:, 1], [-0.8, -0.25, 0.25, 0.8]) + 1  # 1..5
    for shift, found in ((0, True), (1, False)):
        with model_debugger.capture() as rec:
            keras.utils.set_random_seed(0)
            targets = tf.one_hot(ratings - shift, 5).numpy()  # <one-hot-depth>
            rated = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                                      keras.layers.Dense(5, activation="softmax")])
            rated.compile(optimizer="adam", loss="categorical_crossentropy")
            rated.fit(X, targets, batch_size=64, epochs=1, verbose=0)
        ctx = build_context(Run(rec.events), rec.keeper,
                            {HERE: open(HERE, encoding="utf-8").read()}, budget=60.0)
        got = run_probes(ctx, ["target_classes"]).findings
        assert bool(got) == found, got
        if found:
            [f] = got
            assert (f.root_cause, f.confirmed) == ("data", True)
            assert f.evidence["no_class_share"] == pytest.approx((ratings == 5).mean(), abs=0.05)
            assert f.evidence["columns_never_set"] == [0]  # (no rating 0: counted from 1)
            assert f.location == {"file": HERE, "line": line_of("one-hot-depth")}


def _keras_settings_case(keras, init: str, clipnorm: float | None):
    """A Keras MLP with hidden kernels initialised by ``init`` and an optional gradient clip."""
    import model_debugger
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    X, y = problem()
    with model_debugger.capture() as rec:
        keras.utils.set_random_seed(0)
        net = keras.Sequential([keras.Input((10,)),
                                keras.layers.Dense(32, activation="relu",
                                                   kernel_initializer=init),  # <keras-init>
                                keras.layers.Dense(2, kernel_initializer=init)])
        opt = keras.optimizers.SGD(0.1, clipnorm=clipnorm)  # <keras-clip>
        net.compile(optimizer=opt,
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        net.fit(X, y, batch_size=64, epochs=2, verbose=0)
    source = {HERE: open(HERE, encoding="utf-8").read()}
    return build_context(Run(rec.events), rec.keeper, source, budget=60.0)


@pytest.mark.parametrize("init,clipnorm,pid,tag,root", [
    ("zeros", None, "initialization", "keras-init", "architecture"),
    ("glorot_uniform", 1e-5, "optimizer_settings", "keras-clip", "hyperparameter"),
])
def test_zero_kernels_and_a_tiny_clip_confirmed_on_keras_copies(tk, init, clipnorm, pid, tag,
                                                                 root):
    from model_debugger.probes import run_probes

    ctx = _keras_settings_case(tk, init, clipnorm)
    [f] = run_probes(ctx, [pid]).findings
    assert (f.check, f.root_cause, f.confirmed) == (pid, root, True), f
    assert f.location["line"] == line_of(tag), f.location
    quiet = _keras_settings_case(tk, "glorot_uniform", 1.0)
    assert run_probes(quiet, ["initialization", "optimizer_settings"]).findings == ()


@pytest.mark.parametrize("activation,from_logits,confirmed", [
    ("softmax", True, True),    # probabilities into a loss that expects logits
    (None, False, True),        # logits into a loss that expects probabilities (clipped)
    (None, True, False),        # logits, from_logits=True: as it should be
    ("softmax", False, False),  # probabilities, from_logits=False: as it should be
])
def test_keras_output_activation_against_the_loss_is_measured(tk, activation, from_logits,
                                                              confirmed):
    import model_debugger
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    X, y = problem()
    with model_debugger.capture() as rec:
        tk.utils.set_random_seed(0)
        head = tk.Sequential([tk.Input((10,)), tk.layers.Dense(16, activation="relu"),
                              tk.layers.Dense(3, activation=activation)])
        head.compile(optimizer="adam", loss=tk.losses.SparseCategoricalCrossentropy(
            from_logits=from_logits))
        head.fit(X, y, batch_size=64, epochs=1, verbose=0)
    ctx = build_context(Run(rec.events), rec.keeper, {HERE: open(HERE, encoding="utf-8").read()},
                        budget=60.0)
    found = [f for f in run_probes(ctx, ["loss_output_mismatch"]).findings if f.confirmed]
    assert bool(found) == confirmed, found
    if confirmed:
        assert found[0].root_cause == "architecture"
        assert ("from_logits=True" in found[0].explanation) == (not from_logits)


def test_a_collapsed_model_is_not_read_as_a_sigmoid_output(tk):
    """A model whose trained output is one constant in [0, 1] (every unit dead after a blow-up)
    says nothing about an output activation: the output is judged as built, from the initial
    weights, and a constant is no kind of squashed output."""
    import model_debugger
    from model_debugger.probes import run_probes
    from model_debugger.probes.loss_output_mismatch import output_kind
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    assert output_kind(np.full((8, 1), 0.26))["kind"] == "constant"
    assert output_kind(np.linspace(0.1, 0.9, 8).reshape(8, 1))["kind"] == "unit_interval"
    X, y = problem()
    yb = (y == 0).astype("float32")
    with model_debugger.capture() as rec:
        tk.utils.set_random_seed(0)
        head = tk.Sequential([tk.Input((10,)), tk.layers.Dense(16, activation="relu"),
                              tk.layers.Dense(1)])
        head.compile(optimizer="adam", loss=tk.losses.BinaryCrossentropy(from_logits=True))
        head.fit(X, yb, batch_size=64, epochs=1, verbose=0)
    kernel, bias = head.layers[-1].get_weights()
    head.layers[-1].set_weights([np.zeros_like(kernel), np.full_like(bias, 0.26)])  # collapsed
    ctx = build_context(Run(rec.events), rec.keeper, {HERE: open(HERE, encoding="utf-8").read()},
                        budget=60.0)
    assert not [f for f in run_probes(ctx, ["loss_output_mismatch"]).findings if f.confirmed]


def test_a_constant_loss_input_is_its_own_kind_in_torch():
    torch = pytest.importorskip("torch")
    from model_debugger.capture.keeper import describe_loss_input

    name = "binary_cross_entropy_with_logits"
    assert describe_loss_input(name, torch.full((8, 1), 0.26))["kind"] == "constant"
    assert describe_loss_input(name, torch.linspace(0.1, 0.9, 8)[:, None])["kind"] == \
        "unit_interval"


def test_keras_targets_in_the_thousands_are_confirmed_by_a_standardised_copy(tk):
    import model_debugger
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    rng = np.random.default_rng(0)
    X = rng.standard_normal((1024, 6)).astype("float32")
    y = (X[:, :3].sum(axis=1, keepdims=True) * 1500.0 + 300.0).astype("float32")  # <k-target>
    with model_debugger.capture() as rec:
        tk.utils.set_random_seed(0)
        reg = tk.Sequential([tk.Input((6,)), tk.layers.Dense(32, activation="relu"),
                             tk.layers.Dense(1)])
        reg.compile(optimizer=tk.optimizers.Adam(1e-3), loss="mse")
        reg.fit(X, y, batch_size=64, epochs=1, verbose=0)
    ctx = build_context(Run(rec.events), rec.keeper, {HERE: open(HERE, encoding="utf-8").read()},
                        budget=60.0)
    found = [f for f in run_probes(ctx, ["target_scale"]).findings if f.confirmed]
    assert found and found[0].root_cause == "data", run_probes(ctx, ["target_scale"]).findings
    assert found[0].location["line"] == line_of("k-target")


def test_a_gradient_that_is_exactly_zero_is_a_constant_output_not_a_cut_graph(tk):
    """One softmax unit outputs 1.0 whatever the weights: every gradient exists and is exactly
    zero. That is the output activation (the lint's cause, now measured), not a detached output
    (which is about gradients that never reach the weights)."""
    import tensorflow as tf

    import model_debugger
    from model_debugger.probing import build_context, probe
    from model_debugger.records import Classification, Run

    X, y = problem(512)
    y = y.astype("float32")[:, None]
    with model_debugger.capture() as rec:
        tk.utils.set_random_seed(0)
        model = tk.Sequential([tk.Input((10,)), tk.layers.Dense(8, activation="relu"),
                               tk.layers.Dense(1, activation="softmax")])  # <one-unit-softmax>
        opt = tk.optimizers.Adam(1e-2)
        for i in range(0, 512, 32):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(X[i:i + 32], training=True) - y[i:i + 32]) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
    run = Run(rec.events)
    assert all(s["gn"] == 0.0 for s in run.steps)  # gradients there, all exactly zero
    ctx = build_context(run, rec.keeper, {HERE: open(HERE, encoding="utf-8").read()},
                        budget=30.0, classification=Classification("loss_not_decreasing"))
    found = probe(ctx, ["detached_output", "loss_output_mismatch"]).findings
    assert not [f for f in found if f.check == "detached_output" and f.confirmed], found
    (f,) = [f for f in found if f.check == "loss_output_mismatch"]
    assert f.confirmed and f.root_cause == "architecture" and f.evidence["decisive"]
    assert f.location["line"] == line_of("one-unit-softmax")


def test_copies_of_a_subclassed_keras_model_are_built_from_its_constructor_arguments(tk):
    """Keras cannot clone a subclassed model (and its automatic config holds the constructor's
    defaults): the copy calls the class again with the arguments it was built with, and starts
    from the weights taken just before the first step (the model was unbuilt at compile)."""
    import model_debugger
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    class Net(tk.Model):
        def __init__(self, width=64, classes=2):
            super().__init__()
            self.hidden = tk.layers.Dense(width, activation="relu")
            self.head = tk.layers.Dense(classes)

        def call(self, x):
            return self.head(self.hidden(x))

    X, y = problem(256)
    with model_debugger.capture() as rec:
        tk.utils.set_random_seed(0)
        model = Net(12, classes=2)
        model.compile(optimizer="adam",
                      loss=tk.losses.SparseCategoricalCrossentropy(from_logits=True))
        first = [w.copy() for w in model(X[:1]) is not None and model.get_weights()]
        model.fit(X, y, batch_size=32, epochs=2, verbose=0)
    ctx = build_context(Run(rec.events), rec.keeper, {}, budget=30.0)
    fresh = ctx.trainer.fresh_model()
    assert type(fresh) is Net and fresh.hidden.units == 12
    for a, b in zip(fresh.get_weights(), first):
        np.testing.assert_array_equal(a, b)
    assert ctx.trainer.fit(fresh, *ctx.trainer.subset(np.arange(64)), 5, lr=0.01)


def _stopped_case(keras, how: str):
    """A subclassed Keras model whose ``call`` stops the gradient of its first block's output
    (``tf.stop_gradient`` or ``keras.ops.stop_gradient``), or only of a logged copy."""
    import tensorflow as tf

    import model_debugger
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    class Stopped(keras.Model):
        def __init__(self):
            super().__init__()
            self.body = keras.layers.Dense(64, activation="relu")
            self.head = keras.layers.Dense(2)
            self.seen = None

        def call(self, x, training=False):
            h = self.body(x)
            if how == "tf":
                h = tf.stop_gradient(h)  # <keras-stop-tf>
            elif how == "ops":
                h = keras.ops.stop_gradient(h)  # <keras-stop-ops>
            else:
                self.seen = keras.ops.stop_gradient(h)  # a copy kept aside: not on the path
            return self.head(h)

    X, y = problem()
    with model_debugger.capture() as rec:
        keras.utils.set_random_seed(0)
        if how == "lambda":  # a Lambda layer (clones of it keep the function and its globals)
            model = keras.Sequential([
                keras.Input((10,)), keras.layers.Dense(64, activation="relu"),
                keras.layers.Lambda(lambda t: keras.ops.stop_gradient(t)),  # <keras-stop-lambda>
                keras.layers.Dense(2)])
        else:
            model = Stopped()
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(X, y, batch_size=64, epochs=2, verbose=0)
    source = {HERE: open(HERE, encoding="utf-8").read()}
    return build_context(Run(rec.events), rec.keeper, source, budget=60.0)


@pytest.mark.parametrize("how", ["tf", "ops", "lambda"])
def test_a_keras_stop_gradient_in_call_is_a_cut_confirmed_on_copies(tk, how):
    """Most weights (the first block's) never train: a fresh copy's tape gets no gradient for
    them, one whose stop_gradient keeps the graph gets all; copies trained both ways confirm
    it, located at the stop_gradient line. (Before, the Keras side had no such measurement.)"""
    from model_debugger.probes import run_probes

    ctx = _stopped_case(tk, how)
    assert ctx.signals["untrained_share"] > 0.5
    [f] = run_probes(ctx, ["detached_output"]).findings
    assert (f.check, f.root_cause, f.confirmed) == ("detached_output", "training_loop", True), f
    assert f.location["line"] == line_of(f"keras-stop-{how}")
    assert f.evidence["ungraded_share"] > 0.5 and f.evidence["ungraded_share_kept"] == 0.0


def test_a_keras_stop_gradient_off_the_path_is_no_cut(tk):
    from model_debugger.probes import run_probes

    ctx = _stopped_case(tk, "aside")
    assert ctx.signals.get("untrained_share", 0.0) < 0.5
    assert run_probes(ctx, ["detached_output"]).findings == ()


FUNCTIONAL_CUT = """\
import keras


def build():
    inputs = keras.Input((10,))
    hidden = keras.layers.Dense(64, activation="relu")(inputs)
    hidden = keras.ops.stop_gradient(hidden)
    return keras.Model(inputs, keras.layers.Dense(2)(hidden))
"""


def test_a_stop_gradient_node_of_a_functional_model_is_a_cut(tk, tmp_path):
    """``keras.ops.stop_gradient`` on a symbolic tensor is a node of the graph, run by Keras
    (no frame of the user's code): the node passes its input on in the copies, and the
    finding is located at the line of the program that calls it."""
    import importlib.util

    import model_debugger
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    path = tmp_path / "functional_cut.py"
    path.write_text(FUNCTIONAL_CUT)
    spec = importlib.util.spec_from_file_location("functional_cut", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    X, y = problem()
    with model_debugger.capture() as rec:
        tk.utils.set_random_seed(0)
        model = module.build()
        model.compile(optimizer=tk.optimizers.Adam(1e-3),
                      loss=tk.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(X, y, batch_size=64, epochs=2, verbose=0)
    ctx = build_context(Run(rec.events), rec.keeper, {str(path): FUNCTIONAL_CUT}, budget=60.0)
    [f] = run_probes(ctx, ["detached_output"]).findings
    assert (f.check, f.confirmed) == ("detached_output", True), f
    assert f.location == {"file": str(path), "line": 7}


def test_named_inputs_given_as_a_dict_are_kept_in_the_model_order(tk):
    """``fit({"numeric": ..., "store": ...}, y)`` on a two-input functional model: the keeper
    used to skip dict batches, so every live probe was blind (a validation set preprocessed
    apart from training's gave no finding at all). The batches are kept in the order of the
    model's inputs, copies run on them, and the shift is found."""
    import model_debugger
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    rng = np.random.default_rng(0)
    numeric = rng.lognormal(2.0, 1.0, size=(1200, 4)).astype("float32")
    store = rng.integers(0, 5, 1200).astype("int32")
    y = (np.log(numeric).sum(1) > 8).astype("float32")
    train_num = np.log1p(numeric[:1000])
    train_num = (train_num - train_num.mean(0)) / train_num.std(0)
    val_num = (numeric[1000:] - numeric[1000:].mean(0)) / 100.0  # not the training transform
    with model_debugger.capture() as rec:
        tk.utils.set_random_seed(0)
        num_in = tk.Input(shape=(4,), name="numeric")
        cat_in = tk.Input(shape=(), dtype="int32", name="store")
        h = tk.layers.Concatenate()([num_in, tk.layers.Embedding(5, 3)(cat_in)])
        out = tk.layers.Dense(1, activation="sigmoid")(tk.layers.Dense(16, activation="relu")(h))
        model = tk.Model([num_in, cat_in], out)
        model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
        model.fit({"store": store[:1000], "numeric": train_num}, y[:1000], epochs=3,
                  batch_size=64, verbose=0,
                  validation_data=({"numeric": val_num, "store": store[1000:]}, y[1000:]))
    source = {HERE: open(HERE, encoding="utf-8").read()}
    ctx = build_context(Run(rec.events), rec.keeper, source, budget=60.0)
    assert ctx.trainer is not None and [a.shape[1:] for a in ctx.trainer.inputs] == [(4,), ()]
    assert ctx.val_xy is not None
    found = run_probes(ctx, ["distribution_shift"]).findings
    assert [f.check for f in found if f.confirmed] == ["distribution_shift"], found


def test_digit_classes_fitted_by_mse_on_one_unit_are_classes_as_numbers(tk):
    """Digits 0-9 under ``loss="mse"`` on a one-unit output: the loss falls and the run looks
    healthy, but rounding the output names the class far less often than a k-NN does. A
    decisive finding at the loss; the same ids fitted as classes are quiet, and so are
    regression targets that are not a few consecutive integers."""
    from sklearn.datasets import load_digits

    import model_debugger
    from model_debugger.probes import run_probes
    from model_debugger.probes.classes_as_numbers import class_ids
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    keras = tk
    assert class_ids(np.repeat(np.arange(10), 10)) is not None
    assert class_ids(np.repeat([0, 1, 2, 5], 30)) is None            # not consecutive
    assert class_ids(np.arange(200) % 80) is None                    # too many values
    assert class_ids(np.repeat(np.arange(10), 10) + 0.5) is None     # not integers
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype("float32")
    rng = np.random.default_rng(1)  # star ratings, 70% fives, barely told by the inputs: a
    noise = rng.standard_normal(X.shape).astype("float32")  # fair regression
    stars = np.where(rng.random(len(y)) < 0.7, 5, rng.integers(1, 5, len(y)))
    stars = np.where(noise[:, 0] > 1.5, np.maximum(stars - 1, 1), stars)
    for units, found in ((1, True), (10, False), (1, False)):
        if found is False and units == 1:
            X, y = noise, stars
        with model_debugger.capture() as rec:
            keras.utils.set_random_seed(0)
            numbered = keras.Sequential([keras.Input((64,)),
                                         keras.layers.Dense(32, activation="relu"),
                                         keras.layers.Dense(units)])
            numbered.compile(optimizer="adam", loss="mse" if units == 1 else  # <loss-choice>
                             "sparse_categorical_crossentropy")
            numbered.fit(X[:1200], y[:1200], validation_data=(X[1200:], y[1200:]),
                         batch_size=32, epochs=3, verbose=0)
        ctx = build_context(Run(rec.events), rec.keeper,
                            {HERE: open(HERE, encoding="utf-8").read()}, budget=60.0)
        got = run_probes(ctx, ["classes_as_numbers"]).findings
        assert bool(got) == found, got
        if found:
            [f] = got
            assert (f.root_cause, f.confirmed, f.evidence["classes"]) == ("architecture", True, 10)
            ev = f.evidence
            assert ev["knn_accuracy"] >= max(ev["rounded_accuracy"], ev["majority_rate"]) + 0.15
            assert f.location == {"file": HERE, "line": line_of("loss-choice")}


def _pipelines_case(keras):
    import tensorflow as tf

    import model_debugger
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    rng = np.random.default_rng(2)
    raw = rng.integers(0, 256, size=(900, 12)).astype("float32")
    y = (raw[:, 0] + raw[:, 1] > 255).astype("int64")
    mean, std = float(raw[:700].mean()), float(raw[:700].std())

    def preprocess(x, label):
        return (x - mean) / std, label

    with model_debugger.capture() as rec:
        keras.utils.set_random_seed(0)
        train_ds = tf.data.Dataset.from_tensor_slices((raw[:700], y[:700])).map(
            preprocess).batch(32)
        val_ds = tf.data.Dataset.from_tensor_slices((raw[700:], y[700:])).batch(100)  # <val-pipe>
        piped = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(2)])
        piped.compile(optimizer="adam",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        piped.fit(train_ds, validation_data=val_ds, epochs=2, verbose=0)
    return build_context(Run(rec.events), rec.keeper,
                         {HERE: open(HERE, encoding="utf-8").read()}, budget=60.0)


def test_a_validation_pipeline_that_skips_the_training_normalisation_is_located_there(tk):
    """``train_ds`` maps ``preprocess`` (standardisation), ``val_ds`` does not: the shift is
    confirmed, and the step goes in the validation pipeline, not the training one (a later
    training-side step that scales by a constant is still that step's fault)."""
    from model_debugger.probes import run_probes

    ctx = _pipelines_case(tk)
    found = [f for f in run_probes(ctx, ["distribution_shift"]).findings if f.confirmed]
    assert [f.check for f in found] == ["distribution_shift"], found
    assert found[0].location["line"] == line_of("val-pipe")


CUSTOM_STEP = """\
import keras
import tensorflow as tf


class Regressor(keras.Model):
    def __init__(self):
        super().__init__()
        self.body = keras.layers.Dense(16, activation="relu")
        self.head = keras.layers.Dense(1)
        self.tracker = keras.metrics.Mean(name="loss")

    def call(self, x, training=False):
        return self.head(self.body(x))

    @property
    def metrics(self):
        return [self.tracker]

    def squared_error(self, y, y_pred):
        return tf.reduce_mean(tf.square(y - y_pred))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.squared_error(y, self(x, training=True))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}
"""


def test_a_loss_written_in_train_step_over_mismatched_shapes_is_a_broadcast_hypothesis(
        tk, tmp_path):
    """No loss given to compile: the capture cannot see the loss's shapes, but it sees a (B,)
    target and a (B, 1) output; ``y - y_pred`` there broadcasts. A hypothesis located at the
    line that computes the loss (through the method train_step calls), tested by re-running
    with the targets shaped (B, 1) (``match_target_shape``)."""
    import importlib.util

    import model_debugger
    from model_debugger.probes import run_probes
    from model_debugger.probes.suggestions import intervention_for
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    path = tmp_path / "custom_step.py"
    path.write_text(CUSTOM_STEP)
    spec = importlib.util.spec_from_file_location("custom_step", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(512, 6)).astype("float32")
    y = X[:, :3].sum(1).astype("float32")
    with model_debugger.capture() as rec:
        tk.utils.set_random_seed(0)
        model = module.Regressor()
        model.compile(optimizer=tk.optimizers.Adam(1e-2))
        model.fit(X, y, batch_size=64, epochs=2, verbose=0)
    assert [e for e in rec.events if e["t"] == "target_values"]  # the loss is unknown
    ctx = build_context(Run(rec.events), rec.keeper, {str(path): CUSTOM_STEP}, budget=30.0)
    [f] = run_probes(ctx, ["loss_broadcast"]).findings
    assert (f.root_cause, f.confirmed) == ("training_loop", False)
    assert f.location == {"file": str(path), "line": 20}  # squared_error's return
    assert intervention_for(f).id == "match_target_shape"


@pytest.mark.slow
def test_match_target_shape_gives_a_one_column_target_to_a_custom_train_step(tmp_path):
    from model_debugger.artifacts import Intervention, ScriptArtifact, Version

    script = tmp_path / "fit.py"
    script.write_text(CUSTOM_STEP + """
import json
import numpy as np
keras.utils.set_random_seed(0)
X = np.random.default_rng(0).normal(size=(256, 6)).astype("float32")
y = X[:, :3].sum(1).astype("float32")
seen = []
model = Regressor()
model.compile(optimizer=keras.optimizers.Adam(1e-2))
step = model.train_step
model.train_step = lambda data: (seen.append(len(data[1].shape)), step(data))[1]
model.fit(X, y, batch_size=64, epochs=1, verbose=0)
print("SEEN " + json.dumps({"target_rank": seen[0]}))
""")
    art = ScriptArtifact(str(script))
    for n, (change, rank) in enumerate([(None, 1), (Intervention("match_target_shape"), 2)]):
        out = tmp_path / f"out{n}.txt"
        with open(out, "w") as fh:
            cap = art.run(Version("current", str(script)), 0, str(tmp_path / f"r{n}.jsonl"),
                          intervention=change, stdout=fh)
        assert cap.error is None, cap.error
        line = next(x for x in out.read_text().splitlines() if x.startswith("SEEN "))
        assert json.loads(line[5:])["target_rank"] == rank


def test_the_same_first_batch_fed_at_every_step_is_the_loop_feeding_64_rows(tk):
    """``xb, yb = next(iter(train_ds))`` inside the step loop: train_on_batch sees the same 64
    rows every step. The capture notes the data came round after one batch (``rows_repeat``);
    the model memorises 64 examples, located at the line that draws them. (train_on_batch
    loops had no kept batches at all: no trainer, no live probe.)"""
    import tensorflow as tf

    import model_debugger
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    X, y = problem(2048)
    Xv, yv = problem(512, seed=1)
    train_ds = tf.data.Dataset.from_tensor_slices((X, y)).batch(64)
    with model_debugger.capture() as rec:
        tk.utils.set_random_seed(0)
        model = tk.Sequential([tk.Input((10,)), tk.layers.Dense(256, activation="relu"),
                               tk.layers.Dense(256, activation="relu"), tk.layers.Dense(2)])
        model.compile(optimizer=tk.optimizers.Adam(3e-3),
                      loss=tk.losses.SparseCategoricalCrossentropy(from_logits=True))
        for epoch in range(6):
            for _ in range(30):
                xb, yb = next(iter(train_ds))  # <first-batch>
                model.train_on_batch(xb, yb)
            print(f"epoch {epoch} val_loss {model.evaluate(Xv, yv, verbose=0):.4f}")
    assert [e["distinct"] for e in rec.events if e["t"] == "rows_repeat"] == [64]
    source = {HERE: open(HERE, encoding="utf-8").read()}
    ctx = build_context(Run(rec.events), rec.keeper, source, budget=60.0)
    assert ctx.trainer is not None
    [f] = [f for f in run_probes(ctx, ["data_volume"]).findings if f.confirmed]
    assert f.root_cause == "training_loop" and f.location["line"] == line_of("first-batch")


def test_a_healthy_train_on_batch_loop_keeps_every_batch_once(tk):
    """A new slice each step: the timed train function keeps the batch and the traced loss
    hook does not keep it again (kept twice, every such loop 'came round' at its first step)."""
    import model_debugger

    X, y = problem(2048)
    with model_debugger.capture() as rec:
        model = tk.Sequential([tk.Input((10,)), tk.layers.Dense(16), tk.layers.Dense(2)])
        model.compile(optimizer="adam",
                      loss=tk.losses.SparseCategoricalCrossentropy(from_logits=True))
        for i in range(0, 2048, 64):
            model.train_on_batch(X[i:i + 64], y[i:i + 64])
    assert not [e for e in rec.events if e["t"] == "rows_repeat"]
    assert len(rec.keeper.train_batches) == 32


def test_a_subclassed_model_is_cloned_from_its_config(tk):
    """Keras takes a clone_function for Sequential and functional models only."""
    from model_debugger.trainers.keras import _clone

    class Net(tk.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense = tk.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    net = Net()
    net(np.zeros((1, 3), "float32"))
    assert type(_clone(tk, net)) is Net


def test_a_compiled_custom_loss_function_is_no_broadcast_hypothesis(tk):
    """Keras squeezes the shapes for a compiled loss, a custom function included."""
    import model_debugger
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    def my_mse(y_true, y_pred):
        return tk.ops.mean(tk.ops.square(y_true - y_pred))

    X, y = problem()
    with model_debugger.capture() as rec:
        model = tk.Sequential([tk.Input((10,)), tk.layers.Dense(8), tk.layers.Dense(1)])
        model.compile(optimizer="adam", loss=my_mse)
        model.fit(X, y.astype("float32"), epochs=1, verbose=0)
    ctx = build_context(Run(rec.events), rec.keeper, {}, budget=30.0)
    assert run_probes(ctx, ["loss_broadcast"]).findings == ()


def _one_batch_epoch(tf, model, opt, loss_fn, ds):
    for xb, yb in ds:
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return float(loss)  # <keras-left-early>


def test_a_tape_loop_that_leaves_each_pass_over_its_dataset_early_is_the_cause(tk):
    """A ``return`` inside the batch loop: each of 20 epochs trains on one of 20 batches. The
    capture counts the batches each pass over the tf.data dataset drew; training_length names
    the loop's exit (training_loop), not the batch size."""
    import tensorflow as tf

    import model_debugger
    from model_debugger.probing import build_context, probe
    from model_debugger.records import Classification, Run

    X, y = problem(640)
    with model_debugger.capture() as rec:
        tk.utils.set_random_seed(0)
        ds = tf.data.Dataset.from_tensor_slices((X, y)).shuffle(640, seed=0).batch(32)
        model = tk.Sequential([tk.Input((10,)), tk.layers.Dense(32, activation="relu"),
                               tk.layers.Dense(2)])
        opt = tk.optimizers.SGD(0.01)
        loss_fn = tk.losses.SparseCategoricalCrossentropy(from_logits=True)
        for _epoch in range(20):
            _one_batch_epoch(tf, model, opt, loss_fn, ds)
    run = Run(rec.events)
    passes = run.first("passes")
    assert passes["batches"] == 20 and passes["drawn"] == [1] * 20
    ctx = build_context(run, rec.keeper, {HERE: open(HERE, encoding="utf-8").read()},
                        budget=60.0, classification=Classification("loss_not_decreasing"))
    found = [f for f in probe(ctx, ["training_length"]).findings if f.confirmed]
    assert found and found[0].root_cause == "training_loop", found
    assert found[0].location["line"] == line_of("keras-left-early")


def test_a_keras_callback_that_decays_the_rate_every_few_batches_is_the_schedule(tk):
    """A callback meant per epoch, hooked per batch: the rate collapses within the first
    epoch. The capture follows the optimizer's learning_rate (``lr`` events); lr_schedule
    confirms by experiment and is located where the callback writes the rate."""
    import model_debugger
    from model_debugger.probing import build_context, probe
    from model_debugger.records import Classification, Run

    class Decay(tk.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch % 5 == 4:
                rate = float(self.model.optimizer.learning_rate)
                self.model.optimizer.learning_rate = rate * 0.3  # <keras-rate-written>

    X, y = problem(1024)
    with model_debugger.capture() as rec:
        tk.utils.set_random_seed(0)
        model = tk.Sequential([tk.Input((10,)), tk.layers.Dense(32, activation="relu"),
                               tk.layers.Dense(2)])
        model.compile(optimizer=tk.optimizers.SGD(0.05),
                      loss=tk.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(X, y, batch_size=32, epochs=3, verbose=0, callbacks=[Decay()])
    run = Run(rec.events)
    rates = [e["lr"] for e in run.of("lr")]
    assert rates[0] == pytest.approx(0.05) and rates[-1] < 1e-4 * rates[0]
    ctx = build_context(run, rec.keeper, {HERE: open(HERE, encoding="utf-8").read()},
                        budget=60.0, classification=Classification("loss_not_decreasing"))
    assert ctx.signals["lr_collapsed_share"] > 0.5
    found = [f for f in probe(ctx, ["lr_schedule"]).findings if f.confirmed]
    assert found and found[0].location["line"] == line_of("keras-rate-written"), found


def test_keras_recurrent_layers_without_tanh_are_found_and_squashed(tk):
    """An LSTM built with activation="linear" (its state unbounded) and one with the default:
    only the first is named, and the copy's cell gets tanh back."""
    from model_debugger.probes.recurrent_activation import squash, unbounded

    keras = tk
    model = keras.Sequential([keras.Input((20, 3)),
                              keras.layers.LSTM(8, return_sequences=True),
                              keras.layers.LSTM(8, activation="linear", name="open_state"),
                              keras.layers.Dense(1)])
    assert unbounded(model) == {"open_state": ("LSTM", "linear")}
    x = np.random.default_rng(0).normal(size=(4, 20, 3)).astype("float32")
    before = model(x).numpy()
    assert unbounded(squash(model)) == {}
    assert not np.allclose(model(x).numpy(), before)  # the cell computes with tanh now


def _two_heads(keras, stay_activation: str | None, as_list: bool = False,
               misaligned: bool = False):
    """A classification head beside a regression head on standardised (signed) targets.

    ``misaligned``: the classification labels permuted apart from their rows, a quarter of
    the rows held out for validation."""
    import model_debugger
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    rng = np.random.default_rng(3)
    X = rng.standard_normal((1024, 8)).astype("float32")
    risk = (X[:, 0] + X[:, 1] > 0).astype("int64")
    stay = (X[:, 2] - X[:, 3]).astype("float32")
    stay = (stay - stay.mean()) / stay.std()
    if misaligned:
        risk = rng.permutation(risk)
    with model_debugger.capture() as rec:
        keras.utils.set_random_seed(0)
        inputs = keras.Input((8,))
        h = keras.layers.Dense(32, activation="relu")(inputs)
        risk_out = keras.layers.Dense(2, name="risk")(h)
        stay_h = keras.layers.Dense(16, activation="relu")(h)
        stay_out = keras.layers.Dense(1, activation=stay_activation)(stay_h)  # <stay-head>
        losses = [keras.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"]
        if as_list:
            model = keras.Model(inputs, [risk_out, stay_out])
            model.compile(optimizer=keras.optimizers.Adam(2e-3), loss=losses)
            targets = [risk, stay]
        else:
            model = keras.Model(inputs, {"risk": risk_out, "stay": stay_out})
            model.compile(optimizer=keras.optimizers.Adam(2e-3),
                          loss=dict(zip(("risk", "stay"), losses)))
            targets = {"risk": risk, "stay": stay}
        model.fit(X, targets, batch_size=64, epochs=3, verbose=0,
                  validation_split=0.25 if misaligned else 0.0)
    source = {HERE: open(HERE, encoding="utf-8").read()}
    return build_context(Run(rec.events), rec.keeper, source, budget=60.0)


@pytest.mark.parametrize("as_list", [False, True], ids=["dict", "list"])
def test_a_head_of_a_multi_output_model_that_cannot_reach_its_targets(tk, as_list):
    """``fit(x, {"risk": ..., "stay": ...})``: each output's targets and range are read like a
    single output's, so a ReLU on the standardised regression head (half its targets below 0)
    is a wrong solution, measured on that head and located at the layer that made it."""
    from model_debugger.probes import run_probes

    ctx = _two_heads(tk, "relu", as_list)
    heads = {e["head"]: e for e in ctx.run.of("head_targets")}
    assert heads["risk"]["loss"] == "cross_entropy" and sum(heads["risk"]["counts"]) > 0
    stay = [name for name in heads if name != "risk"]
    assert len(stay) == 1 and heads[stay[0]]["input_min"] == 0.0
    assert 0.3 < ctx.signals["output_range_unreachable"] < 0.7
    assert ctx.signals["output_range_head"] == stay[0]
    assert ctx.classification.primary == "convergence_to_wrong_solution"
    [f] = [f for f in run_probes(ctx, ["loss_output_mismatch"]).findings if f.confirmed]
    assert f.root_cause == "architecture" and f.evidence["head"] == stay[0]
    assert f.location["line"] == line_of("stay-head")


def test_a_head_that_learned_nothing_beside_one_that_did_is_a_stalled_loss(tk):
    """Labels permuted apart from their rows on the classification head: the summed loss falls
    with the regression head, the classification head's validation loss stays at its label
    prior's (ln 2): ``loss_not_decreasing``, naming that head."""
    ctx = _two_heads(tk, None, misaligned=True)
    assert ctx.signals["head_floor_name"] == "risk"
    assert ctx.signals["head_floor_share"] >= 0.95
    assert ctx.signals["head_constant_loss"] == pytest.approx(np.log(2), rel=0.05)
    assert ctx.classification.primary == "loss_not_decreasing"


def test_multi_output_heads_that_reach_their_targets_raise_nothing(tk):
    """The same model with a linear regression head: every head reaches its targets and
    learns."""
    from model_debugger.probes import run_probes

    ctx = _two_heads(tk, None)
    assert ctx.signals["head_floor_share"] < 0.9
    assert ctx.signals["output_range_unreachable"] == 0.0
    assert "output_range_head" not in ctx.signals
    assert ctx.classification.primary != "convergence_to_wrong_solution"
    assert not [f for f in run_probes(ctx, ["loss_output_mismatch"]).findings if f.confirmed]


def test_the_head_a_finding_names_is_found_where_it_was_made():
    """``head_layer_line``: the layer named after the output, else the value under its key in
    the outputs dict (its assignment); None when the name is made twice."""
    from model_debugger.pitfalls.keras_lint import head_layer_line

    src = ("a = f(x)\nb = Dense(1, name='stay')(a)\nc = Dense(1)(a)\nc = act(c)\n"
           "m = Model(x, {'stay': b, 'cost': c, 'risk': Dense(2)(a)})\n")
    assert head_layer_line(src, "stay") == 2
    assert head_layer_line(src, "cost") == 4  # the last assignment before the dict
    assert head_layer_line(src, "risk") == 5
    assert head_layer_line(src + "d = Dense(1, name='stay')(a)\n", "stay") is None
    assert head_layer_line("def (", "stay") is None
    listed = ("m2 = Model([x, z], [b, c])\nm3 = Model(inputs=[x], outputs=(Dense(3)(a), c))\n")
    assert head_layer_line(src + listed, "dense_1", index=0) is None  # b at 2, a call at 7
    assert head_layer_line(src + listed, "dense_1", index=1) == 4  # c in both models
    assert head_layer_line(src + listed, "dense_1") is None
    filled = ("outs = {}\nouts['stay'] = Dense(1, activation='relu')(h)\nm = Model(x, outs)\n"
              "y_stay = (stay - m) / s\nm.fit(X, {'risk': y_risk, 'stay': y_stay})\n")
    assert head_layer_line(filled, "stay") == 2  # not the targets given to fit


RELU_RATE = """\
import numpy as np
import tensorflow as tf
import keras

rng = np.random.default_rng(0)
X = rng.standard_normal((512, 6)).astype("float32")
y = rng.poisson(np.exp(0.3 * X[:, 0])).astype("float32")
keras.utils.set_random_seed(0)
inp = keras.Input((6,))
hidden = keras.layers.Dense(16, activation="tanh")(inp)
rate = keras.layers.Dense(1, activation="relu")(hidden)
model = keras.Model(inp, rate)
opt = keras.optimizers.Adam(1e-2)


@tf.function
def step(xb, yb):
    with tf.GradientTape() as tape:
        r = tf.squeeze(model(xb, training=True), -1)
        loss = tf.reduce_mean(r - yb * tf.math.log(r))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


for xb, yb in tf.data.Dataset.from_tensor_slices((X, y)).batch(64):
    step(xb, yb)
"""


def test_a_traced_loop_whose_loss_takes_the_log_of_a_relu_output(tk, tmp_path):
    """A ``tf.function`` step over ``tf.data``, a Poisson NLL by hand on a ReLU rate head:
    NaN at step 0. Keras applies the (NaN) update before the capture reads the loss, so the
    forward is replayed on a copy at the initial weights, on the batch the loop drew: finite,
    half of it exactly 0. Confirmed, located at the output layer (not the first layer, whose
    weights the update had made NaN)."""
    import runpy

    import model_debugger
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    path = tmp_path / "rate.py"
    path.write_text(RELU_RATE)
    with model_debugger.capture() as rec:
        runpy.run_path(str(path))
    ctx = build_context(Run(rec.events), rec.keeper, {str(path): RELU_RATE}, budget=60.0)
    bad = ctx.run.first("nonfinite")
    assert bad["step"] == 0 and bad["forward"] == "finite" and bad["output_zeros"] > 0.05
    assert bad["module"] is None  # every layer finite before the update
    [f] = [f for f in run_probes(ctx, ["gradient_flow"]).findings if f.confirmed]
    assert f.root_cause == "architecture" and f.location == {"file": str(path), "line": 11}


def test_copies_of_a_model_with_adapted_lookup_layers_keep_their_vocabulary(tk):
    """``IntegerLookup`` / ``StringLookup`` adapted before ``fit`` hold their vocabulary in a
    lookup table, not in the config or the weights: a clone's table was empty ("Table not
    initialized") and every probe that trains a copy failed. The copy now predicts as the
    user's model did at the start and trains."""
    import model_debugger
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    rng = np.random.default_rng(0)
    num = rng.standard_normal((512, 3)).astype("float32")
    plan = rng.choice(np.array([101, 205, 333]), 512).astype("int64")
    city = rng.choice(np.array(["oslo", "rome", "lima"]), 512).astype(object)
    y = ((plan == 205) ^ (num[:, 0] > 0)).astype("float32")
    with model_debugger.capture() as rec:
        tk.utils.set_random_seed(0)
        plan_lookup = tk.layers.IntegerLookup(output_mode="one_hot")
        plan_lookup.adapt(plan)
        city_lookup = tk.layers.StringLookup(output_mode="one_hot")
        city_lookup.adapt(city)
        n_in = tk.Input((3,), name="num")
        p_in = tk.Input((), dtype="int64", name="plan")
        c_in = tk.Input((), dtype="string", name="city")
        h = tk.layers.Concatenate()([n_in, plan_lookup(p_in), city_lookup(c_in)])
        model = tk.Model({"num": n_in, "plan": p_in, "city": c_in},
                         tk.layers.Dense(1, activation="sigmoid")(
                             tk.layers.Dense(16, activation="relu")(h)))
        x = {"num": num, "plan": plan, "city": city}
        start = model(x).numpy()
        model.compile(optimizer="adam", loss="binary_crossentropy")
        model.fit(x, y, batch_size=64, epochs=2, verbose=0)
    ctx = build_context(Run(rec.events), rec.keeper, {}, budget=60.0)
    assert ctx.trainer is not None
    assert list(ctx.trainer._x(tuple(ctx.trainer.inputs))) == ["num", "plan", "city"]
    fresh = ctx.trainer.fresh_model()
    np.testing.assert_allclose(fresh(x).numpy()[:8], start[:8], rtol=1e-5,
                               atol=1e-6)
    inputs, target = ctx.trainer.subset(ctx.trainer.randperm(ctx.trainer.n, 0)[:256])
    losses = ctx.trainer.fit(fresh, inputs, target, 20, lr=0.01)
    assert len(losses) == 20 and np.isfinite(losses).all()


def test_the_label_witness_reads_every_input_of_a_multi_input_model():
    """A k-NN told labels from the inputs only for one input: with a model fed a dict of
    inputs, real labels no better than shuffled for the copies was confirmed as misalignment
    even when the labels were aligned (the copies failed for another reason)."""
    from types import SimpleNamespace

    from model_debugger.probes.label_alignment import WITNESS_MARGIN, _witness

    rng = np.random.default_rng(0)
    big = rng.standard_normal((600, 2)) * 1e8  # a column in the hundreds of millions
    cat = rng.integers(0, 3, 600).astype(np.float64)
    y = (cat == 1).astype(np.int64)  # told by the second input alone
    ctx = SimpleNamespace(trainer=SimpleNamespace(loss_fn=SimpleNamespace(
        __name__="cross_entropy")))
    real, shuffled, _noise = _witness(ctx, (big, cat), y, np.random.default_rng(1))
    assert real >= shuffled + WITNESS_MARGIN


POOLED_NORM = """\
import numpy as np
import keras

rng = np.random.default_rng(0)
n = 3000
small = rng.uniform(0, 1, (n, 2))
big = rng.normal(2e5, 5e4, (n, 2))
X = np.concatenate([small, big], axis=1).astype("float32")
y = ((small[:, 0] - 0.5) * (small[:, 1] - 0.5) > 0).astype("float32")
keras.utils.set_random_seed(0)
norm = keras.layers.Normalization(AXIS)
norm.adapt(X)
inp = keras.Input((4,))
h = keras.layers.Dense(32, activation="relu")(norm(inp))
out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dense(16, activation="relu")(h))
model = keras.Model(inp, out)
model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy")
model.fit(X[:2400], y[:2400], validation_data=(X[2400:], y[2400:]), epochs=4, batch_size=64,
          verbose=0)
"""


@pytest.mark.parametrize("axis, confirmed", [("axis=None", True), ("", False)],
                         ids=["pooled", "per-feature"])
def test_a_normalization_inside_the_model_is_judged_by_what_it_gives(tk, tmp_path, axis,
                                                                     confirmed):
    """``Normalization(axis=None)`` adapted on features in [0, 1] and in the hundreds of
    thousands: one mean and spread for all, so after it the small features are a constant.
    The raw scales say nothing (the model normalises them itself); the layer's output does,
    and a copy fed inputs the layer turns into standardised features trains clearly better:
    confirmed where the layer was made. Adapted per feature, the same raw scales raise
    nothing."""
    from model_debugger.probes import run_probes

    path = tmp_path / "pooled.py"
    ctx = _stuck_script(path, POOLED_NORM.replace("AXIS", axis))
    found = run_probes(ctx, ["feature_scaling"]).findings
    if confirmed:
        [f] = [f for f in found if f.confirmed]
        assert f.root_cause == "data" and f.location == {"file": str(path), "line": 11}
        assert f.evidence["std_ratio_after_layer"] > 100
    else:
        assert not [f for f in found if f.confirmed]


def test_copies_take_dict_inputs_by_the_keys_the_model_was_built_with(tk):
    """``keras.Model({"a": Input(name="z_num"), "b": Input(name="a_cat")}, out)``: Keras
    matches a dict by its keys, not by the inputs' names; the kept tuple (``model.inputs``
    order) is packed back into that structure."""
    import model_debugger
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    rng = np.random.default_rng(0)
    xa, xb = rng.standard_normal((256, 3)), rng.standard_normal((256, 5))
    y = (xa[:, 0] + xb[:, 1] > 0).astype("float32")
    with model_debugger.capture() as rec:
        tk.utils.set_random_seed(0)
        a, b = tk.Input((3,), name="z_num"), tk.Input((5,), name="a_cat")
        h = tk.layers.Dense(8, activation="relu")(tk.layers.Concatenate()([a, b]))
        model = tk.Model({"a": a, "b": b}, tk.layers.Dense(1, activation="sigmoid")(h))
        model.compile(optimizer="adam", loss="binary_crossentropy")
        model.fit({"a": xa, "b": xb}, y, batch_size=64, epochs=2, verbose=0)
    ctx = build_context(Run(rec.events), rec.keeper, {}, budget=60.0)
    fresh = ctx.trainer.fresh_model()
    losses = ctx.trainer.fit(fresh, tuple(ctx.trainer.inputs), ctx.trainer.targets, 5)
    assert len(losses) == 5 and np.isfinite(losses).all()


FEW_ROWS_FIT = '''import keras
import numpy as np

rng = np.random.default_rng(5)
features = rng.normal(size=(1500, 6)).astype("float32")
grade = np.digitize(features[:, 0] + 2 * features[:, 2] - features[:, 4], [-1.0, 1.0])
keras.utils.set_random_seed(1)
clf = keras.Sequential([keras.Input((6,)), keras.layers.Dense(48, activation="relu"),
                        keras.layers.Dense(3, activation="softmax")])
clf.compile(optimizer=keras.optimizers.Adam(0.003), loss="sparse_categorical_crossentropy")
clf.fit(features[:30], grade[:30], epochs=8, batch_size=32, verbose=0)
'''


def test_a_learning_curve_locates_too_few_rows_at_the_fit_that_slices_them(tk, tmp_path):
    """``fit(features[:30], grade[:30])``: 30 rows of a 3-class task, eight one-batch epochs, a
    loss still at the prior's. Copies on all 30 rows beat copies on a third of them on held-out
    rows: too few rows, confirmed at the ``fit`` line whose slice chose them (was: the model)."""
    from model_debugger.probes import run_probes

    path = tmp_path / "few.py"
    ctx = _stuck_script(path, FEW_ROWS_FIT)
    [f] = [f for f in run_probes(ctx, ["data_volume"]).findings if f.confirmed]
    assert f.root_cause == "data" and f.evidence["rows"] == 30
    assert (f.location["file"], f.location["line"]) == (str(path), 11)


def _stuck_script(path, source: str, primary: str = "loss_not_decreasing"):
    """Run ``source`` saved at ``path`` under capture; its Isolate context (a stuck loss)."""
    import runpy

    import model_debugger
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    path.write_text(source)
    with model_debugger.capture() as rec:
        runpy.run_path(str(path))
    return build_context(Run(rec.events), rec.keeper, {str(path): source}, budget=60.0,
                         classification={"primary": primary, "secondary": [],
                                         "evidence": []})


SQUASHED = '''import keras
import numpy as np

rng = np.random.default_rng(2)
x = rng.normal(size=(1200, 20)).astype("float32")
t = (x[:, :4].sum(1) > 0).astype("int64") + 2 * (x[:, 4] > 0)
SQUASH = "sigmoid"
keras.utils.set_random_seed(3)
net = keras.Sequential([keras.Input((20,))]
                       + [keras.layers.Dense(48, activation=SQUASH) for _ in range(12)]
                       + [keras.layers.Dense(4, activation="softmax")])
net.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
net.fit(x, t, epochs=3, batch_size=32, verbose=0)
'''


def test_vanishing_gradients_are_located_where_the_hidden_activation_is_set(tk, tmp_path):
    """Twelve sigmoid layers, their activation passed by a name: the gradients of the first
    ones vanish, and the finding sits where ``SQUASH = "sigmoid"`` is set (the line to
    change), not on the model (was: its line)."""
    from model_debugger.probes import run_probes

    path = tmp_path / "squash.py"
    ctx = _stuck_script(path, SQUASHED)
    [f] = [f for f in run_probes(ctx, ["gradient_flow"]).findings if f.confirmed]
    assert f.root_cause == "architecture" and f.evidence["vanishing_layers"]
    assert (f.location["file"], f.location["line"]) == (str(path), 7)


SLOW_MAP = '''import time

import keras
import numpy as np
import tensorflow as tf

rng = np.random.default_rng(0)
x = rng.normal(size=(2048, 16)).astype("float32")
t = (x[:, 0] > 0).astype("int64")


def jitter(row, label):
    def by_hand(v):
        time.sleep(0.002)
        return v.numpy() + np.float32(0.01)
    row = tf.py_function(by_hand, [row], Tout=tf.float32)
    row.set_shape([16])
    return row, label


pipeline = tf.data.Dataset.from_tensor_slices((x, t)).map(jitter).batch(64)
net = keras.Sequential([keras.Input((16,)), keras.layers.Dense(2)])
net.compile(optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
net.fit(pipeline, epochs=1, verbose=0)
'''


def test_a_slow_tf_data_map_is_located_at_the_function_it_maps(tk, tmp_path):
    """A ``py_function`` per element in ``Dataset.map``: loading a batch takes longer than the
    step, located at the ``def`` of the mapped function (was: no location at all)."""
    from model_debugger.probes import run_probes

    path = tmp_path / "slow_map.py"
    ctx = _stuck_script(path, SLOW_MAP, primary="performance_issue")
    [f] = [f for f in run_probes(ctx, ["dataloader_throughput"]).findings if f.confirmed]
    assert f.root_cause == "data"
    assert (f.location["file"], f.location["line"]) == (str(path), 12)



@pytest.mark.parametrize("tilted", [True, False], ids=["balanced_weighted_25", "inverse_frequency"])
def test_class_weights_that_tilt_balanced_classes_are_confirmed_by_copies_without(tk, tilted):
    """``fit(class_weight=...)`` weighing one of two balanced classes 25 to 1: the copies train
    with the class weights as ``fit`` did, and one without them reaches a clearly lower plain
    held-out loss (a decisive finding where the weights are written); weights at inverse
    frequency on 10% positives even the classes out (no finding)."""
    import model_debugger
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    keras = tk
    rng = np.random.default_rng(0)
    X = rng.standard_normal((1024, 8)).astype("float32")
    score = X[:, 0] + X[:, 1] + 0.3 * rng.standard_normal(1024)
    y = (score > np.quantile(score, 0.5 if tilted else 0.9)).astype("float32")
    with model_debugger.capture() as rec:
        keras.utils.set_random_seed(0)
        weighed = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                                    keras.layers.Dense(1, activation="sigmoid")])
        weighed.compile(optimizer="adam", loss="binary_crossentropy")
        weighed.fit(X, y, batch_size=64, epochs=4, verbose=0,
                    class_weight={0: 1.0, 1: 25.0} if tilted else {0: 1.0, 1: 9.0})  # <cw>
    run = Run(rec.events)
    targets = run.of("targets")[-1]
    assert targets["weights"] == "class_weight" and targets["class_weight"][1] in (25.0, 9.0)
    ctx = build_context(run, rec.keeper, {HERE: open(HERE, encoding="utf-8").read()},
                        budget=60.0)
    assert ctx.trainer.loss_kwargs["class_weight"].tolist() == targets["class_weight"]
    got = run_probes(ctx, ["loss_weights"]).findings
    if not tilted:
        assert not got
        return
    [f] = got
    assert (f.check, f.root_cause, f.confirmed) == ("loss_weights", "hyperparameter", True)
    assert f.evidence["tilt"] == pytest.approx(25.0, rel=0.05) and f.evidence["decisive"]
    assert f.location == {"file": HERE, "line": line_of("cw")}


def test_run_eagerly_left_on_is_recorded_and_timed_against_compiled(tk, monkeypatch):
    """``compile(run_eagerly=True)`` writes a ``debug_mode`` event; the probe times a copy's
    steps run eagerly and compiled (restoring TensorFlow's setting) and locates the finding
    where the mode is turned on. (The rows per second are made to depend on the mode here.)"""
    import tensorflow as tf

    import model_debugger
    from model_debugger.probes import compute_settings as cs
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    keras = tk
    X, y = problem()
    with model_debugger.capture() as rec:
        keras.utils.set_random_seed(0)
        eager = keras.Sequential([keras.Input((10,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(2)])
        eager.compile(optimizer="adam", run_eagerly=True,  # <run-eagerly>
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        eager.fit(X, y, batch_size=32, epochs=1, verbose=0)
    run = Run(rec.events)
    assert run.first("debug_mode")["mode"] == "run_eagerly"
    ctx = build_context(run, rec.keeper, {HERE: open(HERE, encoding="utf-8").read()},
                        budget=60.0)
    monkeypatch.setattr(cs, "MIN_RUN_SECONDS", 0.0)
    monkeypatch.setattr(type(ctx.trainer), "throughput",
                        lambda self, batch, steps=20, model=None:
                        100.0 if tf.config.functions_run_eagerly() else 1000.0)
    [f] = run_probes(ctx, ["compute_settings"]).findings
    assert not tf.config.functions_run_eagerly()  # (restored)
    assert (f.root_cause, f.confirmed, f.evidence["mode"]) == ("training_loop", True,
                                                               "run_eagerly")
    assert f.location == {"file": HERE, "line": line_of("run-eagerly")}


def _dropping(keras, passed: bool):
    class Wide(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(256, activation="relu")
            self.drop = keras.layers.Dropout(0.5)
            self.head = keras.layers.Dense(3)

        def call(self, x, training=False):
            h = self.hidden(x)
            if passed:
                h = self.drop(h, training=training)
            else:
                self.drop(h, training=training)  # <keras-dropped>
            return self.head(h)

    return Wide()


def test_a_dropout_whose_output_call_drops_is_found_and_confirmed_on_an_overfitting_run(tk):
    """``self.drop(h, training=training)`` without ``h =``: the subclassed model trains with
    no dropout and overfits. One traced pass of a copy finds the layer (the model's output
    reaches its input, not its output), located at the call; a copy with the output passed
    on ends at a clearly lower held-out loss; the same model that uses the output has none."""
    import model_debugger
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    keras = tk
    rng = np.random.default_rng(5)
    X = rng.standard_normal((2000, 30)).astype("float32")
    y = (X[:, :3] @ np.array([1.0, -1.0, 0.5]) > 0).astype("int64") + \
        (X[:, 3] > 0.8).astype("int64")
    y = np.where(rng.random(2000) < 0.25, rng.integers(0, 3, 2000), y)  # noisy labels
    contexts = {}
    for passed in (False, True):
        with model_debugger.capture() as rec:
            keras.utils.set_random_seed(0)
            wide = _dropping(keras, passed)
            wide.compile(optimizer=keras.optimizers.Adam(3e-3),
                         loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            wide.fit(X[:1500], y[:1500], validation_data=(X[1500:], y[1500:]), batch_size=32,
                     epochs=20, verbose=0)
        contexts[passed] = build_context(Run(rec.events), rec.keeper,
                                         {HERE: open(HERE, encoding="utf-8").read()},
                                         budget=90.0)
    ctx = contexts[False]
    assert ctx.classification.primary == "overfitting", ctx.classification
    [dropped] = ctx.trainer.discarded_outputs()
    assert dropped["layer"] == ctx.trainer.model.drop.name and dropped["kind"] == "Dropout"
    assert contexts[True].trainer.discarded_outputs() == []
    [f] = run_probes(ctx, ["unused_output"]).findings
    assert (f.check, f.root_cause, f.confirmed) == ("unused_output", "architecture", True), f
    assert f.location == {"file": HERE, "line": line_of("keras-dropped")}
    assert f.evidence["heldout_passed_on"] < 0.8 * f.evidence["heldout_as_written"]
    assert not [layer for layer in ctx.trainer.fresh_model().layers if "call" in vars(layer)]


def test_a_plateau_callback_that_cuts_the_rate_is_the_schedule_where_it_was_made(tk):
    """``ReduceLROnPlateau`` watching validation accuracy with ``mode="min"`` cuts the rate at
    every patience: the learning rate collapses. The callback is the run's ``scheduler``
    reference, so the schedule finding is located where it was made, not at the optimizer."""
    import model_debugger
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    keras = tk
    X, y = problem()
    Xv, yv = problem(256, seed=1)
    with model_debugger.capture() as rec:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        cut = keras.callbacks.ReduceLROnPlateau(monitor="val_loss", mode="max",  # <plateau>
                                                factor=0.05, patience=0, min_lr=1e-9)
        model.fit(X, y, batch_size=64, epochs=8, verbose=0, validation_data=(Xv, yv),
                  callbacks=[cut])
    run = Run(rec.events)
    assert run.refs()["scheduler"] == {"file": HERE, "line": line_of("plateau")}
    ctx = build_context(run, rec.keeper, {HERE: open(HERE, encoding="utf-8").read()},
                        budget=60.0)
    findings = [f for f in run_probes(ctx, ["lr_schedule"]).findings
                if not f.evidence.get("probe_error")]
    assert findings and findings[0].location["line"] == line_of("plateau"), findings


def test_a_full_batch_fit_that_makes_too_few_updates_is_the_batch_size(tk):
    """``fit(batch_size=len(X))`` with plain SGD: one update an epoch. Training longer at that
    batch crawls; the same rows in batches of 32 learn. Located where the batch size was set
    (the name passed to ``fit``), a specific cause that outranks the learning rate."""
    import model_debugger
    from model_debugger.probing import build_context, probe
    from model_debugger.records import Classification, Run

    X, y = problem(1280)
    with model_debugger.capture() as rec:
        tk.utils.set_random_seed(0)
        model = tk.Sequential([tk.Input((10,)), tk.layers.Dense(32, activation="relu"),
                               tk.layers.Dense(2, activation="softmax")])
        model.compile(optimizer=tk.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
        batch = len(X)  # <whole-batch>
        model.fit(X, y, batch_size=batch, epochs=12, verbose=0)
    ctx = build_context(Run(rec.events), rec.keeper, {HERE: open(HERE, encoding="utf-8").read()},
                        budget=60.0, classification=Classification("loss_not_decreasing"))
    found = [f for f in probe(ctx, ["training_length"]).findings if f.confirmed]
    assert found and found[0].root_cause == "hyperparameter", found
    f = found[0]
    assert f.evidence["small_batch"] == 32 and f.evidence["loss_small_batch"] < \
        0.75 * f.evidence["loss_as_run"], f.evidence
    assert f.location["line"] == line_of("whole-batch"), f.location
