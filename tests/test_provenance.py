"""Data findings located where the data was made: the def-use trace of ``provenance``.

Each program marks the line the capture would report (``# <use>``) and the line that made the
data (``# <made>``); the trace must go from one to the other, in several styles.
"""

from __future__ import annotations

import textwrap

import pytest

from model_debugger.provenance import data_origin


def _origin(tmp_path, source: str, role: str | None = None) -> tuple[int | None, int, int]:
    source = textwrap.dedent(source)
    path = tmp_path / "train.py"
    path.write_text(source)
    lines = source.splitlines()
    use = next(i for i, line in enumerate(lines, 1) if "# <use>" in line)
    made = next((i for i, line in enumerate(lines, 1) if "# <made>" in line), use)
    got = data_origin({"file": str(path), "line": use}, role)
    return got["line"], made, use


TORCH_LOOP = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    X = torch.randn(100, 3)
    y = torch.randint(0, 2, (100,))
    X_tr, y_tr = X[:80] * 1000.0, y[:80]  # <made>
    loader = DataLoader(TensorDataset(X_tr, y_tr), batch_size=16, shuffle=True)
    model = torch.nn.Linear(3, 2)
    criterion = torch.nn.CrossEntropyLoss()
    for epoch in range(2):
        for xb, yb in loader:
            out = model(xb)
            loss = criterion(out, yb)  # <use>
            loss.backward()
"""


def test_loss_call_traced_through_the_loop_and_the_wrappers(tmp_path):
    got, made, use = _origin(tmp_path, TORCH_LOOP)
    assert got == made != use


def test_in_place_changes_are_where_the_data_was_made(tmp_path):
    got, made, _ = _origin(tmp_path, """
        import numpy as np
        from torch.utils.data import DataLoader, TensorDataset

        def main():
            features = np.load("x.npy")
            labels = np.load("y.npy")
            features[:, 0] = labels  # <made>
            ds = TensorDataset(features, labels)
            for batch_x, batch_y in DataLoader(ds, batch_size=8):
                loss = loss_fn(net(batch_x), batch_y)  # <use>
    """)
    assert got == made


def test_an_in_place_shuffle_of_the_labels(tmp_path):
    got, made, _ = _origin(tmp_path, """
        import numpy as np
        X, y = np.load("x.npy"), np.load("y.npy")
        np.random.shuffle(y)  # <made>
        model.fit(X, y, epochs=3)  # <use>
    """, role="targets")
    assert got == made


@pytest.mark.parametrize("role,marker", [("targets", "y"), ("inputs", "X")])
def test_keras_fit_follows_the_half_the_finding_is_about(tmp_path, role, marker):
    source = """
        import numpy as np
        X = np.load("x.npy") / 255.0  # <X>
        y = np.load("y.npy")[::-1]  # <y>
        model.compile(loss="sparse_categorical_crossentropy")
        model.fit(X, y, epochs=3, validation_split=0.2)  # <use>
    """.replace(f"# <{marker}>", "# <made>")
    got, made, _ = _origin(tmp_path, source, role=role)
    assert got == made


def test_an_argument_computed_on_the_fit_line_was_made_there(tmp_path):
    got, made, use = _origin(tmp_path, """
        X, y = load()
        model.fit(X * 1000, y, epochs=3)  # <use>
    """, role="inputs")
    assert got == use == made


def test_tf_data_pipeline_methods_are_wrappers(tmp_path):
    got, made, _ = _origin(tmp_path, """
        import tensorflow as tf
        x, y = load()
        y = 1 - y  # <made>
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(100).batch(32)
        for xb, yb in ds:
            with tf.GradientTape() as tape:
                loss = loss_object(yb, model(xb))  # <use>
    """)
    assert got == made


def test_data_sampled_each_step_stops_at_the_sampling_line(tmp_path):
    got, made, _ = _origin(tmp_path, """
        import torch
        tokens, labels = make_data()
        model = TinyTransformer(vocab=64)
        for step in range(100):
            idx = torch.randint(0, len(tokens), (32,))
            xb, yb = tokens[idx], labels[idx]  # <made>
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)  # <use>
    """)
    assert got == made


def test_a_parameter_is_followed_to_the_one_call_site(tmp_path):
    got, made, _ = _origin(tmp_path, """
        import tensorflow as tf
        points, labels = load()
        points = points * 1000.0  # <made>
        ds = tf.data.Dataset.from_tensor_slices((points[:1600], labels[:1600])).batch(64)

        @tf.function
        def train_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_object(y, model(x, training=True))  # <use>
            return loss

        for epoch in range(3):
            for xb, yb in ds:
                train_step(xb, yb)
    """, role="inputs")
    assert got == made


def test_a_parameter_of_a_helper_called_from_several_places_is_not_followed(tmp_path):
    got, _, use = _origin(tmp_path, """
        def run_epoch(model, loader, criterion):
            for xb, yb in loader:
                loss = criterion(model(xb), yb)  # <use>

        run_epoch(net, train_loader, ce)
        run_epoch(net, other_loader, ce)
    """)
    assert got == use


def test_a_file_that_cannot_be_read_keeps_the_location(tmp_path):
    assert data_origin({"file": str(tmp_path / "gone.py"), "line": 3}) == \
        {"file": str(tmp_path / "gone.py"), "line": 3}
    bad = tmp_path / "bad.py"
    bad.write_text("def (:\n")
    assert data_origin({"file": str(bad), "line": 1})["line"] == 1
    assert data_origin(None) is None


def test_the_use_line_is_kept_in_the_location(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(TORCH_LOOP))
    use = next(i for i, line in enumerate(textwrap.dedent(TORCH_LOOP).splitlines(), 1)
               if "# <use>" in line)
    got = data_origin({"file": str(path), "line": use})
    assert got["used_at"] == use and got["file"] == str(path)


def test_a_misaligned_pair_is_located_at_the_later_change_of_either_half(tmp_path):
    got, made, _ = _origin(tmp_path, """
        import numpy as np
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        features = np.load("x.npy")
        labels = np.load("y.npy")
        features = features[np.argsort(dates)]  # <made>
        X, y = torch.from_numpy(features), torch.from_numpy(labels)
        loader = DataLoader(TensorDataset(X, y), batch_size=50, shuffle=True)
        model = Net()
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)  # <use>
    """)
    assert got == made


def test_index_names_are_not_the_data(tmp_path):
    got, made, _ = _origin(tmp_path, """
        X = torch.randn(512, 8)
        y = torch.randint(0, 4, (512,))  # <made>
        model = Net()
        for i in range(0, len(X), 32):
            loss = F.cross_entropy(model(X[i:i + 32]), y[i:i + 32])  # <use>
    """)
    assert got == made


@pytest.mark.parametrize("role,marker", [("inputs", "X"), ("targets", "y")])
def test_settings_and_module_paths_are_not_data(tmp_path, role, marker):
    """``xb.to(device)``, ``torch.utils.data.TensorDataset``, ``.batch(BATCH)``: the trace
    follows the data, never the device, the module or the batch size."""
    source = """
        import torch
        device = torch.device("cpu")
        BATCH = 32
        X = torch.load("x.pt") * 255.0  # <X>
        y = torch.tensor(labels) - 1  # <y>
        ds = torch.utils.data.TensorDataset(X, y)
        loader = torch.utils.data.DataLoader(ds, BATCH, shuffle=True)
        model = Net().to(device)
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = criterion(model(xb), yb)  # <use>
    """.replace(f"# <{marker}>", "# <made>")
    got, made, _ = _origin(tmp_path, source, role=role)
    assert got == made


def test_a_tf_data_pipeline_with_settings_follows_the_arrays(tmp_path):
    got, made, _ = _origin(tmp_path, """
        import tensorflow as tf
        BUF, BATCH = 1000, 32
        x = load_images() / 127.5 - 1.0  # <made>
        y = load_labels()
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(BUF).batch(BATCH)
        for xb, yb in ds:
            with tf.GradientTape() as tape:
                loss = loss_object(yb, model(xb))  # <use>
    """, role="inputs")
    assert got == made


LIGHTNING_FIT = """
    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    inputs = torch.randn(100, 3)
    targets = (inputs[:, 0] > 0).long()
    targets = targets[torch.randperm(100)]  # <made>
    train = DataLoader(TensorDataset(inputs, targets), batch_size=16)
    trainer = pl.Trainer(max_epochs=2)
    trainer.fit(Net(), train)  # <use>
