"""Capture of real Keras 3 (TensorFlow backend) training, in process.

The record must have the PyTorch instrument's schema; every number is checked against a plain
reference computed by the test itself (a ``GradientTape`` over the same batch, Keras' own epoch
losses), and everything patched is restored afterwards.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
import keras  # noqa: E402
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer  # noqa: E402
from keras.src.optimizers.base_optimizer import BaseOptimizer  # noqa: E402
from keras.src.trainers.trainer import Trainer  # noqa: E402

from model_debugger import capture  # noqa: E402
from model_debugger.classify import classify  # noqa: E402
from model_debugger.records import Run  # noqa: E402
from model_debugger.signals import compute  # noqa: E402

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))


def line_of(marker: str) -> int:
    with open(HERE, encoding="utf-8") as fh:
        hits = [i for i, line in enumerate(fh, 1) if line.rstrip().endswith(f"# <{marker}>")]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def data(n=256, d=8, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype("float32")
    return X, (X[:, 0] + 0.5 * X[:, 1] > 0).astype("int64")


def mlp(d=8, seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((d,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(2)])


def ce():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def custom_step(model, traced: bool, **settings):
    """A custom training step (Adam, cross-entropy on logits), a ``tf.function`` or eager."""
    optimizer, loss_fn = keras.optimizers.Adam(1e-2, **settings), ce()

    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return tf.function(train_step) if traced else train_step


def test_fit_record_has_the_torch_schema_and_code_references():
    X, y = data()
    Xv, yv = data(128, seed=1)
    with capture() as rec:
        model = mlp()  # <model>
        opt = keras.optimizers.SGD(learning_rate=0.1, momentum=0.5)  # <opt>
        model.compile(optimizer=opt, loss=ce(), metrics=["accuracy"])  # <compile>
        model.fit(X, y, batch_size=32, epochs=3, validation_data=(Xv, yv), verbose=0)  # <fit>
    run = Run(rec.events)
    steps = run.steps
    assert len(steps) == 3 * 8 and [s["i"] for s in steps] == list(range(24))
    assert [s["ep"] for s in steps] == [0] * 8 + [1] * 8 + [2] * 8
    for s in steps:
        assert isinstance(s["loss"], float) and math.isfinite(s["loss"])
        assert s["gn"] > 0 and list(s["mgn"]) == [layer.name for layer in model.layers]
        assert math.isclose(s["gn"], math.hypot(*s["mgn"].values()), rel_tol=1e-6)
        assert s["dw"] >= 0 and s["rss"] > 0
    assert steps[0]["dt"] is None and all(s["dt"] > 0 for s in steps[1:8])
    refs = run.refs()
    for kind, marker in (("model", "model"), ("optimizer", "opt"), ("compile", "compile"),
                         ("fit", "fit"), ("backward", "fit"), ("step", "fit")):
        assert refs[kind] == {"file": HERE, "line": line_of(marker)}, kind
    model_ev, opt_ev = run.first("model"), run.first("optimizer")
    assert model_ev["framework"] == "keras" and model_ev["params"] == model.count_params()
    assert model_ev["modules"] == [layer.name for layer in model.layers]
    assert model_ev["name"] == "model"
    assert opt_ev["cls"] == "SGD" and opt_ev["hyper"]["lr"] == 0.1
    assert opt_ev["hyper"]["momentum"] == 0.5
    metrics = run.metrics()
    assert [round(v, 6) for *_, v in metrics["val_loss"]] == \
        [round(v, 6) for v in model.history.history["val_loss"]]
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(metrics)
    targets = run.of("targets")[-1]
    assert targets["loss"] == "cross_entropy" and targets["n"] == 3 * 256
    assert targets["counts"] == (3 * np.bincount(y)).tolist()
    sig = compute(run)
    assert sig["val_points"] == 3 and sig["constant_predictor_loss"] > 0
    assert classify(sig).primary in ("healthy", "overfitting", "loss_not_decreasing")


def test_step_loss_and_gradient_norms_match_a_reference_tape():
    X, y = data(64)
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.0), loss=ce())
    with tf.GradientTape() as tape:
        ref_loss = ce()(y[:32], model(X[:32], training=True))
    grads = tape.gradient(ref_loss, model.trainable_variables)
    ref = [float(tf.norm(g)) for g in grads]
    with capture() as rec:
        model.fit(X, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    steps = Run(rec.events).steps
    assert len(steps) == 4
    first = steps[0]
    assert math.isclose(first["loss"], float(ref_loss), rel_tol=1e-5)
    names = [layer.name for layer in model.layers]
    assert list(first["mgn"]) == names
    for k, name in enumerate(names):  # kernel and bias of each Dense layer
        assert math.isclose(first["mgn"][name], math.hypot(*ref[2 * k:2 * k + 2]), rel_tol=1e-5)
    assert math.isclose(first["gn"], math.sqrt(sum(v * v for v in ref)), rel_tol=1e-5)
    # lr = 0: the same batch gives the same numbers in the second epoch
    assert math.isclose(steps[2]["loss"], first["loss"], rel_tol=1e-6)
    # per-step losses average to Keras' own epoch loss
    keras_loss = model.history.history["loss"]
    assert math.isclose(np.mean([s["loss"] for s in steps[2:]]), keras_loss[1], rel_tol=1e-5)


def test_model_fitted_before_the_capture_is_retraced_and_measured():
    X, y = data(64)
    model = mlp()
    model.compile(optimizer="adam", loss=ce())
    model.fit(X, y, batch_size=32, epochs=1, verbose=0)
    with capture() as rec:
        model.fit(X, y, batch_size=32, epochs=1, verbose=0)
        model.fit(X, y, batch_size=32, epochs=1, verbose=0)  # no new trace: same stash
    steps = Run(rec.events).steps
    assert len(steps) == 4 and all(s["gn"] > 0 and "mgn" in s for s in steps)
    assert [s["ep"] for s in steps] == [0, 0, 1, 1]


def test_custom_loops_eager_and_tf_function():
    X, y = data(128)
    with capture() as rec:
        model = mlp()
        optimizer = keras.optimizers.Adam(1e-2)
        loss_fn = ce()
        for i in range(0, 64, 32):
            with tf.GradientTape() as tape:
                loss = loss_fn(y[i:i + 32], model(X[i:i + 32], training=True))  # <loop-loss>
            grads = tape.gradient(loss, model.trainable_variables)  # <loop-backward>
            optimizer.apply_gradients(zip(grads, model.trainable_variables))  # <loop-step>

        @tf.function
        def train_step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        traced = [float(train_step(X[i:i + 32], y[i:i + 32])) for i in range(64, 128, 32)]
    run = Run(rec.events)
    steps = run.steps
    assert len(steps) == 4
    assert all(math.isfinite(s["loss"]) and s["gn"] > 0 for s in steps)
    assert [round(s["loss"], 5) for s in steps[2:]] == [round(v, 5) for v in traced]
    refs = run.refs()
    assert refs["loss_fn"]["line"] == line_of("loop-loss")
    assert refs["backward"]["line"] == line_of("loop-backward")
    assert refs["step"]["line"] == line_of("loop-step")
    assert run.first("optimizer")["cls"] == "Adam" and run.first("model")["name"] == "model"
    keeper = rec.keeper
    assert keeper.model is model and keeper.loss["name"] == "cross_entropy"
    assert len(keeper.train_batches) == 4  # two eager batches, then two from the traced step
    for j, ((xb,), yb) in enumerate(keeper.train_batches):
        assert np.array_equal(xb, X[32 * j:32 * j + 32]) and np.array_equal(yb, y[32 * j:32 * j + 32])


def test_targets_of_a_loss_that_only_runs_inside_a_tf_function():
    """A loop that never runs eagerly still records its label prior (the baselines need it)."""
    X, y = data(128)
    with capture() as rec:
        train_step = custom_step(mlp(), traced=True)
        for i in range(0, 128, 32):
            train_step(X[i:i + 32], y[i:i + 32])
    run = Run(rec.events)
    assert len(run.steps) == 4
    targets = run.of("targets")[-1]
    assert targets["loss"] == "cross_entropy" and targets["n"] == 128
    assert targets["counts"] == np.bincount(y, minlength=len(targets["counts"])).tolist()


def test_a_tf_function_loop_keeps_its_batches_and_its_initial_weights():
    """A loop that never runs eagerly still gives Isolate a trainer: the rows it trained on, paired
    with their targets, and the weights from before the first step (read out of the trace)."""
    X, y = data(512)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])  # built outside: found by its variables
    before = [w.copy() for w in model.get_weights()]
    with capture() as rec:
        train_step = custom_step(model, traced=True)
        for _ in range(3):
            for i in range(0, 512, 32):
                train_step(X[i:i + 32], y[i:i + 32])
    keeper = rec.keeper
    kept = keeper.train_batches
    assert len(kept) == 16  # one epoch: the next one brings the same rows again
    for j, ((xb,), yb) in enumerate(kept):
        assert np.array_equal(xb, X[32 * j:32 * j + 32]) and \
            np.array_equal(yb, y[32 * j:32 * j + 32])
    assert all(np.array_equal(a, b) for a, b in zip(keeper.initial_state, before))
    assert not any(np.array_equal(a, b) for a, b in zip(model.get_weights()[:1], before[:1]))
    from model_debugger.trainers import trainer_for

    trainer = trainer_for(keeper)
    assert trainer is not None and trainer.n == 512
    assert math.isfinite(float(train_step(X[:32], y[:32])))  # the trace still runs afterwards
    assert len(keeper.train_batches) == 16


@pytest.mark.parametrize("traced", [True, False])
def test_a_custom_loop_whose_layers_are_all_frozen_still_records_its_steps(traced):
    """``optimizer.apply(grads, model.trainable_variables)`` over no variables (every layer
    frozen after building) updates nothing, silently: the steps and their losses are still the
    loop's, with nothing updated; the copies "as set up" are frozen too, and still train."""
    X, y = data(128)
    model = mlp()
    model(X[:1])
    for layer in model.layers:
        layer.trainable = False
    with capture() as rec:
        optimizer = keras.optimizers.Adam(1e-2)
        loss_fn = ce()

        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return loss

        train_step = tf.function(step) if traced else step
        losses = [float(train_step(X[i:i + 32], y[i:i + 32])) for i in range(0, 128, 32)]
    run = Run(rec.events)
    assert [round(s["loss"], 5) for s in run.steps] == [round(v, 5) for v in losses]
    trained = run.first("trained")
    assert trained["updated"] == 0 and trained["params"] > 0
    from model_debugger.trainers import trainer_for

    trainer = trainer_for(rec.keeper)
    copy = trainer.fresh_model()
    assert [layer.trainable for layer in copy.layers] == [False] * len(model.layers)
    assert not copy.trainable_variables
    inputs, target = trainer.subset(list(range(64)))
    trainer.fit(copy, inputs, target, 3, batch_size=32, seed=0)  # nothing to update: no error


