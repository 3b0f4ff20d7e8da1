"""Steady-state thinning: full detail on the warm-up and on sampled steps, lean steps between.

The sampling interval is driven through its budget (``DETAIL_BUDGET``: any measurable cost is
over a budget of 1e-9, so k is ``DETAIL_MAX_EVERY``), never through this machine's speed. What
must hold on a lean step: it counts, its loss is recorded, a non-finite loss is seen on its own
step and brings full detail back; the loop's gradient accumulation, ``step(closure)`` and
``zero_grad`` placement are read as before.
"""

from __future__ import annotations

import math
import threading
import time

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from model_debugger import capture  # noqa: E402
from model_debugger.capture import torch_optim  # noqa: E402
from model_debugger.capture import torch_steps as ts  # noqa: E402
from model_debugger.records import Run  # noqa: E402

WARM, K = ts.DETAIL_WARMUP, ts.DETAIL_MAX_EVERY


@pytest.fixture
def thin(monkeypatch):
    """Full detail costs more than the budget: every K-th step after the warm-up."""
    monkeypatch.setattr(ts, "DETAIL_BUDGET", 1e-9)


def train(steps: int, nan_at: int | None = None, accumulate: int = 1, **config):
    """A small MLP under ``capture(**config)``: (events, the loss of every step)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 20), torch.randint(0, 3, (64,))
    losses = []
    with capture(**{"update_every": 0, "hist_every": 0, "detail_every_max": K,
                    **config}) as rec:
        for i in range(steps):
            opt.zero_grad()
            parts = []
            for _ in range(accumulate):
                loss = F.cross_entropy(model(x), y)
                if i == nan_at:
                    loss = loss * float("nan")
                loss.backward()
                parts.append(loss.item())
            losses.append(sum(parts) / len(parts))
            opt.step()
    return rec.events, losses


def steps_of(events) -> list[dict]:
    return [e for e in events if e["t"] == "step"]


def detailed(steps) -> list[int]:
    """Steps with full detail: their time split (``bz``), flag, norms and memory."""
    return [s["i"] for s in steps if "gn" in s]


def test_lean_steps_record_every_loss_and_sampled_steps_the_detail(thin):
    events, losses = train(WARM + 3 * K + 1)
    steps = steps_of(events)
    assert [s["i"] for s in steps] == list(range(len(losses)))
    assert [s["loss"] for s in steps] == pytest.approx(losses, rel=1e-6)
    assert all(s["dt"] > 0 and "dw" in s for s in steps[1:])
    sampled = list(range(WARM)) + list(range(WARM, len(losses), K))
    assert detailed(steps) == sampled
    for s in steps:
        full = s["i"] in sampled
        assert ("bz" in s, "tm" in s, "rss" in s, "mgn" in s) == (full, full, full, full)
    [event] = [e for e in events if e["t"] == "detail_every"]
    assert (event["step"], event["every"], event["budget"]) == (WARM, K, 1e-9)
    calls = next(e for e in events if e["t"] == "calls")
    assert calls["optimizer_steps"] == calls["backward"] == calls["zero_grad"] == len(losses)


def test_a_late_nan_loss_is_seen_on_its_step_and_brings_detail_back(thin):
    nan_at = WARM + 2 * K + 3  # a lean step
    events, losses = train(nan_at + WARM + K, nan_at=nan_at)
    steps = steps_of(events)
    assert nan_at not in list(range(WARM, len(losses), K))
    assert steps[nan_at]["loss"] == "nan" and math.isnan(losses[nan_at])
    [bad] = [e for e in events if e["t"] == "nonfinite"]
    assert (bad["what"], bad["step"]) == ("loss", nan_at)
    # the step itself and the next DETAIL_WARMUP steps have full detail again
    after = [i for i in detailed(steps) if i >= nan_at]
    assert after[:WARM] == list(range(nan_at, nan_at + WARM))
    assert "bz" not in steps[nan_at]  # (its forward ran lean: no split of a part)
    assert all("bz" in steps[i] for i in range(nan_at + 1, nan_at + WARM))


def test_gradient_accumulation_on_lean_steps(thin):
    events, losses = train(WARM + 2 * K, accumulate=2)
    steps = steps_of(events)
    assert len(steps) == len(losses)
    assert [s["loss"] for s in steps] == pytest.approx(losses, rel=1e-6)
    assert next(e for e in events if e["t"] == "accumulation")["backwards"] == 2
    assert next(e for e in events if e["t"] == "calls")["backward"] == 2 * len(losses)


def test_step_closure_measures_the_sampled_steps_after_the_closure(thin):
    torch.manual_seed(0)
    model = nn.Linear(6, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 6), torch.randn(32, 1)
    ref = {}

    with capture(update_every=0, hist_every=0, detail_every_max=K) as rec:
        for i in range(WARM + 2 * K):
            def closure(i=i):
                opt.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()
                ref[i] = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()))
                return loss
            opt.step(closure)
    steps = steps_of(rec.events)
    assert len(steps) == WARM + 2 * K
    assert detailed(steps) == list(range(WARM)) + [WARM, WARM + K]
    for s in steps:
        if "gn" in s:
            assert s["gn"] == pytest.approx(ref[s["i"]], rel=1e-5)


def test_zero_grad_between_backward_and_step_is_seen_on_lean_steps(thin):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n = WARM + 3 * K
    with capture(update_every=0, hist_every=0, detail_every_max=K) as rec:
        for _ in range(n):
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.zero_grad()  # the bug: the gradients are cleared before the step
            opt.step()
    [cleared] = [e for e in rec.events if e["t"] == "grads_cleared"]
    assert (cleared["steps"], cleared["of"]) == (n, n)


def test_histograms_are_spaced_within_their_budget_after_the_warm_up(monkeypatch):
    monkeypatch.setattr(torch_optim, "HIST_BUDGET", 1e-9)  # any histogram is over it
    events, _ = train(WARM + 100, hist_every=4)
    hist_steps = sorted({e["step"] for e in events if e["t"] == "hist"})
    assert hist_steps[:WARM // 4] == list(range(0, WARM, 4))  # the warm-up: every 4th
    later = [s for s in hist_steps if s >= WARM]
    assert len(later) <= 1  # one more at most: spaced out by its cost from then on


def test_a_multi_optimizer_loop_counts_every_step_of_each(thin):
    torch.manual_seed(0)
    gen, disc = nn.Linear(4, 8), nn.Linear(8, 1)
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.01)
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.01)
    with capture(update_every=0, hist_every=0, detail_every_max=K) as rec:
        for _ in range(WARM + 2 * K):
            for opt in (opt_d, opt_g):
                opt_d.zero_grad()
                opt_g.zero_grad()
                disc(gen(torch.randn(16, 4))).pow(2).mean().backward()
                opt.step()
    steps = steps_of(rec.events)
    assert len(steps) == 2 * (WARM + 2 * K)
    assert all(isinstance(s["loss"], float) for s in steps)
    assert set(detailed(steps)) >= set(range(WARM))
    late = [i for i in detailed(steps) if i >= WARM]  # both optimizers sampled (k is even:
    assert {i % 2 for i in late} == {0, 1}, late    # every k-th step alone is always D's)


def test_the_rate_is_read_on_lean_steps(thin):
    """A warm-up restarting every epoch (a scheduler re-made per epoch) shows every restart."""
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
    epochs, per_epoch = 7, 40
    with capture(update_every=0, hist_every=0, detail_every_max=K) as rec:
        for _ in range(epochs):
            warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
            for _ in range(per_epoch):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
                warm.step()
    lows = [e for e in rec.events if e["t"] == "lr" and e["lr"] < 0.01]
    assert len(lows) == epochs, [(e["step"], e["lr"]) for e in rec.events if e["t"] == "lr"]


def test_the_live_panel_spaces_its_redraws_by_their_cost(tmp_path, monkeypatch):
    """A redraw that costs more than SHARE of the interval waits longer: few redraws."""
    from model_debugger.widgets import curves

    path = tmp_path / "record.jsonl"
    path.write_text('{"t": "step", "i": 0, "ep": 0, "loss": 1.0, "dt": 0.1, "dw": 0.0}\n')
    panel = curves.LossCurves(interactive=False)
    calls = []

    def slow_update(run, note=""):
        calls.append(time.perf_counter())
        time.sleep(0.05)  # the redraw's cost: with SHARE 0.1 the next one waits 0.5 s

    monkeypatch.setattr(curves, "SHARE", 0.1)
    monkeypatch.setattr(panel, "update", slow_update)
    stop = threading.Event()

    def writer():
        i = 1
        while not stop.is_set():
            with open(path, "a") as fh:
                fh.write(f'{{"t": "step", "i": {i}, "ep": 0, "loss": 1.0, "dt": 0.1, '
                         f'"dw": 0.0}}\n')
            i += 1
            time.sleep(0.005)

    t = threading.Thread(target=writer)
    t.start()
    try:
        with panel.follow(lambda: str(path), interval=0.01):
            time.sleep(0.8)
            live = len(calls)
    finally:
        stop.set()
        t.join()
    assert 1 <= live <= 3  # every 10 ms without the spacing: tens of redraws


def test_the_follower_reads_around_a_broken_line(tmp_path):
    from model_debugger.widgets.curves import RecordFollower

    path = tmp_path / "record.jsonl"
    path.write_text('{"t": "start"}\n{"t": "st\n\n{"t": "end"}\n')
    follower = RecordFollower(lambda: str(path))
    assert follower.poll()
    assert [e["t"] for e in follower.events] == ["start", "end"]
    assert Run(follower.events).ended
