"""The line that made a PyTorch model's output module, for findings about the output."""

from __future__ import annotations

import textwrap
import types

import torch
from torch import nn

from model_debugger.probes._made import attribute_line, output_location, output_module_location
from model_debugger.trainers.torch import TorchTrainer

SOURCE = textwrap.dedent("""\
    import torch
    from torch import nn


    class Regressor(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(d, 8), nn.ReLU())
            self.head = nn.Sequential(nn.Linear(8, 1), nn.ReLU())

        def forward(self, x):
            return self.head(self.body(x))
""")


NAMESPACE: dict = {}
exec(compile(SOURCE, "train.py", "exec"), NAMESPACE)  # the class the source defines
Regressor = NAMESPACE["Regressor"]


def _ctx(model, model_line):
    x, y = torch.randn(32, 3), torch.randn(32)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    tr = TorchTrainer(model, state, {"cls": torch.optim.SGD, "hyper": {"lr": 0.1}},
                      {"name": "mse_loss"}, [((x,), y)])
    refs = {"model": {"file": "train.py", "line": model_line}}
    return types.SimpleNamespace(framework="torch", trainer=tr, ref=refs.get,
                                 source_files={"train.py": SOURCE})


def test_the_output_module_is_located_at_its_attribute_assignment():
    where = output_module_location(_ctx(Regressor(3), 5))
    assert where == {"file": "train.py", "line": 9}  # self.head = ..., not the class line


def test_a_model_without_attributes_keeps_no_line():
    assert output_module_location(_ctx(nn.Sequential(nn.Linear(3, 1), nn.ReLU()), 5)) is None
    assert attribute_line(SOURCE, 5, "missing") is None
    assert attribute_line("def broken(:\n", 1, "head") is None


def test_a_keras_model_is_located_at_its_last_layer_in_the_source():
    source = textwrap.dedent("""\
        import keras
        net = keras.Sequential([
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ])
    """)
    refs = {"model": {"file": "m.py", "line": 2}}
    ctx = types.SimpleNamespace(framework="keras", ref=refs.get, source_files={"m.py": source})
    assert output_location(ctx) == {"file": "m.py", "line": 4}


def test_a_model_name_reused_by_two_functions_is_located_in_the_one_that_trains(tmp_path):
    """``net = ...`` in two functions of a file: the model is where the frame that holds it
    assigned it (up to the running line), not the first such line of the file; a name the
    function only takes as a parameter falls back to the file's first assignment."""
    from model_debugger.capture.codeloc import assignment

    path = tmp_path / "train.py"
    path.write_text("def other():\n    net = A()\n\n\ndef train():\n    net = B()\n    fit(net)\n"
                    "\n\ndef loop(net):\n    fit(net)\n")
    ns = {"__file__": str(path)}
    assert assignment(ns, "net")["line"] == 2  # no frame: the file's first
    assert assignment(ns, "net", (5, 7))["line"] == 6  # train()'s own
    assert assignment(ns, "net", (10, 11))["line"] == 2  # a parameter: the file's first
