"""An observation that fails must never break the user's training."""

from __future__ import annotations

import torch
from torch import nn

import model_debugger
from model_debugger.capture import torch_instrument


def test_failing_instrument_does_not_break_training(monkeypatch):
    def broken(self, params):
        raise RuntimeError("instrument bug")

    monkeypatch.setattr(torch_instrument.TorchInstrument, "_grad_norms", broken)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    before = model.weight.detach().clone()
    with model_debugger.capture() as rec:
        for _ in range(5):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    assert not torch.equal(before, model.weight.detach()), "training must still have run"
    errors = [e for e in rec.events if e["t"] == "internal_error"]
    assert len(errors) == 1 and "instrument bug" in errors[0]["error"]
    assert errors[0]["where"] == "_pre_step"
    assert [e["t"] for e in rec.events].count("end") == 1