"""


def test_a_lightning_fit_hands_over_its_second_argument_not_the_model(tmp_path):
    got, made, use = _origin(tmp_path, LIGHTNING_FIT, "targets")
    assert got == made != use


def test_a_keras_fit_still_takes_inputs_first(tmp_path):
    source = """
        import numpy as np
        x = np.random.rand(10, 3) * 1000  # <made>
        y = np.random.rand(10)
        model.fit(x, y, epochs=2)  # <use>
    """
    got, made, _ = _origin(tmp_path, source, "inputs")
    assert got == made


HF_ROWS = """
    import torch
    from transformers import Trainer

    token_ids = torch.randint(5, 60, (400, 12))
    scores = token_ids[:, :4].float().mean(1)
    scores[::37] = float("nan")  # <made>
    rows = [{"input_ids": ids, "labels": s} for ids, s in zip(token_ids, scores)]
    Trainer(model=model, args=args, train_dataset=rows).train()  # <use>
"""


def test_hf_train_dataset_traced_through_rows_repacked_by_a_comprehension(tmp_path):
    got, made, use = _origin(tmp_path, HF_ROWS, "targets")
    assert got == made != use
    got, _, _ = _origin(tmp_path, HF_ROWS, "inputs")
    assert got == 5  # token_ids, the inputs half of the zip


def test_a_comprehension_that_computes_is_where_the_data_was_made(tmp_path):
    source = """
        raw = load()
        rows = [x / 255 for x in raw]  # <made>
        Trainer(model=model, train_dataset=rows).train()  # <use>
    """
    got, made, _ = _origin(tmp_path, source, "inputs")
    assert got == made


def test_one_split_of_both_halves_keeps_them_aligned(tmp_path):
    source = """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        x = torch.randn(100, 3)
        y = (x[:, 0] > 0).long()
        y = y[torch.randperm(100)]  # <made>
        loader = DataLoader(TensorDataset(x[:80], y[:80]), batch_size=8)
        trainer = pl.Trainer(max_epochs=1)
        trainer.fit(Net(), loader)  # <use>
    """
    got, made, _ = _origin(tmp_path, source)  # no role: label alignment
    assert got == made


def test_different_splits_of_the_halves_are_where_they_were_paired(tmp_path):
    source = """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        x = torch.randn(100, 3)
        y = (x[:, 0] > 0).long()
        loader = DataLoader(TensorDataset(x[:80], y[20:]), batch_size=8)  # <made>
        trainer = pl.Trainer(max_epochs=1)
        trainer.fit(Net(), loader)  # <use>
    """
    got, made, _ = _origin(tmp_path, source)
    assert got == made


STEP_FUNCTION = """
    import numpy as np
    import tensorflow as tf

    points = np.random.uniform(-1, 1, size=(200, 2)).astype("float32")
    points[::50] = np.nan  # <inputs>
    inside = (points[:, 0] > 0).astype("float32")  # <targets>
    train_ds = (tf.data.Dataset.from_tensor_slices((points, inside))  # <batches>
                .shuffle(200).batch(32))

    @tf.function
    def train_step(x, y):
        return x, y

    for epoch in range(2):
        for x_batch, y_batch in train_ds:
            loss = train_step(x_batch, y_batch)  # <use>
"""


@pytest.mark.parametrize("role, marker", [("inputs", "inputs"), ("targets", "targets")])
def test_a_step_function_of_the_file_takes_inputs_first(tmp_path, role, marker):
    got, _, _ = _origin(tmp_path, STEP_FUNCTION.replace(f"# <{marker}>", "# <made>"), role)
    lines = textwrap.dedent(STEP_FUNCTION).splitlines()
    assert got == next(i for i, line in enumerate(lines, 1) if f"# <{marker}>" in line)


def test_a_call_of_a_library_function_is_not_read_as_inputs_then_targets(tmp_path):
    """``np.dot(a, b)`` is not a step of this file: no half is taken as the inputs."""
    src = """
        import numpy as np
        a = np.ones((4, 2))
        b = np.ones((2, 4))
        out = np.dot(a, b)  # <use>
    """
    assert _origin(tmp_path, src, "inputs")[0] == 5


@pytest.mark.parametrize("loop, expected", [
    ("for x_batch, y_batch in train_ds:", "batches"),
    ("for step, (x_batch, y_batch) in enumerate(train_ds):", "batches"),
    ("for x_batch, y_batch in train_ds.take(3):", "loop"),
])
def test_the_batches_are_traced_to_the_iterable_not_the_arrays(tmp_path, loop, expected):
    from model_debugger.provenance import batches_origin

    source = textwrap.dedent(STEP_FUNCTION).replace(
        "for x_batch, y_batch in train_ds:", loop + "  # <loop>")
    path = tmp_path / "train.py"
    path.write_text(source)
    lines = source.splitlines()
    at = {m: next(i for i, line in enumerate(lines, 1) if f"# <{m}>" in line)
          for m in ("use", "batches", "loop")}
    got = batches_origin({"file": str(path), "line": at["use"]})
    assert got["line"] == at[expected] and got.get("used_at") == at["use"]


SETTINGS = """
    import argparse
    from dataclasses import dataclass

    CONFIG = {"lr": 0.3,  # <lr>
              "batch_size": 1}  # <batch_size>


    @dataclass
    class Opts:
        momentum: float = 0.999  # <momentum>


    parser = argparse.ArgumentParser()
    parser.add_argument("--weight-decay", type=float,
                        default=5.0)  # <weight_decay>
    args = parser.parse_args()
    size = CONFIG["batch_size"]
    rows = size
    loader = DataLoader(data, batch_size=rows)  # <use batch_size>
    opt = SGD(params, lr=CONFIG["lr"], momentum=Opts().momentum,  # <use lr momentum>
              weight_decay=args.weight_decay)
    literal = SGD(params, lr=0.5, momentum=0.9 * 1.1)  # <use literal>
"""


def _settings(tmp_path, source: str):
    """``(line_of(marker), origin(use marker, keyword), path)`` for a program's settings."""
    from model_debugger.provenance import setting_origin

    source = textwrap.dedent(source)
    path = tmp_path / "train.py"
    path.write_text(source)
    lines = source.splitlines()

    def line_of(marker):
        return next(i for i, text in enumerate(lines, 1) if marker in text)

    def origin(use, keyword):
        return setting_origin({"file": str(path), "line": line_of(use)}, keyword)["line"]

    return line_of, origin, path


PARAMETERS = """
    class Net(Model):
        def __init__(self, init="zeros", act="sigmoid"):  # <defaults>
            super().__init__()
            self.a = Dense(8, kernel_initializer=init)  # <use init>
            self.b = Dense(8, activation=act)  # <use act>


    def block(width, act):
        return Dense(width, activation=act)  # <use block>


    net = Net(act="tanh")  # <caller>
    first = block(8, "relu")
    second = block(8, "gelu")
"""


