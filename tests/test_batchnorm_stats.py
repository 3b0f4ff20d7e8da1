"""``batchnorm_stats`` on real captures: batch norm trained on batches of one image.

A small CNN with ``BatchNorm2d`` learns bars under a gain and an offset of their own with
batches of one image (each normalised by its own statistics, which removes them) and is scored
in eval mode (running averages, which do not): validation falls far below what the same
weights score with batch statistics. The twin trains with batches of 32. The finding must be
decisive on the first, located where the batch size is set, and absent on the twin.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import model_debugger
from model_debugger import probing
from model_debugger.probes import run_probes
from model_debugger.probing import build_context
from model_debugger.records import Run

HERE = os.path.abspath(__file__)
SETTINGS = {"small": 1, "fine": 32}


def line_of(tag: str) -> int:
    with open(HERE, encoding="utf-8") as fh:
        return next(i for i, text in enumerate(fh, 1) if text.rstrip().endswith(f"# <{tag}>"))


def bars(n: int, seed: int):
    """8x8 images of one of four bars (the class), each under its own gain and offset."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    images = rng.normal(0, 0.3, (n, 1, 8, 8))
    for i, k in enumerate(y):
        if k < 2:
            images[i, 0, :, 2 + 3 * k] += 2.0
        else:
            images[i, 0, 2 + 3 * (k - 2), :] += 2.0
    images = images * rng.uniform(0.2, 5.0, (n, 1, 1, 1)) + rng.uniform(-4, 4, (n, 1, 1, 1))
    return torch.tensor(images, dtype=torch.float32), torch.tensor(y)


def train(batch_size: int):
    torch.manual_seed(0)
    X, y = bars(900, 0)
    loader = DataLoader(TensorDataset(X[:600], y[:600]), batch_size=batch_size,  # <loader>
                        shuffle=True)
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Flatten(), nn.Linear(8 * 64, 4))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _epoch in range(2 if batch_size < 8 else 30):
        net.train()
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(net(xb), yb).backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            acc = (net(X[600:]).argmax(1) == y[600:]).float().mean().item()
        print(f"val acc {acc:.3f}")


@pytest.mark.parametrize("case", ["small", "fine"])
def test_batch_norm_on_batches_of_one_row_is_found(tmp_path, case):
    path = str(tmp_path / "record.jsonl")
    rec = model_debugger.capture(path)
    with rec:
        train(SETTINGS[case])
    run = Run.load(path)
    ctx = build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 60.0)
    findings = run_probes(ctx, ["batchnorm_stats"]).findings
    if case == "fine":
        assert findings == ()
        return
    [f] = findings
    assert (f.root_cause, f.confirmed) == ("hyperparameter", True)
    ev = f.evidence
    assert ev["batch_size"] == 1
    assert ev["val_accuracy_batch_statistics"] - ev["val_accuracy_eval_mode"] >= 0.05
    assert ev["val_loss_batch_statistics"] < 0.75 * ev["val_loss_eval_mode"]
    assert np.isfinite(ev["val_loss_eval_mode"])
    assert f.location["line"] == line_of("loader"), f.location


def test_validation_shifted_from_training_is_not_blamed_on_batch_norm(tmp_path):
    """Batches of 8 rows, validation inputs not standardised like training's (``3x + 2``):
    batch statistics renormalise the shift away on validation, but the training rows score as
    well in eval mode (the control), so batch norm is not what differs."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(600, 10, generator=g)
    y = (x[:, :3].sum(1) > 0).long()
    rec = model_debugger.capture(str(tmp_path / "record.jsonl"))
    with rec:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 2))
        opt = torch.optim.Adam(net.parameters(), lr=3e-3)
        loader = DataLoader(TensorDataset(x[:400], y[:400]), batch_size=8, shuffle=True)
        for _epoch in range(4):
            net.train()
            for xb, yb in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(net(xb), yb).backward()
                opt.step()
            net.eval()
            with torch.no_grad():
                nn.functional.cross_entropy(net(x[400:] * 3 + 2), y[400:])
    run = Run.load(str(tmp_path / "record.jsonl"))
    ctx = build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 60.0)
    assert ctx.trainer.val_targets is not None
    assert run_probes(ctx, ["batchnorm_stats"]).findings == ()