@pytest.mark.parametrize("traced", [True, False])
def test_the_copies_train_with_the_optimizer_settings_of_a_custom_loop(traced):
    """An optimizer first seen inside a traced step still gives its whole config to the copies
    (read out of the graph): a decay or clip the user set is one a copy trains with."""
    X, y = data(128)
    model = mlp()
    with capture() as rec:
        train_step = custom_step(model, traced, weight_decay=0.5, clipnorm=2.0)
        for i in range(0, 128, 32):
            train_step(X[i:i + 32], y[i:i + 32])
    from model_debugger.trainers import trainer_for

    trainer = trainer_for(rec.keeper)
    assert trainer.settings() == {"weight_decay": 0.5, "momentum": None, "beta1": 0.9,
                                  "clip": 2.0}
    opt = trainer.optimizer(lr=0.1)
    assert (opt.weight_decay, opt.clipnorm, float(opt.learning_rate)) == \
        (0.5, 2.0, pytest.approx(0.1))


def _custom_loop(traced: bool, stall: float, steps: int = 50, evaluate: bool = False):
    X, y = data(steps * 16)
    Xv = np.tile(X, (8, 1))  # an evaluation far longer than a training step
    with capture(hist_every=0) as rec:
        model = mlp()
        step = custom_step(model, traced)
        for i in range(0, steps * 16, 16):
            if stall:
                time.sleep(stall)  # <keras-stall>
            step(X[i:i + 16], y[i:i + 16])
            if evaluate:
                np.asarray(model(Xv, training=False))
    return Run(rec.events)


