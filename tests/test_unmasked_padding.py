"""``unmasked_padding`` on real captures: end-padded sequences read by a recurrent layer.

Token sequences of different lengths, padded at the end, whose class is told by a few marker
tokens anywhere in the sequence. A GRU that reads its last step over the padding (no packing)
learns nothing; the same GRU given ``pack_padded_sequence`` learns, and so does one fed the rows
padded at the front. The finding must be confirmed on the first (the copy trained on front-padded
rows learns), located at the layer's call (where packing belongs); left unconfirmed on the packed twin (where the
padding stands does not matter to it, or harms it); and the probe must not apply to front-padded
rows. The same for Keras: an ``Embedding`` + ``LSTM`` on end-padded rows is confirmed at the
embedding's line, and the twin with ``mask_zero=True`` is left alone.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn

import model_debugger
from model_debugger import probing
from model_debugger.probes import PROBES, run_probes
from model_debugger.probes.unmasked_padding import front_padded, padding
from model_debugger.probing import build_context
from model_debugger.records import Run

HERE = os.path.abspath(__file__)
VOCAB, LENGTH, CLASSES = 24, 40, 3


def line_of(tag: str) -> int:
    with open(HERE, encoding="utf-8") as fh:
        return next(i for i, text in enumerate(fh, 1) if text.rstrip().endswith(f"# <{tag}>"))


def sequences(n: int, front: bool = False, seed: int = 0):
    """``(tokens, labels)``: ids 4.. with three copies of the class's marker (1..3) in each row."""
    rng = np.random.default_rng(seed)
    rows, labels = np.zeros((n, LENGTH), dtype=np.int64), rng.integers(0, CLASSES, n)
    for i in range(n):
        k = int(rng.integers(5, 16))
        toks = rng.integers(4, VOCAB, size=k)
        toks[rng.choice(k, size=3, replace=False)] = labels[i] + 1
        if front:
            rows[i, LENGTH - k:] = toks
        else:
            rows[i, :k] = toks
    return rows, labels


class Reader(nn.Module):
    def __init__(self, packed: bool):
        super().__init__()
        self.packed = packed
        self.emb = nn.Embedding(VOCAB, 16, padding_idx=0)
        self.rnn = nn.GRU(16, 32, batch_first=True)
        self.out = nn.Linear(32, CLASSES)

    def forward(self, x):
        e = self.emb(x)
        if self.packed:
            lengths = (x != 0).sum(1).cpu()
            e = nn.utils.rnn.pack_padded_sequence(e, lengths, batch_first=True,
                                                  enforce_sorted=False)
        out, h = self.rnn(e)  # <gru>
        return self.out(h[-1] if self.packed else out[:, -1])


def torch_context(tmp_path, packed: bool, front: bool):
    x, y = (torch.as_tensor(a) for a in sequences(1024, front))
    path = str(tmp_path / "record.jsonl")
    rec = model_debugger.capture(path)
    with rec:
        torch.manual_seed(0)
        model = Reader(packed)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _epoch in range(2):
            for i in range(0, 1024, 32):
                opt.zero_grad()
                nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32]).backward()
                opt.step()
    run = Run.load(path)
    return build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 120.0)


@pytest.mark.parametrize("packed", [False, True], ids=["last_step", "packed"])
def test_a_gru_reading_the_padding_is_found_and_a_packed_one_is_not(tmp_path, packed):
    ctx = torch_context(tmp_path, packed, front=False)
    probe = PROBES["unmasked_padding"]()
    # packed: the layer is given each row's length, so where the padding stands is moot and
    # the probe does not apply; its experiment, run anyway, must not confirm either
    assert probe.applies(ctx) is not packed
    [f] = probe.run(ctx) if packed else run_probes(ctx, ["unmasked_padding"]).findings
    assert f.root_cause == "architecture", f
    post, pre = (float(f.evidence[k]) for k in ("heldout_as_padded", "heldout_front_padded"))
    if packed:
        assert not f.confirmed, f.explanation
        return
    assert f.confirmed, f.explanation
    assert pre < 0.5 * post
    assert f.location["line"] == line_of("gru"), f.location


