"""Each intervention changes exactly what it names in a real re-run, and is gone afterwards.

A cell is run twice through the artifact, as written and with one intervention installed; the
cell's own hooks record what the model and optimizer saw, so each test checks the change from
the inside (weights at the first call, dropout masks, gradients at the step, the optimizer's
groups) and that a run after it is unchanged again. Keras runs through a script in a child.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from model_debugger.artifacts import CellArtifact, Intervention, ScriptArtifact, Version
from model_debugger.interventions import INTERVENTIONS
from model_debugger.records import Run

TORCH = textwrap.dedent("""\
    import torch
    from torch import nn
    torch.manual_seed(0)
    X = torch.randn(256, 6)
    y = (X[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.9), nn.Linear(16, 2))
    nn.init.zeros_(model[0].weight)
    for p in model[0].parameters():
        p.requires_grad = False
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1,
                          momentum=0.999, weight_decay=3.0)
    seen = {"w0_std": [], "zeros": [], "grad_before": [], "mode": [], "eval_mode": [],
            "groups": [], "clipped": []}
    model[0].register_forward_pre_hook(
        lambda m, a: seen["w0_std"].append(float(m.weight.detach().std())))
    model.eval()                                      # training goes on in eval mode
    for i in range(0, 256, 32):
        grad = model[3].weight.grad
        seen["grad_before"].append(grad is not None and float(grad.norm()) > 0)
        loss = nn.functional.cross_entropy(model(X[i:i + 32]), y[i:i + 32])
        seen["mode"].append(model.training)
        loss.backward()                                # no zero_grad: gradients pile up
        before = float(model[3].weight.grad.norm())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-6)
        seen["clipped"].append(float(model[3].weight.grad.norm()) / before)
        seen["groups"].append([(g["momentum"], g["weight_decay"], len(g["params"]))
                               for g in opt.param_groups])
        opt.step()
    model.eval()
    with torch.no_grad():                             # evaluation keeps its mode
        model(X[:8])
        seen["eval_mode"].append(model.training)
    drop = nn.Dropout(0.9)                            # in train mode: drops 90%
    seen["zeros"].append(float((drop(torch.ones(1000)) == 0).float().mean()))
    rows = list(range(12))                            # loaders that never shuffle
    seen["order"] = [int(r) for b in torch.utils.data.DataLoader(rows, batch_size=4) for r in b]
    seen["order_positional"] = [int(r) for b in torch.utils.data.DataLoader(rows, 4, False)
                                for r in b]
    seen["order_sampler"] = [int(r) for b in torch.utils.data.DataLoader(
        rows, batch_size=4, sampler=torch.utils.data.SequentialSampler(rows)) for r in b]
""")


@pytest.fixture()
def cell(tmp_path):
    ns: dict = {}
    art = CellArtifact(ns, TORCH)
    version = Version("reproduced", str(tmp_path / "copy.py"))
    runs = iter(range(100))

    def run(change: Intervention | None = None) -> dict:
        cap = art.run(version, 0, str(tmp_path / f"r{next(runs)}.jsonl"), intervention=change)
        assert cap.error is None, cap.error
        return ns["seen"]

    return run


def test_the_cell_as_written_has_every_fault(cell):
    seen = cell()
    assert seen["w0_std"][0] == 0.0 and min(seen["zeros"]) > 0.5
    assert seen["grad_before"][1:] == [True] * 7 and seen["mode"] == [False] * 8
    assert max(seen["clipped"]) < 1e-3
    assert seen["groups"][0] == [(0.999, 3.0, 2)]
    assert seen["order"] == seen["order_positional"] == seen["order_sampler"] == list(range(12))


@pytest.mark.parametrize("change,check", [
    (Intervention("default_init"), lambda s: s["w0_std"][0] > 0.05),
    (Intervention("dropout_off"), lambda s: max(s["zeros"]) < 0.5),
    (Intervention("zero_grad"), lambda s: s["grad_before"] == [False] * 8),
    (Intervention("train_mode"),  # back in train mode after the first step
     lambda s: s["mode"] == [False] + [True] * 7 and s["eval_mode"] == [False]),
    (Intervention("clip_off"), lambda s: min(s["clipped"]) == 1.0),
    (Intervention("unfreeze"),  # the frozen ones join the group, at the first step
     lambda s: s["groups"][1] == [(0.999, 3.0, 4)] and s["w0_std"][-1] > 0),
    (Intervention("optimizer_setting", {"setting": "weight_decay", "value": 0.0}),
     lambda s: s["groups"][1] == [(0.999, 0.0, 2)]),
    (Intervention("optimizer_setting", {"setting": "momentum", "value": 0.9}),
     lambda s: s["groups"][1] == [(0.9, 3.0, 2)]),
    (Intervention("shuffle"),  # a loader with its own sampler keeps its order
     lambda s: sorted(s["order"]) == s["order_sampler"] != s["order"]
     and sorted(s["order_positional"]) == s["order_sampler"] != s["order_positional"]),
])
def test_each_torch_intervention_changes_what_it_names_and_is_removed_after(cell, change, check):
    assert check(cell(change)), cell(change)
    assert not check(cell())  # the next run is the cell as written again


CUT = textwrap.dedent("""\
    import torch
    from torch import nn
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head = nn.Linear(6, 16), nn.Linear(16, 2)

        def forward(self, x):
            return self.head(torch.relu(self.body(x)).detach())

    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    seen = {"body_grad": [], "logged_needs_grad": []}
    for _ in range(3):
        opt.zero_grad()
        loss = net(torch.randn(32, 6)).pow(2).mean()
        loss.backward()
        seen["body_grad"].append(net.body.weight.grad is not None)
        seen["logged_needs_grad"].append(loss.detach().requires_grad)  # outside forward
        opt.step()