def test_a_setting_passed_as_a_parameter_is_located_at_its_default_or_its_one_caller(tmp_path):
    """``kernel_initializer=init`` with ``init="zeros"`` a default nobody overrides: the
    signature; ``act`` overridden by the one call that builds the model: that call; a
    parameter two callers pass differently: no single setting, the use stays."""
    line_of, origin, _ = _settings(tmp_path, PARAMETERS)
    assert origin("<use init>", "kernel_initializer") == line_of("<defaults>")
    assert origin("<use act>", "activation") == line_of("<caller>")
    assert origin("<use block>", "activation") == line_of("<use block>")


def test_a_setting_passed_by_name_or_config_is_located_where_it_was_set(tmp_path):
    from model_debugger.provenance import setting_origin

    line_of, origin, path = _settings(tmp_path, SETTINGS)

    assert origin("<use batch_size>", "batch_size") == line_of("<batch_size>")
    assert origin("<use lr", "lr") == line_of("<lr>")  # a dict entry
    assert origin("<use lr", "momentum") == line_of("<momentum>")  # a dataclass field
    assert origin("<use lr", "weight_decay") == line_of("<weight_decay>")  # an argparse default
    for keyword in ("lr", "momentum"):  # a literal, or computed at the call: the call's line
        assert origin("<use literal>", keyword) == line_of("<use literal>")
    assert setting_origin({"file": str(path), "line": line_of("<use lr")}, "betas") == \
        {"file": str(path), "line": line_of("<use lr")}  # not passed: unchanged


def test_a_config_built_below_the_function_that_reads_it_leads_to_its_argparse_default(
        tmp_path):
    """``train(config)`` reads ``config["lr"]``; ``main()`` below builds the dict from
    ``args.lr``, whose ``add_argument`` default is the setting."""
    line_of, origin, _ = _settings(tmp_path, """
        import argparse

        def get_args():
            p = argparse.ArgumentParser()
            p.add_argument("--lr", type=float, default=0.5)  # <lr>
            p.add_argument("--momentum", type=float, default=0.9)
            return p.parse_args()

        def train(config):
            opt = SGD(params, lr=config["lr"], momentum=config["momentum"])  # <use>
            clip = config["clip"]
            loader = DataLoader(data, batch_size=config["batch"])  # <batch use>

        def main():
            args = get_args()
            config = {"lr": args.lr, "momentum": args.momentum, "clip": 1.0,
                      "batch": 512}  # <batch>
            train(config)
    """)

    assert origin("<use>", "lr") == line_of("<lr>")
    assert origin("<batch use>", "batch_size") == line_of("<batch>")  # written in the dict


def test_a_step_called_inside_a_comprehension_is_followed_to_the_data(tmp_path):
    got, made, _ = _origin(tmp_path, """
        import numpy as np
        import tensorflow as tf
        X = np.random.normal(size=(500, 4)).astype("float32")
        price = 250_000 + 60_000 * X[:, 0]  # <made>
        y = price.astype("float32").reshape(-1, 1)
        ds = tf.data.Dataset.from_tensor_slices((X, y)).shuffle(500).batch(64)

        def train_step(xb, yb):
            return mse(yb, net(xb))

        for epoch in range(3):
            losses = [float(train_step(xb, yb)) for xb, yb in ds]  # <use>
    """, role="targets")
    assert got == made


SEMICOLONS = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    X = torch.randn(200, 4)  # <inputs>
    y = (X[:, 0] > 0).long()[torch.randperm(200)]  # <targets>
    loader = DataLoader(TensorDataset(X, y), batch_size=32, shuffle=True)  # <batches>
    model = torch.nn.Linear(4, 2); lossf = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for xb, yb in loader:
        opt.zero_grad(); loss = lossf(model(xb), yb); loss.backward(); opt.step()  # <use>
"""


@pytest.mark.parametrize("role", ["inputs", "targets"])
def test_several_statements_on_the_use_line_are_each_traced(tmp_path, role):
    """``opt.zero_grad(); loss = crit(model(x), y)``: the loss is not the line's first statement."""
    source = textwrap.dedent(SEMICOLONS)
    path = tmp_path / "train.py"
    path.write_text(source)
    lines = source.splitlines()
    at = {m: next(i for i, line in enumerate(lines, 1) if f"# <{m}>" in line)
          for m in ("use", "inputs", "targets", "batches")}
    assert data_origin({"file": str(path), "line": at["use"]}, role)["line"] == at[role]


def test_a_setting_and_the_batches_found_in_a_later_statement_of_the_line(tmp_path):
    from model_debugger.provenance import batches_origin, setting_origin

    source = textwrap.dedent(SEMICOLONS).replace(
        "lr=0.1)", "lr=RATE)").replace("import torch\n", "import torch\nRATE = 3.0  # <lr>\n", 1)
    source = source.replace("opt = torch.optim.SGD(model.parameters(), lr=RATE)\n", "").replace(
        "lossf = torch.nn.CrossEntropyLoss()",
        "lossf = torch.nn.CrossEntropyLoss(); opt = torch.optim.SGD(model.parameters(), lr=RATE)"
        "  # <opt>")
    path = tmp_path / "train.py"
    path.write_text(source)
    lines = source.splitlines()
    at = {m: next(i for i, line in enumerate(lines, 1) if f"# <{m}>" in line)
          for m in ("use", "lr", "opt", "batches")}
    assert setting_origin({"file": str(path), "line": at["opt"]}, "lr")["line"] == at["lr"]
    assert batches_origin({"file": str(path), "line": at["use"]})["line"] == at["batches"]


CLASS_TRAINER = """
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    class Data:
        def __init__(self, seed):
            self.rng = np.random.default_rng(seed)
            self.train_ds = None

        def setup(self):
            X = np.random.rand(200, 8).astype(np.float32)
            y = np.random.randint(0, 3, 200)
            X = X[self.rng.permutation(len(X))]  # <inputs>
            y = y[self.rng.permutation(len(y))]  # <targets>
            self.train_ds = TensorDataset(torch.from_numpy(X[40:]), torch.from_numpy(y[40:]))

        def train_loader(self):
            return DataLoader(self.train_ds, batch_size=32, shuffle=True)


    class Trainer:
        def __init__(self, model, data):
            self.model, self.data = model, data
            self.loss_fn = torch.nn.CrossEntropyLoss()

        def epoch(self):
            for xb, yb in self.data.train_loader():
                loss = self.loss_fn(self.model(xb), yb)  # <use>
                loss.backward()
"""


@pytest.mark.parametrize("role,mark", [("targets", "<targets>"), ("inputs", "<inputs>"),
                                       (None, "<targets>")])
def test_a_class_based_trainer_is_traced_through_self_attributes_and_a_getter(
        tmp_path, role, mark):
    """``self.data.train_loader()`` returns ``DataLoader(self.train_ds)``, which ``setup``
    assigned from arrays permuted two lines above: the getter is followed through its return,
    the attribute to its assignment, ``self.model(xb)`` gives the inputs; without a role the
    one split of both arrays keeps them paired, so the later permutation is the origin."""
    source = CLASS_TRAINER.replace(f"# {mark}", "# <made>")
    got, made, use = _origin(tmp_path, source, role)
    assert got == made != use


def test_a_getter_that_computes_its_data_stays_the_origin(tmp_path):
    got, made, use = _origin(tmp_path, """
        import torch

        def scaled(x):
            return x * 1000.0

        X = torch.randn(100, 3)
        y = torch.randn(100, 1)
        Xs = scaled(X)  # <made>
        model = torch.nn.Linear(3, 1)
        loss = torch.nn.functional.mse_loss(model(Xs), y)  # <use>
    """, "inputs")
    assert got == made != use