def test_rows_padded_at_the_front_are_left_alone(tmp_path):
    ctx = torch_context(tmp_path, packed=False, front=True)
    assert not PROBES["unmasked_padding"]().applies(ctx)


@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "mask_zero"])
def test_a_keras_lstm_on_end_padded_rows(masked):
    keras = pytest.importorskip("keras")
    x, y = sequences(768)
    with model_debugger.capture() as rec:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((LENGTH,), dtype="int32"),
            keras.layers.Embedding(VOCAB, 16, mask_zero=masked),  # <embedding>
            keras.layers.LSTM(24),
            keras.layers.Dense(CLASSES, activation="softmax"),
        ])
        model.compile(optimizer=keras.optimizers.Adam(3e-3),
                      loss="sparse_categorical_crossentropy")
        model.fit(x.astype("int32"), y, batch_size=32, epochs=1, verbose=0)
    ctx = build_context(Run(rec.events), rec.keeper, {HERE: open(HERE, encoding="utf-8").read()},
                        120.0)
    probe = PROBES["unmasked_padding"]()
    if masked:
        assert not probe.applies(ctx)
        return
    assert probe.applies(ctx)
    [f] = run_probes(ctx, ["unmasked_padding"]).findings
    assert f.confirmed, f.explanation
    assert f.location["line"] == line_of("embedding"), f.location


def test_what_counts_as_end_padding():
    post, _ = sequences(64)
    pre, _ = sequences(64, front=True)
    assert padding(post) is not None and padding(torch.as_tensor(post)) is not None
    assert padding(pre) is None  # already at the front
    full = np.random.default_rng(0).integers(1, VOCAB, (64, LENGTH))
    assert padding(full) is None  # no padding at all
    same = post.copy()
    same[:, 10:] = 0
    same[:, :10] = np.maximum(same[:, :10], 1)
    assert padding(same) is None  # one length for every row: nothing varies with it
    floats = np.random.default_rng(1).normal(size=(64, LENGTH, 3)).astype("float32")
    floats[np.arange(LENGTH)[None, :] >= (post != 0).sum(1)[:, None]] = 0.0
    assert padding(floats) is not None  # all-zero steps of float features
    assert padding(floats[:, :, 0]) is None  # (2-D floats are rows of features, not steps)


@pytest.mark.parametrize("kind", ["numpy", "torch", "float_steps"])
def test_front_padding_moves_each_row_s_steps_to_its_end(kind):
    post, labels = sequences(16)
    front, _ = sequences(16, front=True)
    if kind == "float_steps":
        post = np.repeat(post[:, :, None], 2, axis=2).astype("float32")
        front = np.repeat(front[:, :, None], 2, axis=2).astype("float32")
    x = torch.as_tensor(post) if kind == "torch" else post
    (moved, *_), target = front_padded((x,), labels, 8)
    assert target is labels
    np.testing.assert_array_equal(np.asarray(moved), front)


def test_a_target_per_step_or_ids_no_embedding_reads_are_left_alone(tmp_path):
    """A tagger reads each output where it stands (end padding does not reach it), and integer
    steps into a model without an embedding may hold real zeros: neither is tested."""
    ctx = torch_context(tmp_path, packed=False, front=False)
    probe = PROBES["unmasked_padding"]()
    assert probe.applies(ctx)
    targets = ctx.trainer.targets
    ctx.trainer.targets = torch.zeros(len(targets), LENGTH, dtype=torch.long)  # one per step
    assert not probe.applies(ctx)
    ctx.trainer.targets = targets
    model = ctx.model
    ctx.model = nn.Sequential(nn.GRU(LENGTH, 8))  # recurrent, but nothing looks ids up
    assert not probe.applies(ctx)
    ctx.model = model
    assert probe.applies(ctx)
