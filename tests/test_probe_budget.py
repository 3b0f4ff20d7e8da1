"""The probe budget is a hard limit: training a copy stops at the deadline, whatever the model.

A probe whose copies train past the budget (a GRU on a loaded machine took 63 s of a 30 s
budget) gives no verdict and no probe starts after it; the trainer's deadline is cleared once
the probes are done, so later uses of the same kept objects are not cut short.
"""

from __future__ import annotations

import time

import pytest
import torch
from test_label_alignment import trainer

from model_debugger.probes import base as probe_base
from model_debugger.probes.base import Probe, ProbeContext, run_probes
from model_debugger.records import Classification, Run
from model_debugger.trainers.base import OverBudget


def test_fit_and_sweep_stop_once_the_deadline_has_passed():
    tr = trainer(0, 1.0)
    tr.deadline = time.monotonic() - 1.0
    model = tr.fresh_model()
    with pytest.raises(OverBudget):
        tr.fit(model, tr.inputs, tr.targets, 10)
    with pytest.raises(OverBudget):
        tr.sweep(1e-5, 1.0, 20)
    tr.deadline = float("inf")
    assert len(tr.fit(model, tr.inputs, tr.targets, 10)) == 10


class _Slow(Probe):
    id = "slow_copies"
    categories = ("loss_not_decreasing",)

    def run(self, ctx):
        try:  # a probe's own handler cannot turn a stopped experiment into a verdict
            ctx.trainer.fit(ctx.trainer.fresh_model(), ctx.trainer.inputs, ctx.trainer.targets,
                            10 ** 9)
        except Exception:  # noqa: BLE001
            pass
        return [self.finding("data", True, "a verdict from a fit that never ended", None)]


class _After(Probe):
    id = "after_slow"
    categories = ("loss_not_decreasing",)

    def run(self, ctx):
        return [self.finding("data", True, "should not run: the budget is spent", None)]


def test_a_probe_that_trains_past_the_budget_gives_no_verdict(monkeypatch):
    monkeypatch.setitem(probe_base.PROBES, "slow_copies", _Slow)
    monkeypatch.setitem(probe_base.PROBES, "after_slow", _After)
    tr = trainer(0, 1.0)
    ctx = ProbeContext(run=Run(events=[]), signals={},
                       classification=Classification("loss_not_decreasing", (), ()),
                       trainer=tr, deadline=time.monotonic() + 1.5)
    t0 = time.monotonic()
    report = run_probes(ctx, ["slow_copies", "after_slow"])
    assert time.monotonic() - t0 < 10.0
    assert report.findings == ()
    assert set(report.probe_seconds) == {"slow_copies"}
    assert tr.deadline == float("inf")  # cleared for whatever uses the kept objects next
    assert isinstance(tr.targets, torch.Tensor)
