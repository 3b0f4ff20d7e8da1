"""``padding_waste`` on real captures: every batch padded to the model's maximum length.

Short token sequences (6-24 ids) read by a small transformer encoder that masks its padding.
A ``collate_fn`` padding every batch to 128 positions makes each step compute over ~85%
padding: the finding must be confirmed (a copy's steps on the batches cut to their longest
rows are clearly faster, with the same outputs), re-classify the healthy-looking run as
``performance_issue``, and be located at the collate line that picks the width. The same model
fed batches padded to their own longest row (``pad_sequence``), and a model that reads its
padding (the cut would change its outputs), are left alone; so is an item-wise padding in a
``Dataset`` whose ``__getitem__`` names the width, located there.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

import model_debugger
from model_debugger import probing
from model_debugger.probes import PROBES, padding_waste
from model_debugger.probing import build_context
from model_debugger.records import Run

HERE = os.path.abspath(__file__)
VOCAB, MAX_LEN = 200, 128


def line_of(tag: str) -> int:
    with open(HERE, encoding="utf-8") as fh:
        return next(i for i, text in enumerate(fh, 1) if text.rstrip().endswith(f"# <{tag}>"))


def reviews(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    docs, labels = [], []
    for _ in range(n):
        doc = rng.integers(10, VOCAB, int(rng.integers(6, 24)))
        label = int(rng.integers(0, 2))
        doc[0] = 1 + label
        docs.append(torch.as_tensor(doc))
        labels.append(label)
    return docs, labels


class Reviews(Dataset):
    def __init__(self, docs, labels, fixed: bool = False):
        self.docs, self.labels, self.fixed = docs, labels, fixed

    def __len__(self):
        return len(self.docs)

    def __getitem__(self, i):
        doc = self.docs[i]
        if self.fixed:
            doc = torch.cat([doc, doc.new_zeros(MAX_LEN - len(doc))])  # <item-width>
        return doc, self.labels[i]


def to_max(batch):
    docs, labels = zip(*batch)
    ids = torch.zeros(len(docs), MAX_LEN, dtype=torch.long)  # <collate-width>
    for i, d in enumerate(docs):
        ids[i, :len(d)] = d
    return ids, torch.tensor(labels)


def to_longest(batch):
    docs, labels = zip(*batch)
    return pad_sequence(list(docs), batch_first=True), torch.tensor(labels)


class Encoder(nn.Module):
    def __init__(self, masked: bool = True):
        super().__init__()
        self.masked = masked
        self.tok = nn.Embedding(VOCAB, 32, padding_idx=0)
        self.pos = nn.Embedding(MAX_LEN, 32)
        layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0,
                                           batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(32, 2)

    def forward(self, ids):
        pad = ids == 0
        h = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        if not self.masked:  # reads the padding: the mean over every position
            return self.head(self.enc(h).mean(1))
        h = self.enc(h, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1))


def context(tmp_path, collate, masked: bool = True, fixed: bool = False):
    docs, labels = reviews(640)
    loader = DataLoader(Reviews(docs, labels, fixed), batch_size=32, shuffle=True,
                        collate_fn=collate)
    path = str(tmp_path / "record.jsonl")
    rec = model_debugger.capture(path)
    with rec:
        torch.manual_seed(0)
        model = Encoder(masked)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        for ids, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(ids), y).backward()
            opt.step()
    run = Run.load(path)
    return build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 120.0)


@pytest.fixture(autouse=True)
def short_runs(monkeypatch):
    """The test's runs take under the 2 s a finding needs: the timing itself is what counts."""
    monkeypatch.setattr(padding_waste, "MIN_RUN_SECONDS", 0.0)


def test_batches_padded_to_the_maximum_are_found_at_the_collate_width(tmp_path):
    from model_debugger.probes import run_probes

    ctx = context(tmp_path, to_max)
    [f] = run_probes(ctx, ["padding_waste"]).findings
    assert f.confirmed and f.root_cause == "data", f
    assert f.evidence["width"] == MAX_LEN and f.evidence["fill"] <= 24 / MAX_LEN
    assert f.evidence["gain"] >= 1.5 and f.evidence["decisive"]
    assert f.location == {"file": HERE, "line": line_of("collate-width")}, f.location
    assert PROBES["padding_waste"].reveals == "performance_issue"  # on a healthy-looking run


def test_items_padded_in_the_dataset_are_located_in_getitem(tmp_path):
    ctx = context(tmp_path, None, fixed=True)
    [f] = PROBES["padding_waste"]().run(ctx)
    assert f.confirmed and f.location == {"file": HERE, "line": line_of("item-width")}


@pytest.mark.parametrize("collate,masked", [(to_longest, True), (to_max, False)],
                         ids=["padded_to_longest", "reads_its_padding"])
def test_dynamic_padding_and_a_model_reading_its_padding_are_left_alone(tmp_path, collate,
                                                                        masked):
    ctx = context(tmp_path, collate, masked=masked)
    assert PROBES["padding_waste"]().run(ctx) == []
