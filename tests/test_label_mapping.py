"""``label_mapping`` on real captures: validation labels numbered by an encoder fitted apart.

Each program names its classes by strings and encodes each split with its own mapping, classes
numbered by frequency (the training split and the validation split differ in which class is
most common), as a ``StringLookup`` adapted on each split does; the twin reuses the training
mapping. The finding must be decisive on the first and absent on the second, located where the
validation labels were encoded.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import model_debugger
from model_debugger import probing
from model_debugger.probes import run_probes
from model_debugger.probing import build_context
from model_debugger.records import Run

HERE = os.path.abspath(__file__)
NAMES = np.array(["ash", "birch", "cedar", "elm"])


def line_of(tag: str) -> int:
    with open(HERE, encoding="utf-8") as fh:
        return next(i for i, text in enumerate(fh, 1) if text.rstrip().endswith(f"# <{tag}>"))


def by_frequency(names: np.ndarray) -> dict:
    """Class ids by frequency in ``names``, the most common first (as ``StringLookup`` does)."""
    kinds, counts = np.unique(names, return_counts=True)
    return {kinds[i]: rank for rank, i in enumerate(np.argsort(-counts, kind="stable"))}


def species(seed: int):
    """Four separable classes; training holds mostly ash, validation mostly elm."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 4, (4, 6))
    train_ids = rng.choice(4, 900, p=[0.4, 0.3, 0.2, 0.1])
    val_ids = rng.choice(4, 300, p=[0.1, 0.2, 0.3, 0.4])
    X = (centers[train_ids] + rng.normal(size=(900, 6))).astype("float32")
    Xv = (centers[val_ids] + rng.normal(size=(300, 6))).astype("float32")
    return X, NAMES[train_ids], Xv, NAMES[val_ids]


def encode_apart(names: np.ndarray, _training: dict) -> np.ndarray:
    return np.array([by_frequency(names)[n] for n in names])


def encode_shared(names: np.ndarray, training: dict) -> np.ndarray:
    return np.array([training[n] for n in names])


def train_torch(apart: bool):
    torch.manual_seed(0)
    X, names, Xv, val_names = species(1)
    mapping = by_frequency(names)
    y = encode_shared(names, mapping)
    encode = encode_apart if apart else encode_shared
    yv = encode(val_names, mapping)  # <torch-val-labels>
    X, y = torch.as_tensor(X), torch.as_tensor(y)
    Xv, yv = torch.as_tensor(Xv), torch.as_tensor(yv)
    net = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _epoch in range(6):
        for i in range(0, 900, 32):
            opt.zero_grad()
            F.cross_entropy(net(X[i:i + 32]), y[i:i + 32]).backward()
            opt.step()
        with torch.no_grad():
            val_loss = F.cross_entropy(net(Xv), yv)
        print(f"val_loss {val_loss.item():.3f}")


@pytest.mark.parametrize("apart", [True, False])
def test_torch_validation_labels_encoded_apart_are_found(tmp_path, apart):
    path = str(tmp_path / "record.jsonl")
    rec = model_debugger.capture(path)
    with rec:
        train_torch(apart)
    run = Run.load(path)
    ctx = build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 60.0)
    findings = run_probes(ctx, ["label_mapping"]).findings
    if not apart:
        assert findings == ()
        return
    [f] = findings
    assert (f.check, f.root_cause, f.confirmed, f.evidence["decisive"]) == \
        ("label_mapping", "data", True, True)
    assert f.evidence["val_accuracy"] < 0.5 < 0.9 < f.evidence["val_accuracy_relabelled"]
    assert f.location["line"] == line_of("torch-val-labels"), f.location


def adapted(keras, names: np.ndarray):
    lookup = keras.layers.StringLookup(num_oov_indices=0)
    lookup.adapt(names)
    return lookup


def test_keras_validation_labels_from_a_lookup_adapted_again_are_found():
    pytest.importorskip("tensorflow")
    import keras

    X, names, Xv, val_names = species(2)
    contexts = []
    for apart in (True, False):
        with model_debugger.capture() as rec:
            keras.utils.set_random_seed(0)
            train_lookup = adapted(keras, names)
            y = np.asarray(train_lookup(names))
            val_lookup = adapted(keras, val_names) if apart else train_lookup
            yv = np.asarray(val_lookup(val_names))  # <keras-val-labels>
            model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(32, activation="relu"),
                                      keras.layers.Dense(4, activation="softmax")])
            model.compile(optimizer=keras.optimizers.Adam(1e-2),
                          loss="sparse_categorical_crossentropy")
            model.fit(X, y, validation_data=(Xv, yv), batch_size=32, epochs=5, verbose=0)
        contexts.append(build_context(Run(rec.events), rec.keeper,
                                      {HERE: open(HERE, encoding="utf-8").read()}, budget=60.0))
    [f] = run_probes(contexts[0], ["label_mapping"]).findings
    assert (f.root_cause, f.confirmed) == ("data", True), f
    assert f.location["line"] == line_of("keras-val-labels"), f.location
    assert run_probes(contexts[1], ["label_mapping"]).findings == ()


