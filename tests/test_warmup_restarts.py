"""A warm-up computed from the batch's index within the epoch, written into the optimizer by hand.

``lr = peak * min(1, (step + 1) / WARMUP)`` with ``step`` from ``enumerate(batches)`` starts
again every epoch: the rate saw-tooths below a few percent of the optimizer's and the loss hardly
moves. The twin computes it from the global step and reaches the rate. ``lr_schedule`` must
confirm the first (a copy at the optimizer's own rate learns clearly better), located where the
rate is written (not where the warm-up's length is set), in PyTorch (``param_groups``) and in a
Keras ``GradientTape`` loop (``optimizer.learning_rate.assign``) and a ``fit`` callback
(``self.model.optimizer.learning_rate = ...``), where the rate the optimizer was built with is
only known from its construction (the capture keeps it as ``lr_built``); and leave the twin
alone.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import model_debugger
from model_debugger.probes import run_probes
from model_debugger.probes.lr_schedule import _starved, rate_written, restarts
from model_debugger.probing import build_context
from model_debugger.records import Run

HERE = os.path.abspath(__file__)
PEAK, WARMUP, BATCH, EPOCHS = 0.05, 200, 64, 20  # 16 batches an epoch: 8% of the warm-up


def line_of(tag: str) -> int:
    with open(HERE, encoding="utf-8") as fh:
        return next(i for i, text in enumerate(fh, 1) if text.rstrip().endswith(f"# <{tag}>"))


def data():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(1024, 12)).astype("float32")
    return x, ((x[:, 0] * x[:, 1] + x[:, 2]) > 0).astype("int64")


def warm(step):
    return PEAK * min(1.0, (step + 1) / WARMUP)


def train_torch(per_epoch: bool):
    import torch
    from torch import nn

    x, y = (torch.as_tensor(a) for a in data())
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 2))
    opt = torch.optim.SGD(net.parameters(), lr=PEAK, momentum=0.9)
    seen = 0
    for _epoch in range(EPOCHS):
        for step, i in enumerate(range(0, len(x), BATCH)):
            for group in opt.param_groups:
                group["lr"] = warm(step if per_epoch else seen)  # <torch-write>
            opt.zero_grad()
            nn.functional.cross_entropy(net(x[i:i + BATCH]), y[i:i + BATCH]).backward()
            opt.step()
            seen += 1


def train_keras(per_epoch: bool):
    import keras
    import tensorflow as tf

    x, y = data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(learning_rate=PEAK, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    seen = 0
    for _epoch in range(EPOCHS):
        for step, (xb, yb) in enumerate(batches):
            optimizer.learning_rate.assign(warm(step if per_epoch else seen))  # <keras-write>
            train_step(xb, yb)
            seen += 1


def train_keras_fit(per_epoch: bool):
    import keras

    x, y = data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=PEAK, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class WarmUp(keras.callbacks.Callback):
        seen = 0

        def on_train_batch_begin(self, batch, logs=None):
            rate = warm(batch if per_epoch else self.seen)
            self.model.optimizer.learning_rate = rate  # <keras_fit-write>
            self.seen += 1

    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, callbacks=[WarmUp()], verbose=0)


def context(tmp_path, train):
    path = str(tmp_path / "record.jsonl")
    rec = model_debugger.capture(path)
    with rec:
        train()
    run = Run.load(path)
    return build_context(run, rec.keeper, {HERE: open(HERE, encoding="utf-8").read()}, 120.0)


@pytest.mark.parametrize("framework", ["torch", "keras", "keras_fit"])
@pytest.mark.parametrize("per_epoch", [True, False], ids=["per_epoch", "global"])
def test_a_warm_up_that_starts_again_every_epoch(tmp_path, framework, per_epoch):
    if framework != "torch":
        pytest.importorskip("tensorflow")
    train = {"torch": train_torch, "keras": train_keras, "keras_fit": train_keras_fit}[framework]
    ctx = context(tmp_path, lambda: train(per_epoch))
    if framework != "torch":
        assert ctx.trainer.hyper["lr_built"] == PEAK  # (the number it was built with)
    if not per_epoch:
        assert _starved(ctx) is None  # it reaches the optimizer's rate
        return
    [f] = [f for f in run_probes(ctx, ["lr_schedule"]).findings if f.check == "lr_schedule"]
    assert f.confirmed and f.root_cause == "hyperparameter", f.explanation
    assert f.evidence["lr_base"] == PEAK and f.evidence["restarts"] >= 2
    assert "starts again" in f.explanation
    assert f.location["line"] == line_of(f"{framework}-write"), f.location


def test_restarts_count_the_rate_falling_back_to_its_start():
    assert restarts(np.array([1, 2, 4, 8, 1, 2, 4, 8, 1, 3, 5.0])) == 2
    assert restarts(np.array([1, 2, 4, 8, 16, 16.0])) == 0  # a warm-up that ended
    assert restarts(np.array([16, 8, 4, 2, 1.0])) == 0  # a decay
    assert restarts(np.array([1, 2, 1, 2, 1.0])) == 0  # noise, never 4x its start


@pytest.mark.parametrize("code,written", [
    ("optimizer.learning_rate.assign(rate)", True),
    ("opt = SGD(0.1)\nopt.lr.assign(rate)", True),  # by the name it was built under
    ("K.set_value(model.optimizer.lr, rate)", True),
    ("self.model.optimizer.learning_rate = rate", True),
    ("for g in opt.param_groups:\n    g['lr'] = rate", True),
    ("opt.param_groups[0]['lr'] = rate", True),
    ("self.lr = 0.1", False),  # a module's own attribute
    ("self.learning_rate.assign(rate)", False),
    ("lr.assign(rate)", False),
    ("opt = parser.parse_args()\nopt.lr = opt.lr * 2", False),  # argparse, not an optimizer
    ("cfg.optim.lr = 3e-4", False),
    ("options.learning_rate = 0.1", False),
    ("schedule_state.lr.assign(rate)", False),
    ("stats['lr'] = opt.param_groups[0]['lr']", False),  # a log of the rate
])
def test_the_lines_that_write_a_rate_into_an_optimizer(code, written):
    built = {"file": "f.py", "line": 1} if "SGD(" in code else None
    assert (rate_written({"f.py": code}, built) is not None) is written


def test_the_write_after_the_optimizer_is_built_is_the_one_named():
    code = ("def adjust(opt, rate):\n"
            "    for g in opt.param_groups:\n"
            "        g['lr'] = rate\n"
            "opt = SGD(0.1)\n"
            "stats = {'lr': opt.param_groups[0]['lr']}\n"
            "optimizer.learning_rate = 0.3\n")
    assert rate_written({"f.py": code}, {"file": "f.py", "line": 4})["line"] == 6
    assert rate_written({"f.py": code[:code.index("optimizer.")]},
                        {"file": "f.py", "line": 4})["line"] == 3  # (none after it)
