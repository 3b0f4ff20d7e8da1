"""``data_mutated`` on real captures: a dataset whose item access changes what it stores.

An in-place standardisation of a view of the stored rows (torch ``sub_``/``div_``, numpy
``x -= mean``) is found and located at the in-place line; a dataset filling a cache by item
assignment, and one that transforms out of place, are not. The user's dataset is left as it
was (the probe reads a copy).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import model_debugger
from model_debugger import probing
from model_debugger.probes import run_probes
from model_debugger.probing import build_context
from model_debugger.records import Run

HERE = os.path.abspath(__file__)


def line_of(tag: str) -> int:
    with open(HERE, encoding="utf-8") as fh:
        return next(i for i, text in enumerate(fh, 1) if text.rstrip().endswith(f"# <{tag}>"))


class Readings(Dataset):
    def __init__(self, style: str):
        g = np.random.default_rng(0)
        self.style = style
        self.values = g.normal(300, 40, (256, 6)).astype(np.float32)
        self.rows = torch.from_numpy(self.values.copy())
        self.labels = torch.as_tensor((self.values[:, 0] > 300).astype(np.int64))
        self.cache = torch.zeros(256, 6)
        self.mean, self.std = 300.0, 40.0

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        if self.style == "torch_in_place":
            x = self.rows[i]
            x.sub_(self.mean).div_(self.std)  # <torch-in-place>
        elif self.style == "numpy_in_place":
            x = self.values[i]
            x -= self.mean  # <numpy-in-place>
            x = torch.from_numpy(x / self.std)
        elif self.style == "cached":
            self.cache[i] = (self.rows[i] - self.mean) / self.std
            x = self.cache[i]
        elif self.style == "copied":
            self.cache[i].copy_((self.rows[i] - self.mean) / self.std)
            x = self.cache[i].clone()
        elif self.style == "numpy_view":
            x = torch.from_numpy(self.values[i])
            x.sub_(self.mean)  # <numpy-view>
            x = x / self.std
        else:
            x = (self.rows[i] - self.mean) / self.std
        return x, self.labels[i]


def train(style: str) -> Readings:
    torch.manual_seed(0)
    data = Readings(style)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for _epoch in range(3):
        for xb, yb in DataLoader(data, batch_size=32, shuffle=True):
            opt.zero_grad()
            F.cross_entropy(net(xb), yb).backward()
            opt.step()
    return data


@pytest.mark.parametrize("style,tag", [("torch_in_place", "torch-in-place"),
                                       ("numpy_in_place", "numpy-in-place"),
                                       ("numpy_view", "numpy-view"),
                                       ("cached", None), ("copied", None),
                                       ("out_of_place", None)])
def test_a_dataset_that_changes_its_stored_rows_is_found_at_the_in_place_line(tmp_path, style,
                                                                             tag):
    path = str(tmp_path / "record.jsonl")
    rec = model_debugger.capture(path)
    with rec:
        data = train(style)
    run = Run.load(path)
    ctx = build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 60.0)
    rows, values = data.rows.clone(), data.values.copy()
    findings = run_probes(ctx, ["data_mutated"]).findings
    assert torch.equal(data.rows, rows) and np.array_equal(data.values, values)  # (a copy)
    assert data.values.flags.writeable
    if tag is None:
        assert findings == ()
        return
    [f] = findings
    assert (f.root_cause, f.confirmed, f.evidence["decisive"]) == ("data", True, True), f
    assert f.location["line"] == line_of(tag), f.location


def test_a_loader_over_a_plain_tensor_is_not_read(tmp_path):
    """``DataLoader(X)`` (an autoencoder's inputs): the dataset is a tensor, whose truth value
    is ambiguous; the probe does not apply and nothing fails."""
    path = str(tmp_path / "record.jsonl")
    rec = model_debugger.capture(path)
    with rec:
        torch.manual_seed(0)
        X = torch.randn(128, 6)
        net = nn.Sequential(nn.Linear(6, 3), nn.Linear(3, 6))
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        for xb in DataLoader(X, batch_size=32, shuffle=True):
            opt.zero_grad()
            F.mse_loss(net(xb), xb).backward()
            opt.step()
    run = Run.load(path)
    ctx = build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 60.0)
    report = run_probes(ctx, ["data_mutated"])
    assert report.findings == () and "data_mutated" not in report.probe_seconds