# -- validation scored by hand: no loss names the labels, the comparison does -----------------
def _acc_argmax(net, xv, yv):
    return (net(xv).argmax(1) == yv).float().mean()


def _acc_max_indices(net, xv, yv):
    return net(xv).max(1)[1].eq(yv).sum() / len(yv)


def _acc_softmax_labels_first(net, xv, yv):
    return (yv == torch.argmax(F.softmax(net(xv), dim=-1), dim=-1)).double().mean()


def _acc_batched(net, xv, yv):
    correct = 0
    for xb, yb in torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xv, yv),
                                              batch_size=64):
        _, pred = torch.max(net(xb), dim=1)
        correct += (pred == yb).sum().item()  # <batch-compare>
    return correct / len(yv)


def train_scored_by_hand(apart: bool, score):
    torch.manual_seed(0)
    X, names, Xv, val_names = species(1)
    mapping = by_frequency(names)
    y = torch.as_tensor(encode_shared(names, mapping))
    encode = encode_apart if apart else encode_shared
    yv = torch.as_tensor(encode(val_names, mapping))  # <hand-val-labels>
    X, Xv = torch.as_tensor(X), torch.as_tensor(Xv)
    net = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _epoch in range(6):
        net.train()
        for i in range(0, 900, 32):
            out = net(X[i:i + 32])
            opt.zero_grad()
            F.cross_entropy(out, y[i:i + 32]).backward()
            opt.step()
            (out.argmax(1) == y[i:i + 32]).float().mean()  # a training score: not validation
        net.eval()
        with torch.no_grad():
            print(f"val_acc {float(score(net, Xv, yv)):.3f}")


@pytest.mark.parametrize("score", [_acc_argmax, _acc_max_indices, _acc_softmax_labels_first,
                                   _acc_batched])
def test_validation_scored_by_hand_keeps_its_labels_and_finds_a_renumbering(tmp_path, score):
    """The comparison of the predicted classes with the labels names the labels; the twin whose
    labels share the training mapping gets no finding."""
    for apart in (True, False):
        path = str(tmp_path / f"record{apart}.jsonl")
        rec = model_debugger.capture(path)
        with rec:
            train_scored_by_hand(apart, score)
        assert torch.overrides._get_current_function_mode() is None  # the watch is gone
        kept = rec.keeper.val_batches
        assert kept and rec.keeper.val_source == "compare"
        # the same validation tensor is kept once; batches made anew by an evaluation loader
        # are kept again each time (the epochs of a loop without a training loader are not
        # seen), within the keeper's bounds
        assert sum(len(t) for _, t in kept) <= (1800 if score is _acc_batched else 300)
        assert all(x[0].shape == (len(t), 6) for x, t in kept)
        run = Run.load(path)
        ctx = build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 60.0)
        findings = run_probes(ctx, ["label_mapping"]).findings
        if not apart:
            assert findings == ()
            continue
        [f] = findings
        assert (f.root_cause, f.confirmed) == ("data", True)
        assert f.evidence["val_accuracy"] < 0.5 < 0.9 < f.evidence["val_accuracy_relabelled"]
        # where the labels were assigned; a batch a loader collated anew is no tensor of the
        # caller's, and its name is a loop's: the comparison
        tag = "batch-compare" if score is _acc_batched else "hand-val-labels"
        assert f.location["line"] == line_of(tag), f.location


def test_a_validation_loss_outranks_the_comparison(tmp_path):
    """A loop that computes a validation loss and an accuracy keeps the loss's batches only."""
    rec = model_debugger.capture(str(tmp_path / "record.jsonl"))
    with rec:
        torch.manual_seed(0)
        X, names, Xv, val_names = species(1)
        mapping = by_frequency(names)
        y = torch.as_tensor(encode_shared(names, mapping))
        yv = torch.as_tensor(encode_shared(val_names, mapping))
        X, Xv = torch.as_tensor(X), torch.as_tensor(Xv)
        net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _epoch in range(2):
            for i in range(0, 900, 100):
                opt.zero_grad()
                F.cross_entropy(net(X[i:i + 100]), y[i:i + 100]).backward()
                opt.step()
            with torch.no_grad():
                for j in range(0, 300, 100):
                    out = net(Xv[j:j + 100])
                    acc = (out.argmax(1) == yv[j:j + 100]).float().mean()  # first: kept, then
                    F.cross_entropy(out, yv[j:j + 100])  # replaced by the loss's batches
                    del acc
    kept = rec.keeper.val_batches
    assert rec.keeper.val_source == "loss"
    assert [len(t) for _, t in kept] == [100, 100, 100]