@pytest.mark.parametrize("traced", [True, False], ids=["tf_function", "eager"])
def test_a_stall_in_a_custom_loop_is_measured_and_its_line_sampled(traced):
    """A custom loop's step work is timed (from the forward, or the tf.function call, to the
    apply), so the rest of each step is the loop's own: a sleep there is found at its line."""
    from model_debugger.signals import compute

    run = _custom_loop(traced, 0.04)
    assert all(0 < s["bz"] < s["dt"] for s in run.steps[1:])
    sig = compute(run)
    assert 32 <= sig["step_overhead_ms"] < 60  # the 40 ms sleep (its share depends on the load)
    event = run.first("step_overhead")
    top = event["lines"][0]
    assert top["file"] == HERE and top["line"] == line_of("keras-stall")
    assert top["share"] > 0.8 and event["samples"] >= 20


@pytest.mark.parametrize("evaluate", [False, True], ids=["plain", "evaluated_every_step"])
def test_a_custom_loop_without_own_work_is_not_sampled(evaluate):
    """An evaluation between steps is the model's work, not the loop's (as a no-grad forward is
    in PyTorch)."""
    from model_debugger.signals import compute

    sig = compute(_custom_loop(True, 0.0, evaluate=evaluate))
    assert sig["step_overhead_share"] < 0.5 and sig["step_overhead_ms"] < 10


@pytest.mark.parametrize("traced", [True, False], ids=["tf_function", "eager"])
def test_a_slow_tf_data_pipeline_in_a_custom_loop_is_data_wait(traced):
    """Iterating a ``tf.data`` pipeline in a custom loop (a new iterator each epoch, a slow
    ``map``) is the loop's data wait, not its own work: ``slow_data``, not ``loop_overhead``."""
    X, y = data(256)

    def slow(xb, yb):
        def sleep(v):
            time.sleep(0.08)  # well over an eager step's work
            return v
        return tf.py_function(sleep, [xb], tf.float32), yb

    serial = tf.data.Options()  # (no prefetch injected: each batch is made when it is asked for)
    serial.experimental_optimization.inject_prefetch = False
    pipeline = tf.data.Dataset.from_tensor_slices((X, y)).batch(32).map(slow).with_options(serial)
    with capture(hist_every=0) as rec:
        model = mlp()
        step = custom_step(model, traced)
        for _ in range(3):
            for xb, yb in pipeline:
                step(xb, yb)
    run = Run(rec.events)
    assert len(run.steps) == 24 and all(s["dw"] >= 0.079 for s in run.steps)
    sig = compute(run)  # (in absolute terms: an eager step's share depends on the load)
    assert sig["data_wait_ms"] >= 79 and sig["step_overhead_ms"] < 10
    from model_debugger.classify import loop_overhead

    assert loop_overhead(sig) is None


class _SlowBatches(keras.callbacks.Callback):
    """A callback of the user's doing 30 ms of work after every batch."""

    def __init__(self):
        super().__init__()

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.03)


class _Epochs(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        pass


@pytest.mark.parametrize("slow", [True, False], ids=["slow_callback", "no_batch_work"])
def test_the_time_fit_spends_in_each_callback_is_measured(slow):
    """``fit``'s step rows time the train step (``bz``); each of the user's callbacks with a
    batch hook has that hook timed (a ``callbacks`` event with the line that made it), and
    ``step_overhead`` locates the loop's own time at the callback that holds it."""
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context

    X, y = data(16 * 40)
    with capture(hist_every=0) as rec:
        model = mlp()
        model.compile(optimizer="adam", loss=ce())
        made = _SlowBatches() if slow else _Epochs()  # <keras-callback-made>
        model.fit(X, y, batch_size=16, epochs=1, verbose=0, callbacks=[made, _Epochs()])
    assert "on_train_batch_end" not in vars(made)  # the timed hook is gone after fit
    run = Run(rec.events)
    assert all(0 < s["bz"] < s["dt"] for s in run.steps[1:])
    if not slow:
        assert run.of("callbacks") == []
        assert compute(run)["step_overhead_ms"] < 10
        return
    (event,) = run.of("callbacks")
    (cb,) = event["callbacks"]
    assert event["steps"] == 40 and cb["cls"] == "_SlowBatches" and cb["calls"] == 40
    assert 40 * 0.03 <= cb["seconds"] and cb["typical_seconds"] >= 40 * 0.03
    assert (cb["file"], cb["line"]) == (HERE, line_of("keras-callback-made"))
    sig = compute(run)
    assert sig["step_overhead_ms"] >= 28
    [f] = run_probes(build_context(run, None, {}), ["step_overhead"]).findings
    assert f.confirmed and f.root_cause == "training_loop"
    assert (f.location["file"], f.location["line"]) == (HERE, line_of("keras-callback-made"))
    assert f.evidence["callback"] == "_SlowBatches"
    assert 28 <= f.evidence["callback_ms_per_step"] < 60


def test_first_nonfinite_step_and_layer():
    X, y = data(256)
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=1e4), loss=ce())
    X = X * 1e3
    with capture() as rec:
        model.fit(X, y, batch_size=32, epochs=2, verbose=0)
    run = Run(rec.events)
    bad = run.first("nonfinite")
    assert bad is not None and bad["module"] in [layer.name for layer in model.layers]
    losses = [s["loss"] for s in run.steps]
    first_bad = next(i for i, v in enumerate(losses) if isinstance(v, str))
    assert bad["step"] <= first_bad
    assert compute(run)["first_nonfinite_step"] == bad["step"]


def test_data_wait_of_a_slow_generator():
    X, y = data(256)

    def batches():
        while True:
            for i in range(0, 256, 32):
                time.sleep(0.01)
                yield X[i:i + 32], y[i:i + 32]

    model = mlp()
    model.compile(optimizer="adam", loss=ce())
    with capture() as rec:
        model.fit(batches(), steps_per_epoch=8, epochs=2, shuffle=False, verbose=0)
    steps = Run(rec.events).steps
    assert len(steps) == 16
    timed = [s for s in steps if s["dt"] is not None]
    wait = sum(s["dw"] for s in timed) / sum(s["dt"] for s in timed)
    assert wait > 0.5, wait
    assert compute(Run(rec.events))["data_wait_ms"] >= 5


def test_progress_bar_lines_are_not_parsed_as_metrics(capsys):
    X, y = data(64)
    model = mlp()
    model.compile(optimizer="adam", loss=ce(), metrics=["accuracy"])
    with capture() as rec:
        model.fit(X, y, batch_size=32, epochs=2, verbose=2)
        print("val_f1=0.5")
    sources = {(e["name"], e["source"]) for e in rec.events if e["t"] == "metric"}
    assert ("loss", "keras") in sources and ("val_f1", "stdout") in sources
    assert not any(src == "stdout" and name != "val_f1" for name, src in sources)


