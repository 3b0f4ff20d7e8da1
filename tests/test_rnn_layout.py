"""``rnn_layout``: a recurrent layer fed ``(batch, time, features)`` without ``batch_first``."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import model_debugger
from model_debugger.probes import run_probes
from model_debugger.probing import build_context
from model_debugger.records import Run

HERE = os.path.abspath(__file__)


class Waves(nn.Module):
    def __init__(self, batch_first: bool):
        super().__init__()
        self.rnn = nn.GRU(2, 24, batch_first=batch_first)  # <rnn>
        self.head = nn.Linear(24, 3)

    def forward(self, x):  # x: (batch, time, features)
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


def waves(n: int = 600, steps: int = 20):
    """Three classes of noisy sine waves told apart by their frequency."""
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (n,), generator=g)
    t = torch.arange(steps).float()
    phase = torch.rand(n, 1, generator=g) * 6.28
    x = torch.sin((1.0 + y[:, None].float()) * 0.4 * t + phase)
    x = torch.stack([x, 0.1 * torch.randn(n, steps, generator=g)], -1)
    return x, y


def captured(batch_first: bool):
    x, y = waves()
    with model_debugger.capture() as rec:
        torch.manual_seed(0)
        model = Waves(batch_first)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _ in range(4):
            for xb, yb in DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True):
                opt.zero_grad()
                nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
    source = {HERE: open(HERE, encoding="utf-8").read()}
    return build_context(Run(rec.events), rec.keeper, source, budget=60.0)


def line_of(mark: str) -> int:
    with open(HERE, encoding="utf-8") as fh:
        return next(i for i, line in enumerate(fh, 1) if line.rstrip().endswith(f"# <{mark}>"))


def test_a_gru_reading_the_batch_as_time_is_confirmed_and_located_where_it_was_built():
    ctx = captured(batch_first=False)
    [f] = run_probes(ctx, ["rnn_layout"]).findings
    assert (f.check, f.root_cause, f.confirmed) == ("rnn_layout", "architecture", True), f
    assert f.evidence["layers"] == ["rnn"]
    assert f.evidence["heldout_batch_first"] < f.evidence["heldout_as_built"]
    assert f.location["line"] == line_of("rnn")


def test_a_batch_first_gru_is_left_alone():
    assert run_probes(captured(batch_first=True), ["rnn_layout"]).findings == ()


@pytest.mark.parametrize("shape,flagged", [((7, 20, 2), True), ((20, 7, 2), False)])
def test_only_a_first_axis_that_is_the_rows_given_counts(shape, flagged):
    """Time-major input (time, batch, features) is what the layer expects: not flagged."""
    from model_debugger.probes import rnn_layout

    class Tr:
        framework = "torch"
        inputs = (torch.zeros(shape if flagged else (7, 20, 2)),)

        @staticmethod
        def fresh_model():
            return nn.Sequential(Permuted(shape), nn.GRU(2, 4))

        @staticmethod
        def forward(model, inputs):
            return model(*inputs)

    class Permuted(nn.Module):
        def __init__(self, shape):
            super().__init__()
            self.time_major = shape[0] != 7

        def forward(self, x):
            return x.transpose(0, 1) if self.time_major else x

    assert (rnn_layout.time_major_reads(Tr) == ["1"]) is flagged