""")


def test_keep_graph_reconnects_a_detach_inside_forward_only(tmp_path):
    """The re-run's forward keeps the graph where the model's code detaches; a ``detach`` in
    the loop (a value logged) still detaches; the run after it is the code as written."""
    ns: dict = {}
    art = CellArtifact(ns, CUT)
    version = Version("reproduced", str(tmp_path / "copy.py"))

    def run(i, change=None):
        cap = art.run(version, 0, str(tmp_path / f"r{i}.jsonl"), intervention=change)
        assert cap.error is None, cap.error
        return ns["seen"]

    assert run(0)["body_grad"] == [False] * 3
    seen = run(1, Intervention("keep_graph"))
    assert seen["body_grad"] == [True] * 3 and seen["logged_needs_grad"] == [False] * 3
    assert run(2)["body_grad"] == [False] * 3
    elsewhere = {"sites": [{"file": "other.py", "line": 1}]}  # only the finding's own lines
    assert run(3, Intervention("keep_graph", elsewhere))["body_grad"] == [False] * 3
    with pytest.raises(ValueError, match="keep_graph needs sites"):
        run(4, Intervention("keep_graph", {"sites": "everywhere"}))


def test_every_intervention_is_documented_and_bad_parameters_are_refused(cell):
    for kind in INTERVENTIONS.values():
        assert kind.description and set(kind.install) == set(kind.frameworks)
    with pytest.raises(ValueError, match="optimizer_setting needs a setting"):
        cell(Intervention("optimizer_setting", {"setting": "lr", "value": 1.0}))
    for bad in (1.0, True, float("nan"), -0.5):  # beta1 = 1 would make Adam's update NaN
        with pytest.raises(ValueError, match="needs a finite number"):
            cell(Intervention("optimizer_setting", {"setting": "beta1", "value": bad}))
    with pytest.raises(ValueError, match="finite factor"):
        cell(Intervention("lr_scale", {"factor": float("inf")}))


KERAS = textwrap.dedent("""\
    import json, sys
    import numpy as np
    import keras
    keras.utils.set_random_seed(0)
    X = np.random.default_rng(0).normal(size=(256, 6)).astype("float32")
    y = (X[:, 0] > 0).astype("int64")
    hidden = keras.layers.Dense(16, activation="relu", kernel_initializer="zeros")
    hidden.trainable = False
    model = keras.Sequential([keras.Input((6,)), hidden, keras.layers.Dropout(0.9),
                              keras.layers.Dense(2)])
    opt = keras.optimizers.SGD(0.1, momentum=0.999, weight_decay=3.0, clipnorm=1e-6)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    start = [float(np.std(w)) for w in hidden.get_weights()[:1]]
    seen = {}

    class Look(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen["kernel_std"] = float(np.std(hidden.get_weights()[0]))
            seen["trainable"] = len(model.trainable_weights)
            seen["opt"] = [opt.momentum, opt.weight_decay, opt.clipnorm]

    model.fit(X, y, batch_size=32, epochs=1, verbose=0, callbacks=[Look()])
    order = []                                        # the rows fit feeds, in order
    probe = keras.Sequential([keras.Input((1,)), keras.layers.Lambda(
        lambda t: (order.extend(np.asarray(t)[:, 0].astype(int).tolist()), t)[1])])
    probe.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    rows = np.arange(12, dtype="float32")[:, None]
    probe.fit(rows, rows, batch_size=4, epochs=1, verbose=0, shuffle=False)
    seen["order"] = order
    drop = model.layers[1]
    seen["dropped"] = float(np.mean(np.asarray(drop(np.ones((64, 16), "float32"),
                                                    training=True)) == 0))
    print("SEEN " + json.dumps(seen))
""")


def _script_seen(tmp_path, source: str):
    """``seen(change, n)``: the script's ``SEEN {json}`` line from a run under ``change``."""
    script = tmp_path / "script.py"
    script.write_text(source)
    art = ScriptArtifact(str(script))
    version = Version("current", str(script))

    def seen(change: Intervention | None, n: int) -> dict:
        out = tmp_path / f"out{n}.txt"
        with open(out, "w") as fh:
            cap = art.run(version, 0, str(tmp_path / f"k{n}.jsonl"), intervention=change,
                          stdout=fh)
        assert cap.error is None, cap.error
        line = next(x for x in out.read_text().splitlines() if x.startswith("SEEN "))
        return json.loads(line[5:])

    return seen


@pytest.mark.slow
def test_keras_interventions_change_what_they_name(tmp_path):
    seen = _script_seen(tmp_path, KERAS)
    plain = seen(None, 0)
    assert plain["kernel_std"] == 0.0 and plain["trainable"] == 2 and plain["dropped"] > 0.5
    assert plain["opt"] == [0.999, 3.0, 1e-6] and plain["order"] == list(range(12))
    assert seen(Intervention("default_init"), 1)["kernel_std"] > 0.05
    assert seen(Intervention("unfreeze"), 2)["trainable"] == 4
    assert seen(Intervention("dropout_off"), 3)["dropped"] == 0.0
    assert seen(Intervention("clip_off"), 4)["opt"] == [0.999, 3.0, None]
    assert seen(Intervention("optimizer_setting", {"setting": "momentum", "value": 0.9}),
                5)["opt"] == [0.9, 3.0, 1e-6]
    assert seen(Intervention("optimizer_setting", {"setting": "weight_decay", "value": 0.0}),
                6)["opt"] == [0.999, None, 1e-6]
    order = seen(Intervention("shuffle"), 7)["order"]
    assert sorted(order) == list(range(12)) != order


KERAS_CUT = textwrap.dedent("""\
    import json
    import numpy as np
    import keras
    import tensorflow as tf
    keras.utils.set_random_seed(0)

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.body, self.head = keras.layers.Dense(16), keras.layers.Dense(1)

        def call(self, x, training=False):
            return self.head(tf.stop_gradient(self.body(x)))

    X = np.random.default_rng(0).normal(size=(128, 6)).astype("float32")
    net = Net()
    net.compile(optimizer="sgd", loss="mse")
    net(X[:1])
    start = net.body.get_weights()[0].copy()
    net.fit(X, X[:, :1], batch_size=32, epochs=1, verbose=0)
    moved = float(np.abs(net.body.get_weights()[0] - start).max())
    print("SEEN " + json.dumps({"body_moved": moved}))
""")


KERAS_CUT_FUNCTIONAL = textwrap.dedent("""\
    import json
    import numpy as np
    import keras
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    body = keras.layers.Dense(16)
    hidden = keras.ops.stop_gradient(body(inputs))
    net = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    X = np.random.default_rng(0).normal(size=(128, 6)).astype("float32")
    net.compile(optimizer="sgd", loss="mse")
    start = body.get_weights()[0].copy()
    net.fit(X, X[:, :1], batch_size=32, epochs=1, verbose=0)
    moved = float(np.abs(body.get_weights()[0] - start).max())
    print("SEEN " + json.dumps({"body_moved": moved}))
""")


@pytest.mark.slow
@pytest.mark.parametrize("source", [KERAS_CUT, KERAS_CUT_FUNCTIONAL],
                         ids=["subclassed", "functional"])
def test_keras_keep_graph_lets_gradients_through_a_stop_gradient_in_call(tmp_path, source):
    """In a subclassed call() the user's stop_gradient call keeps the graph; in a functional
    model (built on symbolic tensors: the call must still make its node) the node passes its
    input on when it runs."""
    seen = _script_seen(tmp_path, source)
    assert seen(None, 0)["body_moved"] == 0.0
    assert seen(Intervention("keep_graph"), 1)["body_moved"] > 0.0
    if source is KERAS_CUT:  # (a functional model's nodes all pass on, whatever the sites)
        elsewhere = {"sites": [{"file": "other.py", "line": 1}]}  # only the finding's lines
        assert seen(Intervention("keep_graph", elsewhere), 2)["body_moved"] == 0.0


KERAS_EPOCHS = textwrap.dedent("""\
    import numpy as np
    import tensorflow as tf  # imported first: the capture and the budget patch in this order
    import keras
    keras.utils.set_random_seed(0)
    X = np.random.default_rng(0).normal(size=(512, 4)).astype("float32")
    y = X.sum(1).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(X, y, 32, 20, 0, validation_data=(X[:64], y[:64]))  # (batch, epochs, verbose)
""")


@pytest.mark.slow
@pytest.mark.parametrize("change", [None, Intervention("shuffle")])
def test_a_keras_re_run_under_a_step_budget_keeps_its_epochs(tmp_path, change):
    """The step budget (and an intervention) patch ``fit`` too: they sat on ``keras.Model``
    and called the backend's ``fit`` found at install time, bypassing the capture's patch, so
    a bounded re-run recorded its steps but no epoch, no validation loss and no targets (the
    signals that define overfitting and a wrong solution could never move)."""
    script = tmp_path / "fit.py"
    script.write_text(KERAS_EPOCHS)
    art = ScriptArtifact(str(script))
    path = tmp_path / "r.jsonl"
    cap = art.run(Version("current", str(script)), 0, str(path), intervention=change,
                  max_steps=50)
    assert cap.error is None, cap.error
    run = Run.load(str(path))
    assert len(run.steps) == 50
    assert run.of("epoch") and run.of("targets")
    assert "val_loss" in run.metrics()


KERAS_FLAG = textwrap.dedent("""\
    import json
    import numpy as np
    import keras
    import tensorflow as tf
    keras.utils.set_random_seed(0)
    flags = []

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.body, self.drop = keras.layers.Dense(16), keras.layers.Dropout(0.5)
            self.head = keras.layers.Dense(1)

        def call(self, x, training=None):
            flags.append(training)
            return self.head(self.drop(self.body(x), training=training))

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x, y=y, y_pred=self(x))  # <no-flag>
            self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables),
                                               self.trainable_variables))
            return {"loss": loss}

    X = np.random.default_rng(0).normal(size=(256, 6)).astype("float32")
    model = Net()
    model.compile(optimizer="adam", loss="mse")
    model.fit(X, X[:, :1], batch_size=32, epochs=1, verbose=0)
    print("SEEN " + json.dumps({"training": [f for f in flags if f is not None]}))
""")


@pytest.mark.slow
def test_a_keras_training_forward_without_training_true_is_measured_and_undone(tmp_path):
    """A custom train_step calling ``self(x)`` under the tape: the capture's ``train_flag``
    names the Dropout and the line, ``eval_mode_not_reset`` confirms it there; the Keras
    ``train_mode`` intervention makes that call ``training=True`` in the re-run."""
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context
    from model_debugger.records import Run

    seen = _script_seen(tmp_path, KERAS_FLAG)
    assert True not in seen(None, 0)["training"]
    assert True in seen(Intervention("train_mode"), 1)["training"]
    run = Run.load(str(tmp_path / "k0.jsonl"))
    flag = run.first("train_flag")
    line = next(i for i, text in enumerate(KERAS_FLAG.splitlines(), 1) if "<no-flag>" in text)
    assert flag["layers"] == ["Dropout"] and flag["location"]["line"] == line
    (f,) = run_probes(build_context(run, None, {}), ["eval_mode_not_reset"]).findings
    assert f.confirmed and f.location["line"] == line and f.root_cause == "training_loop"
