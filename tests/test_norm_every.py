"""Gradient norms every k-th optimizer step: fixed (``norm_every=k``) or automatic.

Automatic: the norms are measured on the steps with full detail (``torch_steps``: every step of
the warm-up, then every k-th, k within a time budget). Every recorded norm is checked against
``torch.linalg.vector_norm`` over the gradients the test's own loop sees just before ``step()``.
The automatic choice is driven through its budget (``DETAIL_BUDGET``), so the tests do not
depend on how fast this machine is.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from model_debugger import capture, signals  # noqa: E402
from model_debugger.capture import CaptureConfig, torch_instrument  # noqa: E402
from model_debugger.capture import torch_steps as ti  # noqa: E402 - the norm schedule
from model_debugger.classify import classify  # noqa: E402
from model_debugger.records import Run  # noqa: E402


def reference(model: nn.Module) -> float:
    return math.sqrt(sum(float(torch.linalg.vector_norm(p.grad.double())) ** 2
                         for p in model.parameters()))


def train(steps: int, nan_from: int | None = None, **config):
    """A small MLP under ``capture(**config)``: (events, reference norm per step)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 20), torch.randint(0, 3, (64,))
    refs = []
    with capture(update_every=0, **config) as rec:
        for i in range(steps):
            if i == nan_from:  # from here on the first layer's gradient is NaN, the loss is not
                model[0].weight.register_hook(lambda g: g * float("nan"))
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            refs.append(reference(model))
            opt.step()
    return rec.events, refs


def measured(events) -> list[int]:
    """Steps whose gradient norm was measured (an unmeasured step has no ``gn`` at all)."""
    return [e["i"] for e in events if e["t"] == "step" and "gn" in e]


def test_fixed_norm_every_measures_every_kth_step_exactly():
    events, refs = train(20, norm_every=3)
    steps = [e for e in events if e["t"] == "step"]
    assert len(steps) == 20 and measured(events) == list(range(0, 20, 3))
    for s in steps:
        if s["i"] % 3:
            assert "gn" not in s and "mgn" not in s
        else:
            assert s["gn"] == pytest.approx(refs[s["i"]], rel=1e-5)
            assert set(s["mgn"]) == {"0", "2"}
    assert not [e for e in events if e["t"] == "norm_every"]  # fixed: nothing to announce


def test_process_memory_is_read_on_the_measured_steps():
    events, _ = train(20, norm_every=4)
    steps = [e for e in events if e["t"] == "step"]
    assert [s["i"] for s in steps if "rss" in s] == measured(events) == list(range(0, 20, 4))
    assert all(isinstance(s["rss"], int) and s["rss"] > 10 * 2**20 for s in steps if "rss" in s)


def test_histograms_keep_their_own_schedule():
    events, _ = train(12, norm_every=5, hist_every=4)
    assert sorted({e["step"] for e in events if e["t"] == "hist"}) == [0, 4, 8]
    assert measured(events) == [0, 5, 10]


def test_automatic_norm_every_over_budget_thins_out_after_the_start(monkeypatch):
    """Detail that costs more than the budget: norms every k-th step after the warm-up."""
    monkeypatch.setattr(ti, "DETAIL_BUDGET", 1e-9)  # any measurable cost is over it
    events, refs = train(ti.DETAIL_WARMUP + 40, detail_every_max=ti.DETAIL_MAX_EVERY)
    [event] = [e for e in events if e["t"] == "detail_every"]
    assert event["step"] == ti.DETAIL_WARMUP and event["share"] > 0
    k = event["every"]
    assert k == min(ti.DETAIL_MAX_EVERY, max(1, math.ceil(event["share"] / 1e-9))) == \
        ti.DETAIL_MAX_EVERY
    after = [i for i in range(ti.DETAIL_WARMUP, ti.DETAIL_WARMUP + 40) if i % k == 0]
    assert measured(events) == list(range(ti.DETAIL_WARMUP)) + after
    by_step = {e["i"]: e for e in events if e["t"] == "step"}
    for i in measured(events):
        assert by_step[i]["gn"] == pytest.approx(refs[i], rel=1e-5)


def test_automatic_norm_every_within_budget_measures_every_step(monkeypatch):
    monkeypatch.setattr(ti, "DETAIL_BUDGET", 1e9)
    events, _ = train(ti.DETAIL_WARMUP + 20)
    assert measured(events) == list(range(ti.DETAIL_WARMUP + 20))
    assert not [e for e in events if e["t"] == "detail_every"]


def test_a_nan_gradient_on_an_unmeasured_step_is_still_found_with_its_module():
    """A NaN gradient between measured steps poisons the weights; the next loss names them."""
    events, _ = train(12, nan_from=5, norm_every=4)
    bad = [e for e in events if e["t"] == "nonfinite"]
    assert len(bad) == 1 and bad[0]["module"] == "0"
    # step 5 is not measured: its update makes the weights NaN, and step 6's loss finds them
    assert (bad[0]["what"], bad[0]["step"], bad[0]["in_weights"]) == ("loss", 6, True)
    # the classification says where the bad update came from: after step 4, the last measured
    cls = classify(signals.compute(Run(events)))
    assert cls.primary == "gradient_instability"
    assert {(e.signal, e.value) for e in cls.evidence} >= {
        ("first_nonfinite_step", 6), ("last_finite_grad_step", 4)}