def test_one_dataset_handed_to_fit_carries_the_targets_too(tmp_path):
    got, made, use = _origin(tmp_path, """
        import numpy as np
        import tensorflow as tf

        feats = np.random.rand(400, 4).astype("float32")
        price = 320_000 + 95_000 * np.random.rand(400)  # <made>
        price = price.astype("float32")
        train_ds = tf.data.Dataset.from_tensor_slices((feats, price)).shuffle(400).batch(32)
        model.fit(train_ds, epochs=3)  # <use>
    """, "targets")
    assert got == made != use


@pytest.mark.parametrize("role,expect", [("inputs", "made"), (None, "split")])
def test_a_random_split_keeps_the_scale_but_changes_the_rows(tmp_path, role, expect):
    source = """
        import numpy as np
        from sklearn.model_selection import train_test_split

        def load():
            X = np.random.rand(300, 5)
            X_raw = X * np.logspace(-2, 5, 5)  # <made>
            return X_raw.astype("float32"), np.random.randint(0, 3, 300)

        X, y = load()
        X_tr, X_va, y_tr, y_va = train_test_split(X, y, test_size=0.2)  # <split>
        model.fit(X_tr, y_tr, epochs=2)  # <use>
    """
    if expect == "split":
        source = source.replace("# <made>", "").replace("# <split>", "# <made>")
    got, made, use = _origin(tmp_path, source, role)
    assert got == made != use


@pytest.mark.parametrize("assigned", [False, True])
def test_a_scaling_whose_result_is_thrown_away_is_where_unscaled_data_was_made(tmp_path,
                                                                               assigned):
    from model_debugger.provenance import discarded_scaling

    fit = "X_tr = scaler.fit_transform(X_tr)" if assigned else "scaler.fit_transform(X_tr)"
    test = "X_te = scaler.transform(X_te)" if assigned else "scaler.transform(X_te)"
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(f"""\
        X_tr, X_te, y_tr, y_te = split(X, y)
        scaler = StandardScaler()
        {fit}
        {test}
        model.fit(X_tr, y_tr)
        """))
    got = discarded_scaling({"file": str(path), "line": 1, "used_at": 5})
    if assigned:
        assert got is None  # the scaled copies are used: nothing was thrown away
    else:  # the training split's fit_transform, not the test split's transform
        assert got == {"file": str(path), "line": 3, "used_at": 5}


@pytest.mark.parametrize("passed,found", [("X_tr_s", False), ("X_tr", True)])
def test_a_scaled_copy_made_and_not_trained_on_is_found_at_the_use(tmp_path, passed, found):
    """``X_tr_s = scaler.transform(X_tr)`` then ``fit(X_tr, ...)``: the scaling was done under
    another name and the raw array trains; the fix is the argument where it is used."""
    from model_debugger.provenance import scaled_copy_unused

    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(f"""\
        X_tr, X_te, y_tr, y_te = split(X, y)
        scaler = StandardScaler().fit(X_tr)
        X_tr_s = scaler.transform(X_tr)
        X_te_s = scaler.transform(X_te)
        model.fit({passed}, y_tr,
                  validation_data=(X_te_s, y_te))
        """))
    got = scaled_copy_unused({"file": str(path), "line": 1, "used_at": 5})
    assert got == ({"file": str(path), "line": 5, "used_at": 5} if found else None)


def test_an_evaluation_forward_is_traced_to_the_validation_dataset(tmp_path):
    """``out = model(xb)`` (one call, no loss on the line: where the capture saw the first
    evaluation forward) gives the inputs, traced through the loop and the loader to the
    dataset that was built without the training statistics."""
    got, made, _ = _origin(tmp_path, """
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Digits(Dataset):
            def __init__(self, x, y, mean=0.0, std=1.0):
                self.x, self.y = (x - mean) / std, y
            def __len__(self):
                return len(self.x)
            def __getitem__(self, i):
                return self.x[i], self.y[i]

        X_tr, y_tr, X_val, y_val = torch.randn(80, 4), torch.zeros(80), torch.randn(20, 4), torch.zeros(20)
        train_ds = Digits(X_tr, y_tr, mean=X_tr.mean(0), std=X_tr.std(0))
        val_ds = Digits(X_val, y_val)  # <made>
        val_loader = DataLoader(val_ds, batch_size=8)
        model = torch.nn.Linear(4, 2)
        with torch.no_grad():
            for xb, yb in val_loader:
                out = model(xb)  # <use>
                print(out.argmax(1))
        """, "inputs")
    assert got == made


@pytest.mark.parametrize("split", [
    "X_tr, X_val, y_tr, y_val = train_test_split(X, y, train_size=0.04)  # <made>",
    "X_tr, y_tr = X[:160], y[:160]  # <made>",
])
def test_the_rows_of_the_training_inputs_are_traced_to_the_split_that_chose_them(tmp_path, split):
    """For how many rows there are (``ROWS``), a scaling that keeps every row is seen through
    and the split or slice is the origin; for the values (``inputs``) the scaling is."""
    from model_debugger.provenance import ROWS, selects_rows

    source = f"""
        import numpy as np
        from sklearn.model_selection import train_test_split
        from sklearn.preprocessing import StandardScaler
        X, y = np.random.rand(4000, 8), np.random.randint(0, 2, 4000)
        {split}
        scaler = StandardScaler().fit(X_tr)
        X_tr = scaler.transform(X_tr).astype("float32")  # <values>
        model.fit(X_tr, y_tr, epochs=3)  # <use>
        """
    got, made, use = _origin(tmp_path, source, ROWS)
    assert got == made
    assert selects_rows({"file": str(tmp_path / "train.py"), "line": got})
    values = next(i for i, line in enumerate(textwrap.dedent(source).splitlines(), 1)
                  if "# <values>" in line)
    assert _origin(tmp_path, source, "inputs")[0] == values
    assert not selects_rows({"file": str(tmp_path / "train.py"), "line": values})


@pytest.mark.parametrize("applied, expect", [
    ("X_tr = preprocess.fit_transform(X_tr)", 2),   # the pipeline object, built at line 2
    ("X_tr = SimpleImputer().fit_transform(X_tr)", None),  # no object of the file applied
    ("X_tr = np.log1p(X_tr)", None),
])
def test_data_made_by_a_preprocessing_object_is_located_at_the_object(tmp_path, applied,
                                                                      expect):
    """A pipeline without a scaler left the inputs unscaled: the data is what that object
    made, so a finding about the scale points at the object (``Pipeline([...])``), not at the
    call that applied it."""
    from model_debugger.provenance import scaling_pipeline

    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(f"""\
        X_tr, X_te, y_tr, y_te = train_test_split(X, y)
        preprocess = Pipeline([
            ("impute", SimpleImputer(strategy="median")),
        ])
        {applied}
        model.fit(X_tr, y_tr)
        """))
    got = scaling_pipeline({"file": str(path), "line": 5, "used_at": 6})
    assert (got and got["line"]) == expect