def test_everything_restored_after_capture():
    originals = (Trainer.compile, TensorFlowTrainer.fit, TensorFlowTrainer.make_train_function,
                 BaseOptimizer.apply, BaseOptimizer.__init__, keras.Model.__call__,
                 keras.losses.Loss.__call__, tf.GradientTape.gradient)
    X, y = data(64)
    model = mlp()
    model.compile(optimizer="adam", loss=ce())
    with capture() as rec:
        model.fit(X, y, batch_size=32, epochs=1, verbose=0)
    assert (Trainer.compile, TensorFlowTrainer.fit, TensorFlowTrainer.make_train_function,
            BaseOptimizer.apply, BaseOptimizer.__init__, keras.Model.__call__,
            keras.losses.Loss.__call__, tf.GradientTape.gradient) == originals
    assert model.train_function is None  # retraced without the probes next time
    n = len(rec.events)
    model.fit(X, y, batch_size=32, epochs=1, verbose=0)
    assert len(rec.events) == n


def test_out_of_memory_ends_with_a_partial_record():
    X, y = data(64)
    model = mlp()
    model.compile(optimizer="adam", loss=ce())
    with pytest.raises(tf.errors.ResourceExhaustedError):
        with capture() as rec:
            model.fit(X, y, batch_size=32, epochs=1, verbose=0)
            tf.zeros([2 ** 40, 64])  # <oom>
    run = Run(rec.events)
    assert len(run.steps) == 2
    assert run.error["kind"] == "oom" and run.error["location"]["line"] == line_of("oom")
    assert classify(compute(run)).primary == "memory_issue"