@pytest.mark.parametrize("value", [-1, 1.5, True, "2"])
def test_config_rejects_what_is_not_a_step_count(value):
    with pytest.raises(ValueError, match="norm_every"):
        CaptureConfig(norm_every=value)


def test_gradient_plot_joins_the_measured_steps(tmp_path):
    from model_debugger import figures as _plots

    path = tmp_path / "r.jsonl"
    with capture(str(path), update_every=0, norm_every=3):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(10):
            opt.zero_grad()
            F.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))).backward()
            opt.step()
    fig = _plots.grad_norm_figure(Run.load(str(path)))
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    xs = lines["global"].get_xdata()
    assert list(xs) == [0, 3, 6, 9]
    assert np.isfinite(lines["global"].get_ydata()).all()
    assert list(lines["module 0"].get_xdata()) == [0, 3, 6, 9]


def test_each_optimizer_keeps_its_own_schedule():
    """A GAN's two optimizers alternate: with k = 2 both still get norms, every other own step."""
    torch.manual_seed(0)
    gen, disc = nn.Linear(4, 8), nn.Linear(8, 1)
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.01)
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.01)
    with capture(update_every=2, hist_every=2, norm_every=2) as rec:
        for _ in range(4):
            for opt in (opt_d, opt_g):
                opt_d.zero_grad()
                opt_g.zero_grad()
                disc(gen(torch.randn(16, 4))).pow(2).mean().backward()
                opt.step()
    steps = [e for e in rec.events if e["t"] == "step"]
    assert ["gn" in s for s in steps] == [True, True, False, False] * 2
    assert [s.get("ur") is not None for s in steps] == [True, True, False, False] * 2
    hist_steps = sorted({e["step"] for e in rec.events if e["t"] == "hist"})
    assert hist_steps == [0, 1, 4, 5]


def test_a_step_whose_optimizer_raised_leaves_no_norms_behind():
    """Norms measured before a step that then failed are not written on the next, unmeasured one."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = [0]

    def refuse_first(optimizer, args, kwargs):  # runs after the capture's global pre-hook
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("refused")

    opt.register_step_pre_hook(refuse_first)
    with capture(update_every=0, norm_every=2) as rec:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            try:
                opt.step()
            except RuntimeError:
                pass
    steps = [e for e in rec.events if e["t"] == "step"]
    assert ["gn" in s for s in steps] == [False, True]  # own steps 1 (not due) and 2


def test_an_optimizer_rebuilt_every_step_keeps_the_schedule():
    """Building the optimizer inside the loop (a bug to diagnose) must not reset the schedules."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    with capture(update_every=5, hist_every=5, norm_every=5) as rec:
        for _ in range(12):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
    steps = [e for e in rec.events if e["t"] == "step"]
    assert measured(rec.events) == [0, 5, 10]
    assert [s["i"] for s in steps if "ur" in s] == [0, 5, 10]
    assert sorted({e["step"] for e in rec.events if e["t"] == "hist"}) == [0, 5, 10]


@pytest.mark.parametrize("current, budgets, expected", [
    (1, 2.5, 3),   # over budget: the smallest k within it
    (4, 2.5, 4),   # 3 would be within budget, but only just: stays
    (4, 1.5, 2),   # well within at 2
    (3, 50, ti.DETAIL_MAX_EVERY),
    (2, 0.1, 1)])
def test_retuning_lowers_k_only_with_a_margin(current, budgets, expected):
    """``budgets``: what full detail on one step costs, in units of the budget."""
    from model_debugger.capture.recorder import CaptureConfig, Recorder

    inst = torch_instrument.TorchInstrument(
        Recorder(None, CaptureConfig(detail_every_max=ti.DETAIL_MAX_EVERY)))
    inst._detail_every = current
    share = budgets * ti.DETAIL_BUDGET
    # own seconds: a detailed step, two lean ones (1 ms over them); two 10 ms steps
    inst._own_times = ([share * 0.01 + 0.001], [0.001, 0.001], [0.01, 0.01])
    inst._retune_detail()
    assert inst._detail_every == expected
    events = [e for e in inst.rec.events if e["t"] == "detail_every"]
    assert [e["every"] for e in events] == ([expected] if expected != current else [])


def test_full_detail_on_every_step_unless_thinning_is_asked_for(monkeypatch):
    """Thinning reads the rate and watches kept graphs only on its sampled steps: off by
    default (``detail_every_max=1``) until those read every step; any cost is within a cap
    of 1."""
    monkeypatch.setattr(ti, "DETAIL_BUDGET", 1e-9)  # any measurable cost is over it
    events, _ = train(ti.DETAIL_WARMUP + 40)
    assert measured(events) == list(range(ti.DETAIL_WARMUP + 40))
    assert not [e for e in events if e["t"] == "detail_every"]
    with pytest.raises(ValueError, match="detail_every_max"):
        train(1, detail_every_max=0)