@pytest.mark.parametrize("broken", [
    # the labels read with a header line they do not have: every label moves up one row
    ('X = np.loadtxt(feats, delimiter=",", skiprows=1)',
     "y = np.loadtxt(labels, skiprows=1).astype(int)  # <made>"),
    # each half shuffled with its own permutation
    ("X = X[np.random.permutation(len(X))]", "y = y[np.random.permutation(len(y))]  # <made>"),
])
def test_misaligned_labels_are_located_where_one_half_lost_its_pair(tmp_path, broken):
    """``label_alignment`` is seen at ``fit``; the rows were moved where the labels (or only
    the inputs) were read, shuffled or shifted, not at the later scaling of the inputs."""
    from model_debugger.probes.label_alignment import _pairing_location

    source = f"""
        import numpy as np
        from sklearn.preprocessing import StandardScaler
        X, y = np.random.rand(400, 8), np.random.randint(0, 2, 400)
        {broken[0]}
        {broken[1]}
        X_train, y_train = X[:300], y[:300]
        X_train = StandardScaler().fit_transform(X_train)
        model.fit(X_train, y_train, epochs=3)  # <use>
        """
    lines = textwrap.dedent(source).splitlines()
    (tmp_path / "train.py").write_text(textwrap.dedent(source))
    made = next(i for i, line in enumerate(lines, 1) if "# <made>" in line)
    use = next(i for i, line in enumerate(lines, 1) if "# <use>" in line)
    got = _pairing_location({"file": str(tmp_path / "train.py"), "line": use})
    assert got["line"] == made, (got, made)


def test_misaligned_inputs_alone_are_located_at_their_shuffle(tmp_path):
    from model_debugger.probes.label_alignment import _pairing_location

    source = textwrap.dedent("""
        import numpy as np
        X, y = np.random.rand(400, 8), np.random.randint(0, 2, 400)
        X = X[np.random.permutation(len(X))]  # <made>
        y = y.astype(int)
        model.fit(X, y, epochs=3)  # <use>
        """)
    (tmp_path / "train.py").write_text(source)
    got = _pairing_location({"file": str(tmp_path / "train.py"), "line": 6})
    assert got["line"] == 4, got


def test_the_rows_are_traced_into_a_loading_function_that_scales_what_it_returns(tmp_path):
    """``X_tr, y_tr, ... = load_data()`` where ``load_data`` splits with ``train_size=0.05``
    and returns the scaled arrays: the scaling keeps every row, so for ``ROWS`` the function
    hands its split on (the origin was the call line)."""
    from model_debugger.provenance import ROWS, selects_rows

    source = """
        import numpy as np
        from sklearn.model_selection import train_test_split
        from sklearn.preprocessing import StandardScaler

        def load_data():
            X, y = np.random.rand(2500, 8), np.random.randint(0, 3, 2500)
            X_tr, X_ho, y_tr, y_ho = train_test_split(X, y, train_size=0.05)  # <made>
            scaler = StandardScaler().fit(X_tr)
            return scaler.transform(X_tr).astype("float32"), y_tr, scaler.transform(X_ho), y_ho

        X_train, y_train, X_hold, y_hold = load_data()
        model.fit(X_train, y_train, epochs=3)  # <use>
        """
    got, made, use = _origin(tmp_path, source, ROWS)
    assert got == made and selects_rows({"file": str(tmp_path / "train.py"), "line": got})
    assert _origin(tmp_path, source, "inputs")[0] != made  # the values: made by the scaling


@pytest.mark.parametrize("held", [
    "(X_va, y_va)",
    '({"numeric": X_va}, y_va)',
])
def test_validation_inputs_are_traced_from_fit_to_where_they_were_made(tmp_path, held):
    """A shift between training and validation inputs is seen at ``fit``: for VALIDATION the
    trace follows ``validation_data`` (it followed the training inputs, whose transform is
    right)."""
    from model_debugger.provenance import VALIDATION

    source = f"""
        import numpy as np
        from sklearn.preprocessing import StandardScaler
        X, y = np.random.rand(400, 4), np.random.randint(0, 2, 400)
        scaler = StandardScaler()
        X_tr = scaler.fit_transform(np.log1p(X[:300]))
        X_va = scaler.transform(X[300:])  # <made>
        y_tr, y_va = y[:300], y[300:]
        model.fit(X_tr, y_tr, validation_data={held}, epochs=3)  # <use>
        """
    got, made, use = _origin(tmp_path, source, VALIDATION)
    assert got == made
    assert _origin(tmp_path, source, "inputs")[0] == made - 1  # the training inputs'


@pytest.mark.parametrize("call,keyword", [
    ("torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)", "max_norm"),
    ("opt = torch.optim.SGD(model.parameters(), MAX_NORM)", "lr"),
    ("opt = torch.optim.SGD(model.parameters(), 0.1, MAX_NORM)", "momentum"),
    ("loader = DataLoader(ds, MAX_NORM)", "batch_size"),
    ("opt = keras.optimizers.SGD(MAX_NORM)", "learning_rate"),
])
def test_a_setting_passed_by_position_is_located_where_it_was_set(tmp_path, call, keyword):
    """``clip_grad_norm_(params, MAX_NORM)``: the value is at the setting's usual position,
    traced to the constant (the call's line was kept)."""
    from model_debugger.provenance import setting_origin

    path = tmp_path / "train.py"
    path.write_text(f"MAX_NORM = 1e-4\nx = 1\n{call}\n")
    assert setting_origin({"file": str(path), "line": 3}, keyword)["line"] == 1
    path.write_text(f"MAX_NORM = 1e-4\nx = 1\n{call.replace('MAX_NORM', '0.5')}\n")
    assert setting_origin({"file": str(path), "line": 3}, keyword)["line"] == 3  # a literal


@pytest.mark.parametrize("call,keyword,line", [
    ("opt = keras.optimizers.SGD(LR, MOMENTUM)", "lr", 1),  # Keras: the rate first
    ("opt = keras.optimizers.SGD(LR, MOMENTUM)", "momentum", 2),
    ("opt = torch.optim.SGD(groups, LR)", "lr", 1),  # PyTorch: the parameters first
    ("opt = torch.optim.SGD(groups, 0.1)", "learning_rate", 4),  # no such position: the call
])
def test_an_optimizer_positional_setting_follows_its_framework_layout(tmp_path, call, keyword,
                                                                        line):
    from model_debugger.provenance import setting_origin

    path = tmp_path / "train.py"
    path.write_text(f"LR = 0.05\nMOMENTUM = 0.9\ngroups = [{{'params': []}}]\n{call}\n")
    assert setting_origin({"file": str(path), "line": 4}, keyword)["line"] == line


HELPERS = """
    import numpy as np

    def shuffle_in_unison(X, y, seed):
        rng = np.random.default_rng(seed)
        X = X[rng.permutation(len(X))]  # <X>
        y = y[rng.permutation(len(y))]  # <y>
        return X, y

    def split(X, y, n_val):
        return (X[n_val:], y[n_val:]), (X[:n_val], y[:n_val])

    def minibatches(X, y, size, rng):
        idx = rng.permutation(len(X))
        for start in range(0, len(X), size):
            b = idx[start:start + size]
            yield X[b], y[b]

    def train_one_epoch(model, X, y, rng):
        for xb, yb in minibatches(X, y, 64, rng):
            loss = loss_fn(model(xb), yb)  # <use>

    def main():
        X, y = load()
        X, y = shuffle_in_unison(X, y, 0)
        (X_tr, y_tr), (X_va, y_va) = split(X, y, 200)
        for epoch in range(5):
            train_one_epoch(model, X_tr, y_tr, rng)
"""


@pytest.mark.parametrize("role,marker", [("targets", "y"), ("inputs", "X")])
def test_helpers_that_batch_split_and_shuffle_are_followed_per_half(tmp_path, role, marker):
    """A generator's batches (``yield X[b], y[b]``) and a split's nested unpacking keep each
    half apart, so the trace reaches the line inside the helper that moved that half."""
    got, made, _ = _origin(tmp_path, HELPERS.replace(f"# <{marker}>", "# <made>"), role=role)
    assert got == made