def test_importing_and_capturing_never_imports_tensorflow():
    code = ("import sys, model_debugger\n"
            "with model_debugger.capture():\n    pass\n"
            "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize("first", ["keras", "tensorflow"])
def test_instrument_attaches_when_the_script_imports_keras(first, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        f"import {first}\nimport numpy as np\nimport keras\n"
        "m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])\n"
        "m.compile(optimizer='sgd', loss='mse')\n"
        "m.fit(np.zeros((64, 4), 'float32'), np.zeros((64, 2), 'float32'), batch_size=16,"
        " verbose=0)\n")
    record = tmp_path / "record.jsonl"
    code = (f"import runpy, model_debugger\nwith model_debugger.capture({str(record)!r}):\n"
            f"    runpy.run_path({str(script)!r}, run_name='__main__')\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env)
    run = Run.load(str(record))
    assert len(run.steps) == 4 and run.refs()["fit"]["line"] == 6
    assert run.of("targets")[-1]["loss"] == "mse_loss"


def test_pytorch_training_with_tensorflow_imported_has_one_calls_event():
    """TensorFlow imported but not trained with: only PyTorch's counts are in the record."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    with capture(update_every=0, hist_every=0) as rec:
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    calls = [e for e in rec.events if e["t"] == "calls"]
    assert [(c["optimizer_steps"], c["zero_grad"]) for c in calls] == [(3, 3)]


@pytest.mark.parametrize("how", ["frozen_fit", "tape_over_the_head"])
def test_the_share_of_the_model_that_trains_is_recorded(how):
    """Frozen layers under ``fit``, or a custom loop applying gradients to the head only: the
    weights no apply updates count against the model (``untrained_share``); normalisation
    statistics, which never train, do not count."""
    X, y = data(128)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(2)])
    body, norm, head = 8 * 16 + 16, 2 * 16, 16 * 2 + 2
    with capture(hist_every=0) as rec:
        if how == "frozen_fit":
            model.layers[0].trainable = False
            model.compile(optimizer="adam", loss=ce())
            model.fit(X, y, batch_size=32, epochs=1, verbose=0)
        else:
            opt, loss_fn = keras.optimizers.Adam(1e-2), ce()
            for i in range(0, 128, 32):
                with tf.GradientTape() as tape:
                    loss = loss_fn(y[i:i + 32], model(X[i:i + 32], training=True))
                head_vars = model.layers[-1].trainable_variables
                opt.apply_gradients(zip(tape.gradient(loss, head_vars), head_vars))
    run = Run(rec.events)
    last = run.of("trained")[-1]
    updated = norm + head if how == "frozen_fit" else head
    assert (last["params"], last["updated"]) == (body + norm + head, updated)
    assert compute(run)["untrained_share"] == pytest.approx(1 - updated / (body + norm + head))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_gradients_taken_and_never_applied_are_recorded_as_steps_that_update_nothing(traced):
    """An eager tape loop without ``apply_gradients``: no optimizer step in the whole run, yet
    the loop ran. Each gradient's loss is a step (flat), the ``unapplied`` event counts them,
    the run is a plateau and ``gradients_unapplied`` confirms it at the gradient line (was:
    0 steps, "not observed", no diagnosis)."""
    from model_debugger.probes import run_probes
    from model_debugger.probes.gradients_unapplied import GradientsUnapplied
    from model_debugger.probing import build_context

    X, y = data(256)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    with capture(hist_every=0) as rec:
        keras.optimizers.Adam(1e-2)  # built, never used
        loss_fn = ce()

        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            tape.gradient(loss, model.trainable_variables)  # <unapplied>
            return loss

        step = tf.function(step) if traced else step
        for _ in range(3):
            for i in range(0, 256, 32):
                step(tf.constant(X[i:i + 32]), tf.constant(y[i:i + 32]))
    run = Run(rec.events)
    gradients = run.first("unapplied")["gradients"]
    assert (1 <= gradients <= 3) if traced else gradients == 24  # (traced: once or twice)
    assert (run.first("unapplied")["watched"], run.first("unapplied")["updated"]) == (4, 0)
    losses = [st["loss"] for st in run.steps]
    assert len(losses) == 24 and losses[:8] == losses[8:16] == losses[16:]  # never moves
    assert (run.first("calls") or {}).get("optimizer_steps") == 0
    sig = compute(run)
    assert classify(sig).primary == "loss_not_decreasing"
    ctx = build_context(run, sources={__file__: open(__file__, encoding="utf-8").read()})
    assert GradientsUnapplied().applies(ctx)  # no model or optimizer event names a framework
    found = [f for f in run_probes(ctx).findings if f.confirmed]
    assert found and found[0].check == "gradients_unapplied", [f.check for f in found]
    assert found[0].root_cause == "training_loop"
    assert "detached_output" not in {f.check for f in found}  # the graph was never cut
    if not traced:  # (a traced step's gradient is seen from the line that calls it)
        assert found[0].location["line"] == line_of("unapplied")


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_gradients_applied_by_hand_are_not_called_unapplied(traced):
    """A tape loop that updates the weights itself (SGD with momentum written out,
    ``v.assign_sub(lr * m)``) uses no optimizer, and trains: the capture measures the
    variables changing (``updated``), and ``gradients_unapplied`` stays silent (was: confirmed
    and decisive, "the weights never changed", on a healthy run)."""
    from model_debugger.probes import run_probes
    from model_debugger.probes.gradients_unapplied import GradientsUnapplied
    from model_debugger.probing import build_context

    X, y = data(256)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    with capture(hist_every=0) as rec:
        loss_fn = ce()
        velocity = [tf.Variable(tf.zeros_like(v), trainable=False)
                    for v in model.trainable_variables]

        def step(xb, yb, lr):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            for v, m, g in zip(model.trainable_variables, velocity, grads):
                m.assign(0.9 * m + g)
                v.assign_sub(lr * m)
            return loss

        step = tf.function(step) if traced else step
        for _ in range(3):
            for i in range(0, 256, 32):
                step(tf.constant(X[i:i + 32]), tf.constant(y[i:i + 32]), tf.constant(0.05))
    run = Run(rec.events)
    event = run.first("unapplied")
    assert event["watched"] == 4 and event["updated"] == 4, event
    ctx = build_context(run, sources={__file__: open(__file__, encoding="utf-8").read()})
    assert not GradientsUnapplied().applies(ctx)
    assert "gradients_unapplied" not in {f.check for f in run_probes(ctx).findings}


def test_unapplied_reads_only_trainable_variables_and_waits_for_a_gradient_of_variables():
    """A gradient of the inputs first (a saliency map) watches nothing: the loss's gradient
    after it is watched, and a loop updating by hand is not 'unapplied'. A model whose moving
    statistics change (BatchNormalization) but whose gradients are never applied is: only
    trainable variables count."""
    from model_debugger.probes.gradients_unapplied import GradientsUnapplied
    from model_debugger.probing import build_context

    X, y = data(128)
    for applied in (True, False):
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                                  keras.layers.BatchNormalization(), keras.layers.Dense(2)])
        with capture(hist_every=0) as rec:
            loss_fn = ce()
            for i in range(0, 128, 32):
                xb = tf.constant(X[i:i + 32])
                with tf.GradientTape() as saliency:
                    saliency.watch(xb)
                    score = tf.reduce_sum(model(xb, training=True))
                saliency.gradient(score, xb)
                with tf.GradientTape() as tape:
                    loss = loss_fn(y[i:i + 32], model(xb, training=True))
                grads = tape.gradient(loss, model.variables)
                if applied:
                    for v, g in zip(model.variables, grads):
                        if g is not None and v.trainable:
                            v.assign_sub(0.05 * g)
        event = Run(rec.events).first("unapplied")
        assert event["watched"] == 6, event  # 2 Dense x 2 + gamma and beta, not the moments
        ctx = build_context(Run(rec.events), sources={})
        assert GradientsUnapplied().applies(ctx) is not applied, event


def test_a_function_run_eagerly_is_not_retracing():
    """``tf.config.run_functions_eagerly(True)``: every call of a hand-updating step runs its
    Python body and takes a gradient, and none is a trace; each call's loss is one step."""
    X, y = data(256)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    tf.config.run_functions_eagerly(True)
    try:
        with capture(hist_every=0) as rec:
            loss_fn = ce()

            @tf.function
            def step(xb, yb):
                with tf.GradientTape() as tape:
                    loss = loss_fn(yb, model(xb, training=True))
                for v, g in zip(model.trainable_variables,
                                tape.gradient(loss, model.trainable_variables)):
                    v.assign_sub(0.1 * g)
                return loss

            for i in range(0, 256, 32):
                step(tf.constant(X[i:i + 32]), tf.constant(y[i:i + 32]))
    finally:
        tf.config.run_functions_eagerly(False)
    run = Run(rec.events)
    assert run.first("traces") is None
    assert len(run.steps) == 8


def test_a_step_that_updates_by_hand_and_is_traced_every_step_is_retracing():
    """A ``tf.function`` step that applies its update by hand, given a Python float rate that
    changes each step: traced on every call. No optimizer applies, so the traces are counted
    where the step takes its gradients; the steps are timed, the run is a performance issue
    and ``retracing`` confirms it at the calling line (was: no ``traces`` event, and a
    "gradients never applied" finding on a loop that trained)."""
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context

    X, y = data(256)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    with capture(hist_every=0) as rec:
        loss_fn = ce()

        @tf.function
        def step(xb, yb, lr):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            for v, g in zip(model.trainable_variables, grads):
                v.assign_sub(lr * g)
            return loss

        n = 0
        for _ in range(4):
            for i in range(0, 256, 32):
                n += 1
                step(tf.constant(X[i:i + 32]), tf.constant(y[i:i + 32]), 0.5 * 0.99 ** n)  # <retraced>
    run = Run(rec.events)
    traces = run.first("traces")
    assert traces["count"] == traces["steps"] == 32 and traces["line"] == line_of("retraced")
    assert sum(isinstance(st.get("dt"), float) for st in run.steps) == 31  # timed steps
    assert run.first("unapplied")["updated"] == 4
    ctx = build_context(run, sources={__file__: open(__file__, encoding="utf-8").read()})
    assert ctx.classification.primary == "performance_issue"
    found = [f for f in run_probes(ctx).findings if f.confirmed]
    assert [f.check for f in found] == ["retracing"]
    assert found[0].location["line"] == line_of("retraced")


@pytest.mark.parametrize("kept", [True, False, "twice"],
                         ids=["one_tape_kept", "a_tape_per_step", "entered_twice_per_step"])
def test_a_gradient_tape_kept_across_steps_is_found_where_it_is_made(kept):
    """A persistent tape made once and entered every step resumes the same tape, records
    and all: the ``tape_kept`` event counts the entries and ``tape_kept`` confirms it at the
    ``GradientTape(persistent=True)`` call (was: memory growth with no finding). A persistent
    tape made in each step's ``with`` starts empty, and a tape entered twice within a step
    (before its gradient) keeps nothing across steps: no event."""
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context

    X, y = data(256)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    opt = keras.optimizers.Adam(1e-2)
    with capture(hist_every=0) as rec:
        loss_fn = ce()
        tape = tf.GradientTape(persistent=True)  # <made>
        for _ in range(3):
            for i in range(0, 256, 32):
                if kept is not True:
                    tape = tf.GradientTape(persistent=kept is False)
                if kept == "twice":  # (two stretches of one step on one tape: legitimate)
                    with tape:
                        out = model(X[i:i + 32], training=True)
                    with tape:
                        loss = loss_fn(y[i:i + 32], out)
                else:
                    with tape:
                        loss = loss_fn(y[i:i + 32], model(X[i:i + 32], training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables))
    run = Run(rec.events)
    event = run.first("tape_kept")
    if kept is not True:
        assert event is None
        return
    assert event["resumed"] == 23 and event["steps"] == 24 and event["persistent"] is True
    ctx = build_context(run, sources={__file__: open(__file__, encoding="utf-8").read()})
    found = [f for f in run_probes(ctx, ["tape_kept"]).findings if f.confirmed]
    assert [(f.check, f.root_cause) for f in found] == [("tape_kept", "training_loop")]
    assert found[0].location["line"] == line_of("made")


def test_a_list_an_eager_loop_keeps_is_looked_at():
    """The Keras instrument looks at the loop's frames too (every 50 steps)."""
    from model_debugger.capture.held import HELD_EVERY
    from model_debugger.signals import growing_container

    X, y = data(2 * HELD_EVERY * 8)
    outputs_kept = []
    with capture(hist_every=0) as rec:
        model = mlp()
        step = custom_step(model, traced=False)
        for i in range(0, len(X), 8):
            step(X[i:i + 8], y[i:i + 8])
            outputs_kept.append(np.ones(1 << 17))  # 1 MB a step
    held = growing_container(Run(rec.events))
    assert held is not None and held["name"] == "outputs_kept"
    assert held["mb_per_step"] == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("traced", [True, False])
def test_a_custom_loop_validating_with_a_metric_keeps_its_validation_batches(traced):
    """Validation by a metric object (``val_acc.update_state(y, model(x))``), no loss call:
    the batches are still kept for Isolate, and the evaluation forward's line is referenced;
    a training metric under the tape keeps nothing."""
    X, y = data(256)
    Xv, yv = data(64, seed=1)
    model = mlp()
    val_acc = keras.metrics.SparseCategoricalAccuracy()
    with capture(hist_every=0) as rec:
        train_step = custom_step(model, traced)
        for i in range(0, 256, 32):
            train_step(X[i:i + 32], y[i:i + 32])
        for i in range(0, 64, 32):
            val_acc.update_state(yv[i:i + 32], model(Xv[i:i + 32] * 10.0, training=False))  # <keras-eval>
    kept = rec.keeper.val_batches
    assert len(kept) == 2
    assert np.allclose(kept[0][0][0], Xv[:32] * 10.0) and np.array_equal(kept[1][1], yv[32:])
    ref = Run(rec.events).refs()["eval_forward"]
    assert ref["line"] == line_of("keras-eval")


class _TapeTrainer:
    """A training class: its model is ``self.model``, and its step sees only ``self``."""

    def __init__(self, model):
        self.model = model
        self.opt = keras.optimizers.Adam(1e-2)
        self.loss_fn = ce()

    def train_step(self, xb, yb):
        with tf.GradientTape() as tape:
            loss = self.loss_fn(yb, self.model(xb, training=True))
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.opt.apply_gradients(zip(grads, self.model.trainable_variables))
        return loss


@pytest.mark.parametrize("traced", [True, False], ids=["tf_function", "eager"])
def test_a_model_held_by_a_training_class_is_found(traced):
    """Found among the attributes of the step's ``self`` (it was among names only: no model,
    no trainer, and every live probe of such a loop was skipped)."""
    X, y = data(128)
    with capture() as rec:
        trainer = _TapeTrainer(mlp())
        step = tf.function(trainer.train_step) if traced else trainer.train_step
        for i in range(0, 128, 32):
            step(X[i:i + 32], y[i:i + 32])
    from model_debugger.trainers import trainer_for

    assert rec.keeper.model is trainer.model
    assert next(e for e in rec.events if e["t"] == "model")["name"] == "self.model"
    assert trainer_for(rec.keeper) is not None


def test_a_custom_loop_has_epochs_and_a_validation_loss_from_its_dataset_passes():
    """Each pass over the training dataset is an epoch (as a PyTorch loader's); the training
    loss object called without a tape is the validation loss, one value per epoch."""
    X, y = data(256)
    Xv, yv = data(64, seed=1)
    with capture() as rec:
        model = mlp()
        opt = keras.optimizers.Adam(1e-2)
        loss_fn = ce()
        train = tf.data.Dataset.from_tensor_slices((X, y)).batch(64)
        for _epoch in range(3):
            for xb, yb in train:
                with tf.GradientTape() as tape:
                    loss = loss_fn(yb, model(xb, training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables))
            val = float(loss_fn(yv, model(Xv, training=False)))
    run = Run(rec.events)
    assert [s["ep"] for s in run.steps] == [0] * 4 + [1] * 4 + [2] * 4
    losses = [m for m in run.of("metric") if m["name"] == "eval_loss"]
    assert [m["epoch"] for m in losses] == [0, 1, 2]
    assert math.isclose(losses[-1]["value"], val, rel_tol=1e-5)
    passes = run.first("passes")
    assert passes["batches"] == 4 and passes["drawn"] == [4, 4, 4] and passes["last_ran_out"]


def test_a_subclassed_model_is_sized_once_it_is_built():
    """Found at compile, unbuilt (a subclassed model builds on its first call): its size is
    recorded once a step has built it, not as 0 parameters (data_volume reads it)."""

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(16, activation="relu")
            self.head = keras.layers.Dense(2)

        def call(self, x):
            return self.head(self.hidden(x))

    X, y = data(128)
    with capture() as rec:
        keras.utils.set_random_seed(0)
        model = Net()
        model.compile(optimizer="adam", loss=ce())
        assert not model.built
        model.fit(X, y, batch_size=32, epochs=1, verbose=0)
    events = [e for e in rec.events if e.get("t") == "model"]
    assert len(events) == 1 and events[0]["params"] == model.count_params() == 8 * 16 + 16 + 34


def test_a_model_built_in_part_before_fit_keeps_every_initial_weight():
    """An adapted Normalization holds weights before ``fit``; the Dense layers of a subclassed
    model are built by its first call: the initial weights are all of them, before any update."""
    X, y = data(256)

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.norm = keras.layers.Normalization()
            self.hidden = keras.layers.Dense(8, activation="relu")
            self.out = keras.layers.Dense(2)

        def call(self, x):
            return self.out(self.hidden(self.norm(x)))

    with capture() as rec:
        model = Net()
        model.norm.adapt(X)
        model.compile(optimizer="sgd",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(X, y, epochs=1, batch_size=64, verbose=0)
    kept = rec.keeper.initial_state
    assert len(kept) == len(model.get_weights()) == 7  # mean, variance, count + 2 x (kernel, bias)
    assert not np.array_equal(kept[3], model.get_weights()[3])  # the kernel before its updates


@pytest.mark.parametrize("as_tensor", [False, True])
def test_a_tf_function_step_given_a_python_number_each_step_is_retraced(as_tensor):
    """``train_step(xb, yb, step)`` with a Python int builds a new graph every call: the capture
    counts the traces and where the step was called; given a tensor it is traced once."""
    from types import SimpleNamespace

    from model_debugger.probes import PROBES

    X, y = data(512)
    model = mlp()
    optimizer, loss_fn = keras.optimizers.Adam(1e-2), ce()

    @tf.function
    def train_step(xb, yb, step):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True)) * (1.0 + 0.0 * tf.cast(step, tf.float32))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    with capture() as rec:
        for step, i in enumerate(range(0, 512, 32)):
            train_step(X[i:i + 32], y[i:i + 32], tf.constant(step) if as_tensor else step)  # <call>
    run = Run(rec.events)
    traces = run.of("traces")[-1]
    assert len(run.steps) == 16
    ctx = SimpleNamespace(run=run, ref=run.refs().get)
    found = PROBES["retracing"]().run(ctx)
    if as_tensor:
        assert traces["count"] <= 2 and found == []
    else:
        assert traces["count"] >= 16 and traces["line"] == line_of("call")
        assert found and found[0].confirmed and found[0].location["line"] == line_of("call")


@pytest.mark.parametrize("case", ["student_without_flag", "student_told_false", "all_flagged"])
def test_a_training_forward_without_training_is_reported_once_with_its_line(case):
    """A tape loop calling the model it trains, which has Dropout, without ``training=`` (or
    with ``training=False``): its dropout runs as in inference (``train_flag``, at the call).
    A frozen teacher with BatchNormalization called with ``training=False`` is the user's
    choice (the optimizer trains none of it), and a model called with ``training=True`` is
    fine: no event."""
    import tensorflow as tf

    X, y = data(256)
    keras.utils.set_random_seed(0)
    student = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                keras.layers.Dropout(0.3), keras.layers.Dense(2)])
    teacher = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                                keras.layers.BatchNormalization(), keras.layers.Dense(2)])
    teacher.trainable = False
    opt, loss_fn = keras.optimizers.Adam(1e-2), ce()
    with capture() as rec:
        for i in range(0, 256, 32):
            xb, yb = X[i:i + 32], y[i:i + 32]
            with tf.GradientTape() as tape:
                soft = teacher(xb, training=False)
                if case == "student_without_flag":
                    out = student(xb)  # <no-training-flag>
                elif case == "student_told_false":
                    out = student(xb, training=False)  # <training-false>
                else:
                    out = student(xb, training=True)
                loss = loss_fn(yb, out) + 0.0 * tf.reduce_sum(soft)
            grads = tape.gradient(loss, student.trainable_variables)
            opt.apply_gradients(zip(grads, student.trainable_variables))
    flags = Run(rec.events).of("train_flag")
    if case == "all_flagged":
        assert flags == []
        return
    (flag,) = flags
    assert flag["layers"] == ["Dropout"]
    if case == "student_without_flag":
        assert flag["training"] is None and flag["location"]["line"] == line_of("no-training-flag")
    else:
        assert flag["training"] == "False" and flag["location"]["line"] == line_of("training-false")


