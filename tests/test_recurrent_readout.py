"""``recurrent_readout`` on real captures: a classifier that reads its GRU's output at step 0.

Token sequences whose class is told by how often its marker appears anywhere in the row. A
GRU classifier reading ``out[:, 0]`` (the state after one token) learns nothing; reading the
last step, the mean over the steps or ``h_n`` it learns. The finding must be confirmed on the
first (a copy whose GRU hands every step the last step's output learns), located where the
output is indexed, also for a time-major GRU (``out[0]``); the probe must not apply to the
others.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import model_debugger
from model_debugger import probing
from model_debugger.probes import PROBES, run_probes
from model_debugger.probing import build_context
from model_debugger.records import Run

HERE = os.path.abspath(__file__)
VOCAB, LENGTH, CLASSES = 16, 20, 3


def line_of(tag: str) -> int:
    with open(HERE, encoding="utf-8") as fh:
        return next(i for i, text in enumerate(fh, 1) if text.rstrip().endswith(f"# <{tag}>"))


def rows(n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, CLASSES, (n,), generator=gen)
    probs = torch.ones(n, VOCAB)
    probs[torch.arange(n), y + 1] = 4.0
    return torch.multinomial(probs, LENGTH, replacement=True, generator=gen), y


class Reader(nn.Module):
    def __init__(self, read: str):
        super().__init__()
        self.read = read
        self.emb = nn.Embedding(VOCAB, 16)
        self.gru = nn.GRU(16, 32, batch_first=read != "time_major_first")
        self.fc = nn.Linear(32, CLASSES)

    def forward(self, x):
        if self.read == "time_major_first":
            out, _ = self.gru(self.emb(x).transpose(0, 1))
            return self.fc(out[0])  # <time-major>
        out, h = self.gru(self.emb(x))
        if self.read == "first":
            return self.fc(out[:, 0, :])  # <first>
        if self.read == "last":
            return self.fc(out[:, -1])
        if self.read == "mean":
            return self.fc(out.mean(1))
        return self.fc(h[-1])


def context(tmp_path, read: str):
    x, y = rows(1024)
    path = str(tmp_path / "record.jsonl")
    rec = model_debugger.capture(path)
    with rec:
        torch.manual_seed(0)
        model = Reader(read)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _epoch in range(2):
            for i in range(0, 1024, 32):
                opt.zero_grad()
                nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32]).backward()
                opt.step()
    run = Run.load(path)
    return build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 120.0)


@pytest.mark.parametrize("read,tag", [("first", "first"), ("time_major_first", "time-major")])
def test_a_readout_of_the_first_step_is_confirmed_where_it_indexes(tmp_path, read, tag):
    ctx = context(tmp_path, read)
    [f] = run_probes(ctx, ["recurrent_readout"]).findings
    assert f.confirmed and f.root_cause == "architecture", f.explanation
    assert f.evidence["step_read"] == 0 and f.evidence["steps"] == LENGTH
    assert float(f.evidence["heldout_last_step"]) < 0.8 * float(f.evidence["heldout_as_built"])
    assert f.location["line"] == line_of(tag), f.location


@pytest.mark.parametrize("read", ["last", "mean", "h_n"])
def test_a_readout_of_the_whole_sequence_is_left_alone(tmp_path, read):
    ctx = context(tmp_path, read)
    assert not PROBES["recurrent_readout"]().applies(ctx)