def test_a_shuffle_helper_called_twice_is_located_inside_it(tmp_path):
    """Called for two datasets, the helper has no single caller to follow; the line inside it
    that moves the labels is still where the pairing broke."""
    from model_debugger.provenance import reorder_within

    source = textwrap.dedent("""
        import numpy as np

        def shuffled(X, y):
            X = X[np.random.permutation(len(X))]
            y = y[np.random.permutation(len(y))]  # <made>
            return X, y

        Xa, ya = shuffled(*load("a"))  # <call>
        Xb, yb = shuffled(*load("b"))
        Xc, yc = load("c")  # <plain>
    """)
    path = tmp_path / "train.py"
    path.write_text(source)
    lines = source.splitlines()
    at = {tag: next(i for i, line in enumerate(lines, 1) if f"# <{tag}>" in line)
          for tag in ("made", "call", "plain")}
    assert reorder_within({"file": str(path), "line": at["call"]}, last=True)["line"] == \
        at["made"]
    assert reorder_within({"file": str(path), "line": at["plain"]}, last=True) is None


def test_named_inputs_of_fit_are_followed_to_the_latest_made(tmp_path):
    """``fit({"numeric": X_num, "region": X_cat}, y)``: each named input is traced; the
    latest line that made one of them is the inputs' origin (it was the fit line)."""
    got, made, use = _origin(tmp_path, """
        X_num, X_cat, y = load()
        X_tr, X_va, c_tr, c_va, y_tr, y_va = train_test_split(X_num, X_cat, y)
        X_tr = scaler.fit_transform(X_tr)  # <made>
        model.fit({"numeric": X_tr, "region": c_tr}, y_tr, epochs=3)  # <use>
    """, role="inputs")
    assert got == made != use


@pytest.mark.parametrize("role,marker", [("targets", "y"), ("inputs", "X")])
def test_a_generator_under_enumerate_keeps_its_halves(tmp_path, role, marker):
    """``for i, (xb, yb) in enumerate(minibatches(X, y))``: the counter is not a half."""
    source = """
        def minibatches(X, y, size):
            for start in range(0, len(X), size):
                yield X[start:start + size], y[start:start + size]

        X, y = load()
        X = X * 1000.0  # <X>
        y = y[::-1]  # <y>
        for i, (xb, yb) in enumerate(minibatches(X, y, 64)):
            loss = loss_fn(model(xb), yb)  # <use>
    """.replace(f"# <{marker}>", "# <made>")
    got, made, _ = _origin(tmp_path, source, role=role)
    assert got == made


def test_a_later_dict_that_is_not_the_config_handed_in_is_no_setting(tmp_path):
    """``cfg`` comes from a file; a later ``print({"lr": ...})`` is not where it was set."""
    line_of, origin, _ = _settings(tmp_path, """
        import json

        def train(cfg):
            opt = SGD(params, lr=cfg["lr"])  # <use>
            for epoch in range(3):
                print({"epoch": epoch, "lr": opt.param_groups[0]["lr"]})

        train(json.load(open("cfg.json")))
    """)
    assert origin("<use>", "lr") == line_of("<use>")


def test_the_exit_that_cut_the_pass_is_the_one_on_the_batch_count(tmp_path):
    """A NaN guard's ``break`` comes first in the loop; the one on the counter cut the passes."""
    from model_debugger.provenance import loop_exit

    source = textwrap.dedent("""
        for epoch in range(10):
            for i, (xb, yb) in enumerate(loader):  # <loop>
                loss = step(xb, yb)
                if not torch.isfinite(loss):
                    break
                for _ in range(2):
                    break
                if i == 2:
                    break  # <exit>
    """)
    path = tmp_path / "train.py"
    path.write_text(source)
    lines = source.splitlines()
    at = {t: next(i for i, line in enumerate(lines, 1) if f"# <{t}>" in line)
          for t in ("loop", "exit")}
    assert loop_exit({"file": str(path), "line": at["loop"]})["line"] == at["exit"]


def test_a_helper_shuffling_the_labels_in_place_is_located_at_that_call(tmp_path):
    """``np.random.shuffle(y)`` inside the helper, not the index it computed for X."""
    from model_debugger.provenance import reorder_within

    source = textwrap.dedent("""
        import numpy as np

        def shuffled(X, y):
            idx = np.random.permutation(len(X))
            X = X[idx]
            np.random.shuffle(y)  # <made>
            return X, y

        Xa, ya = shuffled(*load("a"))  # <call>
        Xb, yb = shuffled(*load("b"))
    """)
    path = tmp_path / "train.py"
    path.write_text(source)
    lines = source.splitlines()
    at = {t: next(i for i, line in enumerate(lines, 1) if f"# <{t}>" in line)
          for t in ("made", "call")}
    assert reorder_within({"file": str(path), "line": at["call"]}, last=True)["line"] == \
        at["made"]


def test_a_loss_object_is_located_where_it_was_made(tmp_path):
    from model_debugger.provenance import callee_made

    source = textwrap.dedent('''\
        import torch
        from torch import nn
        criterion = nn.MSELoss()
        criterion = nn.BCEWithLogitsLoss()
        class Trainer:
            def __init__(self):
                self.loss_fn = nn.CrossEntropyLoss()
            def step(self, x, y, fn):
                a = self.loss_fn(x, y)
                b = fn(x, y)
                return a + b
        def train(x, y):
            return criterion(x, y) + nn.functional.mse_loss(x, y)
        model = nn.Linear(2, 1)
        def direct(x, y):
            return nn.functional.mse_loss(model(x), y)
        def given(criterion, x, y):
            return criterion(x, y)
        ''')
    path = tmp_path / "train.py"
    path.write_text(source)
    at = {"file": str(path)}
    assert callee_made({**at, "line": 13})["line"] == 4  # the latest construction before use
    assert callee_made({**at, "line": 9})["line"] == 7  # self.loss_fn, made in __init__
    assert callee_made({**at, "line": 10})["line"] == 10  # a parameter: the call stays
    assert callee_made({**at, "line": 16})["line"] == 16  # not the model in its arguments
    assert callee_made({**at, "line": 18})["line"] == 18  # a parameter shadows the module's


def test_a_schedule_is_located_where_its_decay_was_set(tmp_path):
    from model_debugger.probes.lr_schedule import _decay_origin

    source = textwrap.dedent('''\
        import argparse
        import torch
        p = argparse.ArgumentParser()
        p.add_argument("--lr-decay", type=float, default=0.2)
        args = p.parse_args([])
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=args.lr_decay)
        other = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.02)
        ''')
    path = tmp_path / "train.py"
    path.write_text(source)
    assert _decay_origin({"file": str(path), "line": 7})["line"] == 4  # the argparse default
    assert _decay_origin({"file": str(path), "line": 8})["line"] == 8  # literals: the scheduler


def test_the_loop_around_a_step_is_its_innermost_loop_in_its_own_function(tmp_path):
    from model_debugger.provenance import enclosing_loop

    source = textwrap.dedent('''\
        def train_epoch(model, loader, opt):
            total = 0.0
            for xb, yb in loader:
                loss = model(xb).sum()
                loss.backward()
            return total
        for epoch in range(3):
            train_epoch(None, [], None)
        loss = 1
        ''')
    path = tmp_path / "train.py"
    path.write_text(source)
    at = {"file": str(path)}
    assert enclosing_loop({**at, "line": 5})["line"] == 3  # not the epoch loop calling it
    assert enclosing_loop({**at, "line": 8})["line"] == 7
    assert enclosing_loop({**at, "line": 9}) is None
    assert enclosing_loop({**at, "line": 2}) is None