@pytest.mark.parametrize("order", ["repeat_then_cache", "cache_then_repeat"])
def test_a_cache_after_repeat_is_an_unbounded_cache_at_its_line(order):
    """``.repeat().cache()`` caches a dataset that never ends (memory fills for the whole run):
    a ``cache_unbounded`` event at the cache call, and ``pipeline_cache`` confirms it when the
    process grew. ``.cache().repeat()`` caches one pass: nothing."""
    from types import SimpleNamespace

    import tensorflow as tf

    from model_debugger.probes import PROBES

    X, y = data(256)
    with capture() as rec:
        base = tf.data.Dataset.from_tensor_slices((X, y)).batch(32)
        if order == "repeat_then_cache":
            ds = base.repeat().cache()  # <unbounded-cache>
        else:
            ds = base.cache().repeat()
        for _ in ds.take(3):
            pass
    run = Run(rec.events)
    found = run.of("cache_unbounded")
    if order == "cache_then_repeat":
        assert found == []
        return
    (e,) = found
    assert e["in_memory"] and e["location"]["line"] == line_of("unbounded-cache")
    ctx = SimpleNamespace(run=run, signals={"rss_growth_mb": 250.0}, ref=run.refs().get)
    (f,) = PROBES["pipeline_cache"]().run(ctx)
    assert f.confirmed and f.root_cause == "data" and f.location["line"] == line_of(
        "unbounded-cache")


