"""``grads_cleared``: the capture sees ``zero_grad()`` between ``backward()`` and the step.

A loop that clears the gradients it just took is found, located at that ``zero_grad()``; the
usual order, accumulation over micro-batches, two optimizers taking turns or interleaved, a
SAM-like second backward after clearing, and LBFGS's closure are not.
"""

from __future__ import annotations

import os

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


def line_of(tag: str) -> int:
    with open(HERE, encoding="utf-8") as fh:
        return next(i for i, text in enumerate(fh, 1) if text.rstrip().endswith(f"# <{tag}>"))


def train(order: str):
    torch.manual_seed(0)
    X, y = torch.randn(256, 4), torch.randint(0, 2, (256,))
    net, other = nn.Linear(4, 2), nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    opt_other = torch.optim.SGD(other.parameters(), lr=0.1)
    lbfgs = torch.optim.LBFGS(net.parameters(), lr=0.1, max_iter=4)
    for i in range(0, 256, 16):
        xb, yb = X[i:i + 16], y[i:i + 16]
        if order == "cleared":
            F.cross_entropy(net(xb), yb).backward()
            opt.zero_grad()  # <cleared>
            opt.step()
        elif order == "step_first":  # the step before the backward that was to feed it
            opt.zero_grad()
            loss = F.cross_entropy(net(xb), yb)
            opt.step()  # <step-first>
            loss.backward()
        elif order == "usual":
            opt.zero_grad()
            F.cross_entropy(net(xb), yb).backward()
            opt.step()
        elif order == "two_losses":  # each optimizer clears its own before its backward
            opt.zero_grad()
            F.cross_entropy(net(xb), yb).backward()
            opt_other.zero_grad()
            F.cross_entropy(other(xb), yb).backward()
            opt.step()
            opt_other.step()
        elif order == "sam":  # a first step, the gradients cleared, taken again, the step
            F.cross_entropy(net(xb), yb).backward()
            opt.zero_grad()
            F.cross_entropy(net(xb), yb).backward()
            opt.step()
            opt.zero_grad()
        elif order == "lbfgs":
            def closure(xb=xb, yb=yb):
                lbfgs.zero_grad()
                loss = F.cross_entropy(net(xb), yb)
                loss.backward()
                return loss

            lbfgs.step(closure)
        elif order == "accumulated":
            F.cross_entropy(net(xb), yb).backward()
            if i % 64 == 48:
                opt.step()
                opt.zero_grad()
        else:  # two optimizers taking turns, each clearing its own before its backward
            opt.zero_grad()
            F.cross_entropy(net(xb), yb).backward()
            opt.step()
            opt_other.zero_grad()
            F.cross_entropy(other(xb), yb).backward()
            opt_other.step()


@pytest.mark.parametrize("order", ["cleared", "step_first", "usual", "accumulated",
                                   "two_optimizers", "two_losses", "sam", "lbfgs"])
def test_gradients_cleared_before_the_step_are_found_at_the_zero_grad(tmp_path, order):
    path = str(tmp_path / "record.jsonl")
    rec = model_debugger.capture(path)
    with rec:
        train(order)
    run = Run.load(path)
    ctx = build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 60.0)
    findings = run_probes(ctx, ["grads_cleared"]).findings
    if order not in ("cleared", "step_first"):
        assert run.first("grads_cleared") is None and findings == ()
        return
    seen = run.first("grads_cleared")
    assert seen["of"] == 16 and seen["steps"] >= 15  # (the first step: nothing to clear yet)
    [f] = findings
    assert (f.root_cause, f.confirmed, f.evidence["decisive"]) == ("training_loop", True, True)
    if order == "step_first":  # the step is what moves: after the backward
        assert "before loss.backward()" in f.explanation and f.evidence["step_before_backward"]
        assert f.location["line"] == line_of("step-first"), f.location
        return
    assert f.location["line"] == line_of("cleared"), f.location