TRAINER_OBJECT = """
    import numpy as np
    import torch
    from torch import nn


    class Scaler:
        def fit(self, a):
            self.mean = a.mean(axis=0)
            return self

        def transform(self, a):
            return a - self.mean


    class Trainer:
        def __init__(self, model):
            self.model = model
            self.loss_fn = nn.MSELoss()

        def train_epoch(self, X, y):
            for i in range(0, len(X), 32):
                pred = self.model(X[i:i + 32]).squeeze(-1)
                loss = self.loss_fn(pred, y[i:i + 32])  # <use>
                loss.backward()

        def fit(self, X_tr, y_tr, epochs=3):
            for _ in range(epochs):
                self.train_epoch(X_tr, y_tr)


    def main():
        X = np.random.rand(200, 4).astype("float32")
        y = (X.sum(axis=1) * 1e5).astype("float32")  # <made>
        X = Scaler().fit(X).transform(X)
        trainer = Trainer(nn.Linear(4, 1))
        trainer.fit(torch.from_numpy(X), torch.from_numpy(y))
"""


def test_targets_traced_through_a_trainer_objects_methods_to_where_they_were_made(tmp_path):
    """``self.model(x).squeeze(-1)`` is the prediction, so ``y`` holds the targets: a
    parameter of ``train_epoch``, called once as ``self.train_epoch(X_tr, y_tr)``, itself a
    parameter of ``fit``, called as ``trainer.fit(...)`` on a ``Trainer`` (the ``Scaler``'s
    ``fit`` is another class's method), through ``torch.from_numpy``."""
    got, made, use = _origin(tmp_path, TRAINER_OBJECT, "targets")
    assert got == made != use


@pytest.mark.parametrize("again,expected", [
    ("model = Net()", True), ("model = model.to('cpu')", False),
    ("model = torch.compile(model)", False)])
def test_a_model_bound_again_after_its_optimizer(tmp_path, again, expected):
    """A new instance bound to the name after the optimizer was built is a different model;
    moving or wrapping the same one (``.to``, ``torch.compile``) is not."""
    from model_debugger.provenance import rebound_between

    source = textwrap.dedent(f"""
        import torch
        def main():
            model = Net()
            opt = torch.optim.Adam(model.parameters())
            {again}
            for step in range(3):
                loss = model(torch.ones(1, 2)).sum()
                loss.backward()
    """)
    path = tmp_path / "train.py"
    path.write_text(source)
    got = rebound_between({"file": str(path), "line": 5}, {"file": str(path), "line": 9},
                          "model")
    assert (got == {"file": str(path), "line": 6}) if expected else got is None


ROWS_BY_INDEX = """
    import numpy as np
    import torch

    to_t = lambda a, dt: torch.tensor(a, dtype=dt)


    def make_data(n_train):
        X, y = np.random.rand(4000, 8), np.random.randint(0, 2, 4000)
        perm = np.random.permutation(len(X))
        tr, va = perm[:n_train], perm[n_train:]  # <made>
        mu, sd = X[tr].mean(0), X[tr].std(0)
        X = (X - mu) / sd
        return to_t(X[tr], torch.float32), to_t(y[tr], torch.long), X[va], y[va]


    def run_epoch(model, X, y, opt):
        idx = torch.randperm(len(X))
        for i in range(0, len(X), 64):
            b = idx[i:i + 64]
            loss = torch.nn.functional.cross_entropy(model(X[b]), y[b])  # <use>
            loss.backward()


    Xtr, ytr, Xva, yva = make_data(800)
    run_epoch(model, Xtr, ytr, opt)
    """


def test_rows_chosen_by_an_index_array_are_traced_to_the_split_of_the_index(tmp_path):
    """``tr = perm[:n]`` then ``X[tr]``: the rows are the index's, through a standardisation
    of every row (arithmetic keeps them), this file's own tensor-making lambda and a function's
    returned tuple; the batch index sliced inside the loop (``idx[i:i + 64]``) is a batch,
    not the data's rows."""
    from model_debugger.provenance import ROWS, selects_rows

    got, made, use = _origin(tmp_path, ROWS_BY_INDEX, ROWS)
    assert got == made
    assert selects_rows({"file": str(tmp_path / "train.py"), "line": got})


def test_a_batch_sliced_from_a_split_inside_the_loop_keeps_the_split_as_the_rows(tmp_path):
    """``X_train = X[:800]``, then per batch ``idx = perm[i:i + 32]; xb = X_train[idx]``: the
    rows come from the split, not from the batch slice."""
    from model_debugger.provenance import ROWS

    source = """
        import torch
        X, y = torch.randn(1000, 5), torch.randn(1000, 1)
        X_train, y_train = X[:800], y[:800]  # <made>
        for epoch in range(3):
            perm = torch.randperm(800)
            for i in range(0, 800, 32):
                idx = perm[i:i + 32]
                xb, yb = X_train[idx], y_train[idx]
                loss = torch.nn.functional.mse_loss(model(xb), yb)  # <use>
        """
    got, made, _ = _origin(tmp_path, source, ROWS)
    assert got == made


def test_local_wrappers_are_functions_that_return_their_first_argument_wrapped():
    import ast

    from model_debugger.provenance import _local_wrappers

    tree = ast.parse(
        "to_t = lambda a, dt: torch.tensor(a, dtype=dt)\n"
        "def as_t(a):\n    return torch.from_numpy(a).float()\n"
        "def scaled(a):\n    return (a - a.mean()) / a.std()\n"
        "other = lambda a, b: torch.tensor(b)\n"
        "def twice(a):\n    return a\ndef twice(a):\n    return a\n"
        "def prep(a):\n    a = a[:100]\n    return torch.tensor(a)\n"
        "def doc(a):\n    'Tensor of a.'\n    return torch.tensor(a)\n")
    assert _local_wrappers(tree) == {"to_t", "as_t", "doc"}  # prep slices first


def test_a_parameter_passed_by_unpacking_has_no_single_setting(tmp_path):
    """``Net(**cfg)`` may pass ``drop``: its default is not known to be the value used."""
    line_of, origin, _ = _settings(tmp_path, """
        class Net:
            def __init__(self, drop=0.1):
                self.d = Dropout(p=drop)  # <use drop>

        cfg = {"drop": 0.9}
        net = Net(**cfg)
    """)
    assert origin("<use drop>", "p") == line_of("<use drop>")


def test_an_interval_entry_belongs_to_the_scheduler_beside_it(tmp_path):
    """Two schedules handed to Lightning: the warm-up stepped per batch, the StepLR per epoch.
    The StepLR's dict says "epoch": no per-batch entry is its (was: any "step" in the file)."""
    from model_debugger.provenance import dict_setting

    source = textwrap.dedent("""
        warm = LambdaLR(opt, lambda s: min(1.0, s / 100))
        decay = StepLR(opt, step_size=10)
        schedules = [{"scheduler": warm, "interval": "step"},  # <warm>
                     {"scheduler": decay, "interval": "epoch"}]
    """)
    path = tmp_path / "sched.py"
    path.write_text(source)
    lines = source.splitlines()
    at = {m: next(i for i, t in enumerate(lines, 1) if m in t) for m in ("warm =", "decay =",
                                                                          "<warm>")}
    loc = {"file": str(path)}
    assert dict_setting({**loc, "line": at["decay ="]}, "interval", "step", "scheduler") is None
    assert dict_setting({**loc, "line": at["warm ="]}, "interval", "step", "scheduler") == \
        {**loc, "line": at["<warm>"]}


def test_fit_call_at_reads_a_fit_not_a_loss_on_a_slice(tmp_path):
    from model_debugger.provenance import fit_call_at

    path = tmp_path / "t.py"
    path.write_text("model.fit(X[:24], y[:24])\nloss = F.cross_entropy(out[:-1], y[1:])\n")
    assert fit_call_at({"file": str(path), "line": 1})
    assert not fit_call_at({"file": str(path), "line": 2})