def test_nan_targets_at_the_first_step_are_not_read_as_the_loss_s_own_making():
    """NaN regression targets: the forward replayed at the initial weights is finite, but the
    batch's targets are not, so the record does not say the loss computation made the value."""
    X, _ = data(256)
    y = X[:, :1].sum(1).astype("float32")
    y[::8] = np.nan
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with capture() as rec:
        model.fit(X, y, batch_size=32, epochs=1, verbose=0)
    bad = Run(rec.events).first("nonfinite")
    assert bad is not None and bad["step"] == 0
    assert "forward" not in bad


def test_validation_split_with_targets_given_per_output_keeps_the_record():
    """``fit(X, {"a": ya, "b": yb}, validation_split=0.25)``: slicing the dict of targets for
    the validation rows raised inside the capture's fit hook, and the whole fit went
    unrecorded (no step, no metric)."""
    X, y = data(256)
    inp = keras.Input((8,))
    h = keras.layers.Dense(8, activation="relu")(inp)
    model = keras.Model(inp, {"a": keras.layers.Dense(2)(h), "b": keras.layers.Dense(1)(h)})
    model.compile(optimizer="adam", loss={"a": ce(), "b": "mse"})
    with capture() as rec:
        model.fit(X, {"a": y, "b": X[:, :1]}, batch_size=32, epochs=2, verbose=0,
                  validation_split=0.25)
    run = Run(rec.events)
    assert not run.of("internal_error")
    assert len(run.steps) == 12 and "val_a_loss" in run.metrics()


