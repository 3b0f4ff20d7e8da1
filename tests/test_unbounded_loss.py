"""``unbounded_loss`` on real captures: a hand-written likelihood minimised with the wrong sign.

A heteroscedastic regression learns a mean and a log-variance by the Gaussian likelihood; the
faulty programs minimise the log-likelihood itself instead of its negative, so the loss has no
minimum and falls until the values overflow. The twins minimise the negative log-likelihood.
The finding must be decisive on the first, located at the line computing the loss (before
``backward()``, or inside a Keras ``train_step``), leave the learning-rate reading unconfirmed,
and be absent on the twins.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from torch import nn

import model_debugger
from model_debugger import classify as C
from model_debugger.probes import run_probes
from model_debugger.probing import build_context
from model_debugger.records import Run
from model_debugger.signals import compute

HERE = os.path.abspath(__file__)


def line_of(tag: str) -> int:
    with open(HERE, encoding="utf-8") as fh:
        return next(i for i, text in enumerate(fh, 1) if text.rstrip().endswith(f"# <{tag}>"))


def noisy_line(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, (n, 1)).astype("float32")
    y = (1.5 * x + rng.normal(size=(n, 1)) * (0.2 + 0.5 * np.abs(x))).astype("float32")
    return x, y


def log_likelihood(y, mu, log_var):
    return -0.5 * (math.log(2 * math.pi) + log_var + (y - mu) ** 2 * torch.exp(-log_var))


def train_torch(sign: float):
    torch.manual_seed(0)
    x, y = map(torch.as_tensor, noisy_line(1024, 0))
    net = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 2))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _epoch in range(12):
        for i in range(0, 1024, 64):
            mu, log_var = net(x[i:i + 64]).unbind(1)
            opt.zero_grad()
            loss = sign * log_likelihood(y[i:i + 64, 0], mu, log_var).mean()  # <torch-loss>
            loss.backward()
            opt.step()


def _findings(rec, run):
    ctx = build_context(run, rec.keeper, {HERE: open(HERE, encoding="utf-8").read()}, 60.0)
    return ctx, run_probes(ctx, ["unbounded_loss", "gradient_flow"]).findings


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_torch_likelihood_maximised_is_an_unbounded_loss(tmp_path, sign):
    path = str(tmp_path / "record.jsonl")
    rec = model_debugger.capture(path)
    with rec:
        train_torch(sign)
    ctx, findings = _findings(rec, Run.load(path))
    mine = [f for f in findings if f.check == "unbounded_loss"]
    if sign < 0:  # the negative log-likelihood: bounded, no finding
        assert mine == [] and "loss_unbounded" not in ctx.signals
        return
    assert ctx.classification.primary == "gradient_instability"
    [f] = mine
    assert (f.root_cause, f.confirmed, f.evidence["decisive"]) == ("training_loop", True, True)
    assert f.evidence["loss_min"] <= -1e6
    assert f.location["line"] == line_of("torch-loss"), f.location
    assert not any(g.confirmed and g.root_cause == "hyperparameter" for g in findings)


def test_keras_train_step_maximising_the_likelihood_is_found():
    pytest.importorskip("tensorflow")
    import keras
    import tensorflow as tf

    class Gaussian(keras.Model):
        def __init__(self, sign):
            super().__init__()
            self.sign = sign
            self.hidden = keras.layers.Dense(32, activation="tanh")
            self.head = keras.layers.Dense(2)
            self.tracker = keras.metrics.Mean(name="loss")

        def call(self, x):
            return self.head(self.hidden(x))

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                out = self(x, training=True)
                mu, log_var = out[:, :1], out[:, 1:]
                ll = -0.5 * (log_var + tf.square(y - mu) * tf.exp(-log_var))
                loss = self.sign * tf.reduce_mean(ll)  # <keras-loss>
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            self.tracker.update_state(loss)
            return {"loss": self.tracker.result()}

    x, y = noisy_line(2048, 1)
    results = {}
    for sign in (1.0, -1.0):
        with model_debugger.capture() as rec:
            keras.utils.set_random_seed(0)
            model = Gaussian(sign)
            model.compile(optimizer=keras.optimizers.Adam(1e-2))
            model.fit(x, y, batch_size=64, epochs=6, verbose=0)
        results[sign] = _findings(rec, Run(rec.events))
    ctx, findings = results[1.0]
    [f] = [f for f in findings if f.check == "unbounded_loss"]
    assert (f.root_cause, f.confirmed) == ("training_loop", True)
    assert f.location["line"] == line_of("keras-loss"), f.location
    ctx, findings = results[-1.0]
    assert not [f for f in findings if f.check == "unbounded_loss"]


def test_unbounded_below_rule_reads_both_thresholds():
    """Fires at -1e6 and 1e4x the first loss in size; a likelihood that settles at -40 does
    not, nor a summed loss falling from 1e5 to -2e6 (200x its first value only)."""
    from _synthetic import healthy_steps, make_run

    def run_of(losses):
        steps = healthy_steps(len(losses))
        for e, v in zip(steps, losses):
            e["loss"] = float(v)
        return compute(make_run(steps))

    falling = -np.geomspace(2.0, 5e7, 60)
    sig = run_of(falling)
    assert sig["loss_unbounded"] == pytest.approx(falling.min(), rel=1e-6)
    assert C.classify(sig).primary == "gradient_instability"
    assert "loss_unbounded" not in run_of(-np.geomspace(2.0, 40.0, 60))
    assert "loss_unbounded" not in run_of(np.linspace(1e5, -2e6, 60))