@pytest.mark.parametrize("source,inside", [
    ("""
     from torch.utils.data import Dataset
     class Images(Dataset):
         def load(self, i):
             self.cache[i] = i  # <at>
     """, True),                                  # a method of a Dataset subclass
    ("""
     class Rows:
         def __len__(self):
             return 3
         def __getitem__(self, i):
             self.seen.append(i)  # <at>
     """, True),                                  # a class that indexes like a dataset
    ("""
     def collate(batch):
         kept.append(batch)  # <at>
         return batch
     loader = DataLoader(ds, batch_size=4, collate_fn=collate)
     """, True),                                  # handed to the loader
    ("""
     def augment(x, y):
         seen.append(x)  # <at>
         return x, y
     ds = tf.data.Dataset.from_tensor_slices((X, Y)).map(augment)
     """, True),                                  # mapped over a tf.data pipeline
    ("""
     class Trainer:
         def fit(self):
             for xb in loader:
                 self.history.append(xb)  # <at>
     """, False),                                 # the loop's own object
    ("""
     for xb, yb in loader:
         kept.append(xb)  # <at>
     """, False),
])
def test_in_data_pipeline_tells_the_code_that_makes_batches_from_the_loop(tmp_path, source,
                                                                          inside):
    from model_debugger.provenance import in_data_pipeline

    source = textwrap.dedent(source)
    path = tmp_path / "train.py"
    path.write_text(source)
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "# <at>" in text)
    assert in_data_pipeline({"file": str(path), "line": line}) is inside


def test_labels_from_a_dict_batch_are_made_in_the_datasets_getitem(tmp_path):
    from model_debugger.provenance import item_origin

    source = textwrap.dedent("""
        class Pairs(Dataset):
            def __getitem__(self, i):
                s = self.rows[i]
                return {"input_ids": s[:-1],
                        "labels": s[1:]}  # <made>

        for batch in DataLoader(Pairs(), batch_size=8):
            out = model(input_ids=batch["input_ids"], labels=batch["labels"])  # <use>
            other = model(input_ids=batch["input_ids"], labels=batch["targets"])  # <none>
    """)
    path = tmp_path / "train.py"
    path.write_text(source)
    lines = source.splitlines()
    at = {tag: next(i for i, text in enumerate(lines, 1) if f"# <{tag}>" in text)
          for tag in ("made", "use", "none")}
    assert item_origin({"file": str(path), "line": at["use"]}) == \
        {"file": str(path), "line": at["made"]}
    assert item_origin({"file": str(path), "line": at["none"]}) is None


MADE_BY_A_FUNCTION = """
    import numpy as np
    import torch


    def class_weights(y):
        counts = np.bincount(y).astype(float)
        w = counts / counts.sum()  # <made w>
        return torch.tensor(w, dtype=torch.float32)


    def warm_rate(cfg):
        if cfg["warm"]:
            return cfg["lr"] / 10
        return cfg["lr"]


    def decay():
        return 0.01 * 3  # <made decay>


    def momentum_of(cfg):
        m = 1 - cfg["beta"]  # <made momentum>

        def unused():
            return 0

        return torch.tensor(m).float()


    w = class_weights(labels)
    rate = warm_rate(CONFIG)  # <two exits>
    wd = decay()
    beta = momentum_of(CONFIG)
    sgd = torch.optim.SGD(params, lr=0.1, momentum=beta)  # <use momentum>
    loss_fn = torch.nn.CrossEntropyLoss(weight=w)  # <use weight>
    opt = torch.optim.AdamW(params, lr=rate, weight_decay=wd)  # <use lr>
"""


def test_a_setting_made_by_a_function_of_the_file_is_located_where_it_computes_it(tmp_path):
    """``w = class_weights(y)``: the line in ``class_weights`` that made what it returns
    (through ``torch.tensor(w)``), or its one ``return``; a function with two exits: the call."""
    line_of, origin, _ = _settings(tmp_path, MADE_BY_A_FUNCTION)
    assert origin("<use weight>", "weight") == line_of("<made w>")
    assert origin("<use lr>", "weight_decay") == line_of("<made decay>")
    assert origin("<use lr>", "lr") == line_of("<two exits>")
    # through ``torch.tensor(m).float()``; a nested function's return is not the function's
    assert origin("<use momentum>", "momentum") == line_of("<made momentum>")


@pytest.mark.parametrize("batches,found", [("(X_s, y_tr)", True), ("(X_s, y_s)", False)])
def test_a_scaled_copy_never_read_locates_the_batches_built_from_the_raw_array(tmp_path,
                                                                              batches, found):
    """The copy made under a chain of methods (``.astype``), the raw targets put into a
    ``tf.data`` pipeline, the loss line reading only the batches: the pipeline's line, where
    the scaled copy belonged. With the copy in the pipeline nothing is moved."""
    from model_debugger.provenance import scaled_copy_unused

    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(f"""\
        X_s = x_scaler.fit_transform(X).astype("float32")
        y_tr = y[:4000].astype("float32")
        y_s = y_scaler.fit_transform(y_tr).astype("float32")
        print(y.mean())
        train_ds = tf.data.Dataset.from_tensor_slices({batches}).batch(64)
        for xb, yb in train_ds:
            loss = mse(yb, model(xb))
        """))
    got = scaled_copy_unused({"file": str(path), "line": 2, "used_at": 7})
    assert got == ({"file": str(path), "line": 5, "used_at": 7} if found else None)


@pytest.mark.parametrize("pairing,found", [
    ("tf.data.Dataset.zip((features.shuffle(len(X), seed=3), labels))", True),
    ("TensorDataset(torch.tensor(X)[torch.randperm(len(X))], torch.tensor(y))", True),
    ("tf.data.Dataset.zip((features, labels)).shuffle(len(X), seed=3)", False),
    ("TensorDataset(torch.tensor(X)[order], torch.tensor(y)[order])", False)])
def test_a_pairing_that_reorders_one_half_only_is_where_labels_lost_their_rows(tmp_path,
                                                                               pairing, found):
    """The inputs shuffled inside the statement that pairs them with the labels: that line,
    not where either half was made; both halves reordered alike (or the pairs shuffled
    together) is no fault."""
    from model_debugger.provenance import one_side_moved

    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(f"""\
        X, y = make_classification(600)
        features = tf.data.Dataset.from_tensor_slices(X)
        labels = tf.data.Dataset.from_tensor_slices(y)
        order = np.random.permutation(len(X))
        train = {pairing}
        model.fit(train, epochs=3)
        """))
    got = one_side_moved({"file": str(path), "line": 6})
    assert got == ({"file": str(path), "line": 5} if found else None)


def test_a_column_selection_is_no_reorder_and_an_unrelated_copy_moves_nothing(tmp_path):
    """``df[features]`` paired with labels rolled earlier: the roll is the fault, not the
    pairing. A validation copy scaled and never read does not move a training finding to the
    validation dataset's line (it does not reach the use)."""
    from model_debugger.provenance import one_side_moved, scaled_copy_unused

    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent("""\
        df = load()
        features = ["a", "b"]
        X, y = df[features].values, df["t"].values
        X_val = X[:100]
        X_val_s = scaler.transform(X_val)
        y = np.roll(y, 1)
        ds = TensorDataset(torch.tensor(df[features].values), torch.tensor(y))
        val_ds = TensorDataset(torch.tensor(X_val), torch.tensor(y[:100]))
        loader = DataLoader(ds, batch_size=32)
        for xb, yb in loader:
            loss = crit(model(xb), yb)
        """))
    assert one_side_moved({"file": str(path), "line": 11}) is None
    assert scaled_copy_unused({"file": str(path), "line": 3, "used_at": 11}) is None