_OWN_LOSS = """
import numpy as np
import keras
import tensorflow as tf

keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
X = rng.standard_normal((512, 6)).astype("float32")
y = TARGETS


class Regressor(keras.Model):
    def __init__(self):
        super().__init__()
        self.h = keras.layers.Dense(16, activation="relu")
        self.out = OUTPUT

    def call(self, x, training=False):
        return self.out(self.h(x))

    def train_step(self, batch):
        x, t = batch
        with tf.GradientTape() as tape:
            p = self(x, training=True)
            loss = LOSS
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


model = Regressor()
model.compile(optimizer=keras.optimizers.Adam(0.01))
model.fit(X, y, epochs=8, batch_size=64, verbose=0)
"""


@pytest.mark.parametrize("head", ["sigmoid", "linear", "classes", "rescaled"])
def test_a_train_step_with_its_own_loss_still_shows_targets_its_output_cannot_reach(
        head, tmp_path):
    """A subclassed model whose ``train_step`` computes its own squared error (``compile``
    without a loss) over a sigmoid output, on targets in [0, 1000]: no ``targets`` event, yet
    the kept target values and the trained model's outputs give the unreachable share; the
    run is a wrong solution and ``loss_output_mismatch`` confirms it at the output layer (was:
    ``loss_not_decreasing`` and no finding). A linear output reaches them; a softmax over
    classes with its own cross-entropy is not read as one value a row; a loss that scales the
    targets into the sigmoid's range (``t / 1000``) ends below what clipping them forces, so
    nothing is out of its reach."""
    import runpy

    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context

    regression = "np.clip(500 + 150 * X[:, 0] + 50 * X[:, 1], 0, 1000).astype('float32')"
    mse = "tf.reduce_mean(tf.square(tf.reshape(t, (-1, 1)) - p))"
    text = _OWN_LOSS.replace("TARGETS", regression if head != "classes" else
                             "rng.integers(0, 5, 512).astype('int64')").replace(
        "OUTPUT", {"sigmoid": 'keras.layers.Dense(1, activation="sigmoid")',
                   "rescaled": 'keras.layers.Dense(1, activation="sigmoid")',
                   "linear": "keras.layers.Dense(1)",
                   "classes": 'keras.layers.Dense(5, activation="softmax")'}[head]).replace(
        "LOSS", {"classes": "tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(t, p))",
                 "rescaled": mse.replace("(t, (-1, 1))", "(t / 1000.0, (-1, 1))")}.get(head, mse))
    script = tmp_path / "own_loss.py"
    script.write_text(text)
    with capture(hist_every=0) as rec:
        runpy.run_path(str(script), run_name="__main__")
    run = Run(rec.events)
    assert run.of("targets") == [] and run.first("target_values") is not None
    sig = compute(run)
    if head != "sigmoid":
        assert not sig.get("output_range_unreachable"), sig.get("output_range")
        return
    assert sig["output_range_unreachable"] > 0.9 and "sigmoid" in sig["output_range"]
    ctx = build_context(run, sources={str(script): text})
    assert ctx.classification.primary == "convergence_to_wrong_solution"
    found = [f for f in run_probes(ctx, ["loss_output_mismatch"]).findings if f.confirmed]
    assert [(f.check, f.root_cause) for f in found] == [("loss_output_mismatch", "architecture")]
    assert found[0].location["line"] == text.splitlines().index(
        '        self.out = keras.layers.Dense(1, activation="sigmoid")') + 1


@pytest.mark.parametrize("restore", [True, False, "trained_on"])
def test_early_stopping_that_restored_its_best_epoch_is_not_overfitting(restore):
    """``EarlyStopping(monitor="val_loss", restore_best_weights=True)`` stops ``fit`` and
    leaves the best epoch's model: an ``early_stopped`` event says so, and the validation
    rise of its waiting epochs is not called overfitting (was: a held-out fixed twin that
    early-stopped properly read ``overfitting``; its final accuracies are the waiting
    epochs' too). Without the restore the run ends on the risen model; a second fit that
    trains on from the restored one ends risen too."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((96, 20)).astype("float32")
    y = rng.integers(0, 2, 96)  # labels of noise: memorised, validation gets worse
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=ce(), metrics=["accuracy"])
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=3,
                                         restore_best_weights=restore)
    with capture(hist_every=0) as rec:
        model.fit(X[:64], y[:64], validation_data=(X[64:], y[64:]), epochs=40, batch_size=16,
                  callbacks=[stop], verbose=0)
        if restore == "trained_on":  # a second fit trains on from the restored model
            model.fit(X[:64], y[:64], validation_data=(X[64:], y[64:]), epochs=15,
                      batch_size=16, verbose=0)
    assert stop.stopped_epoch > 0
    run = Run(rec.events)
    event = run.first("early_stopped")
    sig = compute(run)
    if restore is not True:
        assert "restored_best" not in sig and classify(sig).primary == "overfitting"
        return
    assert event["monitor"] == "val_loss" and event["patience"] == 3 and event["restored"]
    assert sig["restored_best"] == 1.0 and sig["val_loss_rise"] > 0
    assert classify(sig).primary != "overfitting"
    assert classify({k: v for k, v in sig.items() if k != "restored_best"}).primary == \
        "overfitting"


def test_callbacks_unhashable_or_raising_are_timed_and_always_restored():
    """An unhashable callback (a dataclass) is timed like any other, and a fit that a callback
    stops with an exception leaves no timed hook behind on the user's objects."""
    import dataclasses

    @dataclasses.dataclass(eq=True)
    class Counting(keras.callbacks.Callback):
        seen: int = 0

        def __post_init__(self):
            super().__init__()

        def on_train_batch_end(self, batch, logs=None):
            self.seen += 1
            if self.seen == 3 and self.fail:
                raise RuntimeError("stop here")

    X, y = data(16 * 8)
    for fail in (False, True):
        Counting.fail = fail
        with capture(hist_every=0) as rec:
            model = mlp()
            model.compile(optimizer="adam", loss=ce())
            counting = Counting()
            try:
                model.fit(X, y, batch_size=16, epochs=1, verbose=0, callbacks=[counting])
            except RuntimeError:
                assert fail
        assert "on_train_batch_end" not in vars(counting)
        (event,) = Run(rec.events).of("callbacks")
        assert event["callbacks"][0]["cls"] == "Counting"
        assert event["callbacks"][0]["calls"] == (3 if fail else 8)
