"""Capture of real PyTorch training, in process: what the record holds and what is left behind.

Every number the recorder writes is checked against a plain reference computation done by the
test's own loop (the loss ``backward()`` was called on, ``torch.linalg.vector_norm`` over the
gradients, the weights before and after ``step()``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.optim import optimizer as optim_mod  # noqa: E402
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402

import model_debugger  # noqa: E402
from model_debugger import capture  # noqa: E402
from model_debugger.capture import active_recorder  # noqa: E402
from model_debugger.capture.imports import _finder  # noqa: E402
from model_debugger.capture.torch_losses import _ALL_BATCHES, _SAMPLE_EVERY  # noqa: E402
from model_debugger.records import Run, metric_role  # noqa: E402

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))


def line_of(marker: str) -> int:
    """The line of this file that carries ``# <marker>`` (so tests never hard-code numbers)."""
    with open(HERE, encoding="utf-8") as fh:
        hits = [i for i, line in enumerate(fh, 1) if line.rstrip().endswith(f"# <{marker}>")]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


class SlowDataset(Dataset):
    """Random classification data that takes ``delay`` seconds per sample to load."""

    def __init__(self, n: int, delay: float) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(self.delay)
        return self.x[i], self.y[i]


class Net(nn.Module):  # <model-class>
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def module_norms(model: nn.Module) -> dict[str, float]:
    """Reference per-module gradient norms: the norm over all gradients of each module."""
    out = {}
    for name, mod in model.named_modules():
        grads = [p.grad.flatten() for p in mod.parameters(recurse=False) if p.grad is not None]
        if grads:
            out[name] = float(torch.linalg.vector_norm(torch.cat(grads)))
    return out


def train_steps(model, opt, n, batch=8):
    """A plain loop on random data; returns the losses backward() was called on."""
    losses = []
    for _ in range(n):
        x, y = torch.randn(batch, 8), torch.randint(0, 4, (batch,))
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# -- the per-step record -------------------------------------------------------------------------
def test_step_record_matches_reference(tmp_path):
    torch.manual_seed(0)
    model = Net()
    loader = DataLoader(SlowDataset(32, delay=0.002), batch_size=8, shuffle=True)
    path = tmp_path / "record.jsonl"
    ref = []  # (loss, global norm, per-module norms, update/weight ratio) per step
    with capture(str(path), update_every=3) as rec:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # <optimizer>
        for _epoch in range(3):
            for xb, yb in loader:
                opt.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()  # <backward>
                grads = [p.grad.flatten() for p in model.parameters()]
                before = [p.detach().clone() for p in model.parameters()]
                opt.step()  # <step>
                upd = math.sqrt(sum(float(torch.linalg.vector_norm(p.detach() - b)) ** 2
                                    for p, b in zip(model.parameters(), before)))
                wn = math.sqrt(sum(float(torch.linalg.vector_norm(b)) ** 2 for b in before))
                ref.append((loss.item(), float(torch.linalg.vector_norm(torch.cat(grads))),
                            module_norms(model), upd / wn))

    assert rec.step == 12
    # streamed to a file, the per-step events are not also kept in memory (they would grow)
    assert {e["t"] for e in rec.events} >= {"start", "model", "optimizer", "end"}
    assert not [e for e in rec.events if e["t"] in ("step", "hist")]
    run = Run.load(str(path))
    assert run.ended and run.first("end")["status"] == "ok" and run.first("end")["steps"] == 12
    steps = run.steps
    assert [s["i"] for s in steps] == list(range(12))
    for s, (loss, gn, mgn, ratio) in zip(steps, ref):
        assert s["loss"] == pytest.approx(loss, rel=1e-6)
        assert s["gn"] == pytest.approx(gn, rel=1e-5)
        assert set(s["mgn"]) == {"fc1", "fc2"}
        for name, value in mgn.items():
            assert s["mgn"][name] == pytest.approx(value, rel=1e-5)
        if s["i"] % 3 == 0:
            assert s["ur"] == pytest.approx(ratio, rel=1e-4)
        else:
            assert "ur" not in s
        assert isinstance(s["rss"], int) and s["rss"] > 10 * 2**20
        # 8 samples at 2 ms each: the data wait is real and part of the step time
        assert 0.015 <= s["dw"] < 1.0
        if s["i"] > 0:
            assert s["dt"] >= s["dw"]
    # a re-iterated training DataLoader is a new epoch
    assert [s["ep"] for s in steps] == [0] * 4 + [1] * 4 + [2] * 4
    assert [(e["epoch"], e["step"], e["source"]) for e in run.of("epoch")] == [
        (1, 4, "dataloader"), (2, 8, "dataloader")]
    assert run.epochs == 3

    # optimizer and model, with their code references in this file
    opt_event = run.first("optimizer")
    assert opt_event["cls"] == "SGD"
    assert opt_event["hyper"]["lr"] == 0.1 and opt_event["hyper"]["momentum"] == 0.9
    model_event = run.first("model")
    assert model_event["name"] == "model" and model_event["cls"] == "Net"
    assert model_event["params"] == sum(p.numel() for p in model.parameters())
    assert model_event["modules"] == ["fc1", "act", "fc2"]
    refs = run.refs()
    for kind, marker in [("backward", "backward"), ("step", "step"),
                         ("optimizer", "optimizer"), ("model", "model-class")]:
        assert same_file(refs[kind]["file"], HERE), (kind, refs[kind])
        assert refs[kind]["line"] == line_of(marker), (kind, refs[kind])
    # each reference is written once, not once per step
    assert len(run.of("ref")) == len({(e["kind"], e["file"], e["line"]) for e in run.of("ref")})
    targets = run.of("targets")[-1]
    assert targets["loss"] == "cross_entropy" and targets["n"] == 96
    assert sum(targets["counts"]) == 96


@pytest.mark.parametrize("how", ["no_grad", "eval_mode"])
def test_the_first_evaluation_forward_is_referenced(how):
    """Where validation inputs enter the model (the line Isolate traces validation data from):
    a forward under no_grad, or of a model in eval mode, after training began."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xv = torch.randn(16, 8)
    with capture(update_every=0, hist_every=0) as rec:
        model(torch.randn(4, 8))  # before any step: not an evaluation of a trained model
        train_steps(model, opt, 3)
        if how == "no_grad":
            with torch.no_grad():
                model(xv * 10.0)  # <eval-no-grad>
        else:
            model.eval()
            model(xv)  # <eval-mode>
            model.train()
        train_steps(model, opt, 2)
    ref = Run(rec.events).refs()["eval_forward"]
    assert same_file(ref["file"], HERE)
    assert ref["line"] == line_of("eval-no-grad" if how == "no_grad" else "eval-mode")


def test_each_training_loop_gets_its_own_lines():
    """A second, short loop on other lines (fine-tuning after pre-training) is referenced too."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    with capture(update_every=0, hist_every=0) as rec:
        for _ in range(300):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()  # <loop1-backward>
            opt.step()  # <loop1-step>
        for _ in range(3):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()  # <loop2-backward>
            opt.step()  # <loop2-step>
    refs = [(e["kind"], e["line"]) for e in rec.events
            if e["t"] == "ref" and e["kind"] in ("backward", "step") and same_file(e["file"], HERE)]
    assert sorted(refs) == sorted([("backward", line_of("loop1-backward")),
                                   ("step", line_of("loop1-step")),
                                   ("backward", line_of("loop2-backward")),
                                   ("step", line_of("loop2-step"))])


@pytest.mark.parametrize("scheduler", [False, True])
def test_lines_of_steps_a_library_makes(scheduler):
    """GradScaler calls ``optimizer.step()`` two frames below the user (four with a scheduler,
    which wraps ``step``): each user line counts."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if scheduler:
        torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))

    def backward():
        scaler.scale(F.cross_entropy(model(x), y)).backward()  # <helper-backward>

    with capture(update_every=0, hist_every=0) as rec:
        for _ in range(5):
            opt.zero_grad()
            backward()
            scaler.step(opt)  # <scaler-step-1>
            scaler.update()
        for _ in range(3):
            opt.zero_grad()
            backward()
            scaler.step(opt)  # <scaler-step-2>
            scaler.update()
    refs = [(e["kind"], e["line"]) for e in rec.events
            if e["t"] == "ref" and e["kind"] in ("backward", "step") and same_file(e["file"], HERE)]
    assert sorted(refs) == sorted([("backward", line_of("helper-backward")),
                                   ("step", line_of("scaler-step-1")),
                                   ("step", line_of("scaler-step-2"))])


def test_an_optimizer_built_after_training_began_records_the_step_it_came_at():
    """A fine-tune's optimizer, built after 25 steps of pre-training: ``at_step`` 25 (the
    first at 0), and the signals read the last stage's loss curve only."""
    from model_debugger.signals import compute

    torch.manual_seed(0)
    model = Net()
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    with capture(update_every=0, hist_every=0) as rec:
        for lr, steps in ((0.1, 25), (0.01, 25)):
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            for _ in range(steps):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
    built = [e["at_step"] for e in rec.events if e["t"] == "optimizer"]
    assert built == [0, 25]
    assert compute(Run(rec.events))["stage_start"] == 25


def test_a_subclass_step_calling_super_is_one_step():
    """Both ``Sub.step`` and ``SGD.step`` carry torch's step hooks: one step, measured once."""

    class Clipped(torch.optim.SGD):
        def step(self, closure=None):
            torch.nn.utils.clip_grad_norm_(self.param_groups[0]["params"], 0.5)
            return super().step(closure)

    torch.manual_seed(0)
    model = Net()
    torch.optim.SGD(model.parameters())  # SGD.step is hooked from now on
    opt = Clipped(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    losses, norms = [], []
    with capture(update_every=0, hist_every=0) as rec:
        for _ in range(4):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            losses.append(loss.item())
            norms.append(math.sqrt(sum(float(p.grad.norm()) ** 2 for p in model.parameters())))
            opt.step()
    steps = [e for e in rec.events if e["t"] == "step"]
    assert [s["loss"] for s in steps] == pytest.approx(losses)
    assert [s["gn"] for s in steps] == pytest.approx(norms, rel=1e-5)  # before clipping
    assert [e["optimizer_steps"] for e in rec.events if e["t"] == "calls"] == [4]


def test_backward_called_with_keywords():
    """``torch.autograd.backward(tensors=loss)`` trains, and its loss is recorded."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    losses = []
    with capture(update_every=0, hist_every=0) as rec:
        for _ in range(3):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            torch.autograd.backward(tensors=loss)
            losses.append(loss.item())
            opt.step()
    steps = [e for e in rec.events if e["t"] == "step"]
    assert [s["loss"] for s in steps] == pytest.approx(losses)
    assert all(s["gn"] > 0 for s in steps)


def test_weights_replaced_by_the_step_lose_only_the_update_ratio():
    """An optimizer that swaps a weight for a bfloat16 copy: the step row is still written."""

    class Swapping(torch.optim.SGD):
        def step(self, closure=None):
            super().step(closure)
            p = self.param_groups[0]["params"][0]
            p.data = p.data.to(torch.bfloat16).float() if p.dtype == torch.bfloat16 \
                else p.data.to(torch.bfloat16)

    torch.manual_seed(0)
    model = Net()
    torch.optim.SGD(model.parameters())  # SGD.step is hooked from now on, as is Swapping.step
    opt = Swapping(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    with capture(update_every=1, hist_every=0) as rec:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    [step] = [e for e in rec.events if e["t"] == "step"]
    assert step["loss"] == pytest.approx(loss.item()) and step["gn"] > 0
    assert "ur" not in step
    assert not [e for e in rec.events if e["t"] == "internal_error"]


def test_update_ratio_over_host_and_other_weights():
    """float32 weights are copied by NumPy, bfloat16 ones by torch: one ratio over all of them."""
    torch.manual_seed(0)

    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 16)
            self.low = nn.Parameter(torch.randn(16, 4).to(torch.bfloat16))

        def forward(self, x):
            return self.fc(x) @ self.low.float()

    model = Mixed()
    opt = torch.optim.SGD([{"params": model.fc.parameters(), "lr": 0.5},
                           {"params": [model.low], "lr": 0.02}])
    x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
    ratios, parts = [], []  # the ratio; the ratios of the float32 and bfloat16 parts alone
    with capture(update_every=1, hist_every=0) as rec:
        for _ in range(4):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            params = [model.fc.weight, model.fc.bias, model.low]
            before = [p.detach().double().clone() for p in params]
            opt.step()
            upd = [float(((p.detach().double() - b) ** 2).sum()) for p, b in zip(params, before)]
            wn = [float((b ** 2).sum()) for b in before]
            ratios.append(math.sqrt(sum(upd) / sum(wn)))
            parts.append((math.sqrt(sum(upd[:2]) / sum(wn[:2])), math.sqrt(upd[2] / wn[2])))
    steps = [e for e in rec.events if e["t"] == "step"]
    assert [s["ur"] for s in steps] == pytest.approx(ratios, rel=1e-2)  # bfloat16 rounding
    for s, (host, low) in zip(steps, parts):  # either part alone would be far off
        assert abs(s["ur"] / host - 1) > 0.1 and abs(s["ur"] / low - 1) > 0.1


def test_grad_norms_of_large_and_small_tensors():
    """Large weight matrices (a dot product on CPU) next to small ones (one norm kernel)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref = []
    with capture(update_every=0) as rec:
        for scale in (1.0, 1e12, 1.0):
            opt.zero_grad()
            loss = F.cross_entropy(model(torch.randn(32, 64)), torch.randint(0, 4, (32,)))
            (loss * scale).backward()
            grads = torch.cat([p.grad.flatten() for p in model.parameters()])
            ref.append((float(torch.linalg.vector_norm(grads)), module_norms(model)))
            opt.step()
            opt.param_groups[0]["lr"] = 0.0
    steps = [e for e in rec.events if e["t"] == "step"]
    assert not [e for e in rec.events if e["t"] == "nonfinite"]
    assert ref[1][0] > 1e10 and len(steps) == 3
    for s, (gn, mgn) in zip(steps, ref):
        assert s["gn"] == pytest.approx(gn, rel=1e-5)
        assert s["mgn"] == pytest.approx(mgn, rel=1e-5)


def test_grad_norms_when_gradients_need_grad():
    """backward(create_graph=True) leaves gradients that need grad: measured by torch instead."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref = []
    with capture(update_every=0) as rec:
        for _ in range(2):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(torch.randn(8, 8)), torch.randint(0, 4, (8,))).backward(
                create_graph=True)
            assert all(p.grad.requires_grad for p in model.parameters())
            grads = torch.cat([p.grad.detach().flatten() for p in model.parameters()])
            ref.append(float(torch.linalg.vector_norm(grads)))
            opt.step()
    steps = [e for e in rec.events if e["t"] == "step"]
    assert [s["gn"] for s in steps] == pytest.approx(ref, rel=1e-5)
    assert not [e for e in rec.events if e["t"] == "internal_error"]


def test_an_interrupt_while_rows_are_written_loses_no_step(tmp_path, monkeypatch):
    """Ctrl-C (or a time limit) in the middle of writing step rows: the rest follow at exit."""
    from model_debugger.capture import torch_instrument as ti
    from model_debugger.capture import torch_steps

    original, calls = ti.TorchInstrument._step_event, []

    def write_row(self, *row):
        calls.append(row[0])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(self, *row)

    monkeypatch.setattr(torch_steps, "FLUSH_SECONDS", 0.0)  # rows are written after every step
    monkeypatch.setattr(ti.TorchInstrument, "_step_event", write_row)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "record.jsonl"
    with pytest.raises(KeyboardInterrupt), capture(str(path), update_every=0, hist_every=0):
        train_steps(model, opt, 5)
    run = Run.load(str(path))
    assert [s["i"] for s in run.steps] == [0, 1, 2] and calls == [0, 1, 2, 2]
    assert run.first("end")["status"] == "interrupted"


def test_steps_are_written_in_order_with_other_events(tmp_path):
    """Step rows are written in batches; an event in between still lands after its steps."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "record.jsonl"
    with capture(str(path), update_every=0, hist_every=0):
        for i in range(12):
            train_steps(model, opt, 1)
            if i in (2, 7):
                model_debugger.log(val_loss=float(i))
    events = [json.loads(line) for line in path.read_text().splitlines()]
    kinds = [(e["t"], e.get("i", e.get("value"))) for e in events if e["t"] in ("step", "metric")]
    assert kinds == ([("step", i) for i in range(3)] + [("metric", 2.0)]
                     + [("step", i) for i in range(3, 8)] + [("metric", 7.0)]
                     + [("step", i) for i in range(8, 12)])


def test_one_step_per_backward_without_optimizer():
    """A loop that updates weights by hand: every backward() is one step, counted once."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    losses = []
    with capture() as rec:
        for _ in range(5):
            loss = model(torch.randn(4, 3)).pow(2).mean()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None
            losses.append(loss.item())
    steps = [e for e in rec.events if e["t"] == "step"]
    assert [s["loss"] for s in steps] == pytest.approx(losses)


def test_gradient_accumulation_one_step_per_optimizer_step():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    with capture() as rec:
        for _ in range(4):
            opt.zero_grad()
            micro = []
            for _ in range(3):
                loss = F.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 4, (4,)))
                torch.autograd.backward(loss)
                micro.append(loss.item())
            grads = torch.cat([p.grad.flatten() for p in model.parameters()])
            gn = float(torch.linalg.vector_norm(grads))
            opt.step()
            losses.append((sum(micro) / 3, gn))
    steps = [e for e in rec.events if e["t"] == "step"]
    assert len(steps) == 4
    for s, (loss, gn) in zip(steps, losses):
        assert s["loss"] == pytest.approx(loss, rel=1e-6)
        assert s["gn"] == pytest.approx(gn, rel=1e-5)


def test_target_statistics_and_eval_loss():
    """Class counts (ignore_index left out), regression moments, losses computed under no_grad."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    labels, eval_losses = [], []
    with capture(hist_every=25) as rec:
        for i in range(40):  # more than one queue of targets
            x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
            y[: i % 3] = -100  # ignored positions
            opt.zero_grad()
            F.cross_entropy(model(x), y, ignore_index=-100).backward()
            opt.step()
            labels.append(y)
            if i == 30:
                with torch.no_grad():
                    for n in (8, 4):
                        xe, ye = torch.randn(n, 8), torch.randint(0, 4, (n,))
                        eval_losses.append((F.cross_entropy(model(xe), ye).item(), n))
    every = torch.cat(labels)
    # every batch up to _ALL_BATCHES counts, then every _SAMPLE_EVERY-th; n counts them all
    sampled = torch.cat([y for k, y in enumerate(labels, 1)
                         if k <= _ALL_BATCHES or k % _SAMPLE_EVERY == 0])
    assert len(sampled) < len(every)
    events = [e for e in rec.events if e["t"] == "targets"]
    assert [e["n"] for e in events] == [25 * 8, 40 * 8]
    assert "sampled" not in events[0] and events[-1]["sampled"] == len(sampled)
    assert events[-1]["loss"] == "cross_entropy"
    assert events[-1]["counts"] == torch.bincount(sampled[sampled >= 0], minlength=4).tolist()
    assert events[0]["counts"] == torch.bincount(
        every[:200][every[:200] >= 0], minlength=4).tolist()
    (metric,) = [e for e in rec.events if e["t"] == "metric"]
    assert metric["name"] == "eval_loss" and metric["source"] == "auto"
    assert metric["value"] == pytest.approx(sum(v * n for v, n in eval_losses) / 12, rel=1e-6)
    assert metric["step"] == 31  # written when training resumed

    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    targets = []
    with capture() as rec:
        for _ in range(37):
            x, y = torch.randn(16, 3), torch.randn(16, 1) * 3 + 5
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            targets.append(y)
    every = torch.cat([y for k, y in enumerate(targets, 1)
                       if k <= _ALL_BATCHES or k % _SAMPLE_EVERY == 0]).double()
    (event,) = [e for e in rec.events if e["t"] == "targets"]
    assert event["loss"] == "mse_loss" and event["n"] == 37 * 16 and "counts" not in event
    assert event["mean"] == pytest.approx(float(every.mean()), rel=1e-5)
    assert event["var"] == pytest.approx(float(every.var(unbiased=False)), rel=1e-4)


def test_summed_losses_and_gradient_accumulation_are_recorded(tmp_path):
    path = tmp_path / "record.jsonl"
    with capture(str(path)):
        model = nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            for _ in range(2):  # two micro-batches per optimizer step
                x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
                (F.cross_entropy(model(x), y, reduction="sum") / 2).backward()
            opt.step()
    run = Run.load(str(path))
    assert run.of("targets")[-1]["reduction"] == "sum"
    assert run.first("accumulation")["backwards"] == 2 and len(run.steps) == 3


# -- metrics -------------------------------------------------------------------------------------
def test_metrics_from_log_tensorboard_and_stdout(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    path = tmp_path / "record.jsonl"
    with capture(str(path)):
        model_debugger.log(val_loss=0.5, val_acc=torch.tensor(0.75), epoch=1)
        writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
        writer.add_scalar("train/loss", 0.25, 3)
        writer.add_scalar("train/loss", torch.tensor(0.125), 4)
        writer.add_scalars("lr", {"g0": 0.01, "g1": 0.02}, 3)
        writer.close()
        print("epoch 3: train_loss=0.41 val_loss=0.52 val_acc=0.81")
        print("loss: 0.3")
        print("no numbers here")
    run = Run.load(str(path))
    got = [(e["name"], e["value"], e["source"]) for e in run.of("metric")]
    assert got == [
        ("val_loss", 0.5, "log"), ("val_acc", 0.75, "log"),
        ("train/loss", 0.25, "tensorboard"), ("train/loss", 0.125, "tensorboard"),
        ("lr/g0", 0.01, "tensorboard"), ("lr/g1", 0.02, "tensorboard"),
        ("train_loss", 0.41, "stdout"), ("val_loss", 0.52, "stdout"), ("val_acc", 0.81, "stdout"),
        ("loss", 0.3, "stdout"),
    ]
    by_name = {(e["name"], e["source"]): e for e in run.of("metric")}
    assert by_name[("val_loss", "log")]["epoch"] == 1
    assert by_name[("val_loss", "stdout")]["epoch"] == 3
    # the real SummaryWriter still wrote its event file
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(3, 0.25), (4, 0.125)]


@pytest.mark.parametrize("line,expected", [
    ("epoch 7 train loss 0.098 val accuracy 0.99", {"train_loss": 0.098, "val_accuracy": 0.99}),
    ("epoch 3: mean train loss 0.0498, test acc 0.9533",
     {"mean_train_loss": 0.0498, "test_acc": 0.9533}),
    ("epoch 8  loss 0.0663  val_loss 0.0350  val_acc 0.985",
     {"loss": 0.0663, "val_loss": 0.035, "val_acc": 0.985}),
    ("step 160: loss 0.006, lr 2.00e-03, val_acc 1.000", {"loss": 0.006, "lr": 0.002,
                                                           "val_acc": 1.0}),
    ("loaded 50 files in 3 batches", {}),  # counts are not metrics
    ("New best val loss 0.32 at epoch 5", {}),  # a best-so-far, not this epoch's value
    ("ema loss 0.2, target loss 0.05", {}),
    ("Train loss 0.3 | Val loss 0.4", {"train_loss": 0.3, "val_loss": 0.4}),
    ("Epoch 1/10", {}),
    ("train loss nan", {"train_loss": float("nan")}),
])
def test_stdout_metrics_printed_as_name_space_value(line, expected):
    from model_debugger.capture.metrics import parse_metric_line

    got = parse_metric_line(line)[1]
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        assert got[k] == pytest.approx(v, nan_ok=True)


def test_stdout_tee_reads_a_print_of_separate_arguments(tmp_path):
    path = tmp_path / "record.jsonl"
    with capture(str(path)):
        print("epoch", 2, "train loss", 0.25, "val accuracy", 0.875)
    got = {e["name"]: e["value"] for e in Run.load(str(path)).of("metric")}
    assert got == {"train_loss": 0.25, "val_accuracy": 0.875}
    assert metric_role("val_accuracy") == ("val", "acc")


def test_log_is_a_noop_outside_capture():
    assert active_recorder() is None
    model_debugger.log(val_loss=1.0)  # nothing to record into, nothing raised


# -- non-finite values ---------------------------------------------------------------------------
class ShiftedLog(nn.Module):
    """``log(x + offset)``: finite while the offset keeps the input positive."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("offset", torch.tensor(100.0))

    def forward(self, x):
        return torch.log(x + self.offset)


@pytest.mark.parametrize("before", [3, 40])  # 40: past the capture's start (the short path)
def test_first_nonfinite_from_forward_names_step_and_module(before):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), ShiftedLog(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with capture() as rec:
        train_steps(model, opt, before)
        model[2].offset.fill_(-100.0)  # log of a negative number from now on
        train_steps(model, opt, 3)
    events = [e for e in rec.events if e["t"] == "nonfinite"]
    assert len(events) == 1
    assert events[0]["step"] == before and events[0]["what"] == "loss"
    assert events[0]["module"] == "2" and events[0]["replay"] == "nonfinite"
    steps = [e for e in rec.events if e["t"] == "step"]
    assert [isinstance(s["loss"], float) for s in steps] == [True] * before + [False] * 3
    # the replay that localized it left no hooks and did not touch the buffers
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert float(model[2].offset) == -100.0


@pytest.mark.parametrize("before", [3, 40])  # 40: past the capture's start (the short path)
def test_nonfinite_loss_from_a_finite_forward_is_replayed_through_the_loss(before):
    """An infinite target: the forward is finite, the same loss call repeats the infinity."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with capture(update_every=0) as rec:
        for i in range(before + 2):
            x, y = torch.randn(8, 4), torch.randn(8, 1)
            if i == before:
                y[0] = float("inf")
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
    (event,) = [e for e in rec.events if e["t"] == "nonfinite"]
    assert event["step"] == before and event["what"] == "loss"
    assert event["module"] is None and event["replay"] == "nonfinite"


class Positions(nn.Module):
    """Token embeddings plus position embeddings indexed by a slice of a buffer (as in BERT)."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(20, 8), nn.Embedding(16, 8)
        self.register_buffer("position_ids", torch.arange(16)[None], persistent=False)
        self.head = nn.Linear(8, 1)

    def forward(self, ids):
        hidden = self.tok(ids) + self.pos(self.position_ids[:, :ids.shape[1]])
        return self.head(hidden.mean(1))


def test_a_nonfinite_loss_is_localized_without_breaking_the_backward_that_follows():
    """The replay must not write to a buffer the pending backward saved (an index tensor)."""
    torch.manual_seed(0)
    model = Positions()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with capture(update_every=0) as rec:
        for i in range(3):
            ids, y = torch.randint(0, 20, (4, 6)), torch.randn(4, 1)
            if i == 1:
                y[0] = float("nan")  # a NaN target: the loss is NaN, then the replay runs
            opt.zero_grad()
            F.mse_loss(model(ids), y).backward()  # raised "modified by an inplace operation"
            opt.step()
    (event,) = [e for e in rec.events if e["t"] == "nonfinite"]
    assert event["step"] == 1 and event["in_batch"] == {"target": 1, "rows": 4}
    assert len([e for e in rec.events if e["t"] == "step"]) == 3


def test_a_nonfinite_batch_input_is_named_in_the_nonfinite_event():
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with capture(update_every=0) as rec:
        for i in range(2):  # the model is found at the first backward, its inputs seen next
            x = torch.randn(5, 3)
            if i:
                x[2, 1] = float("inf")
            opt.zero_grad()
            F.mse_loss(model(x), torch.zeros(5, 1)).backward()
            opt.step()
    (event,) = [e for e in rec.events if e["t"] == "nonfinite"]
    assert event["step"] == 1 and event["in_batch"] == {"inputs": 1, "rows": 5}


def test_first_nonfinite_from_weights_names_step_and_module():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                          nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with capture() as rec:
        train_steps(model, opt, 4)
        with torch.no_grad():
            model[2].weight.fill_(math.inf)
        train_steps(model, opt, 2)
    (event,) = [e for e in rec.events if e["t"] == "nonfinite"]
    assert event["step"] == 4 and event["module"] == "2"


# -- nothing left behind -------------------------------------------------------------------------
def _patched_things():
    return {
        "Tensor.backward": torch.Tensor.__dict__["backward"],
        "autograd.backward": torch.autograd.backward,
        "DataLoader.__iter__": DataLoader.__dict__["__iter__"],
        "Optimizer.__init__": optim_mod.Optimizer.__dict__["__init__"],
        **{f"F.{n}": getattr(F, n) for n in ("cross_entropy", "nll_loss", "mse_loss",
                                              "binary_cross_entropy_with_logits")},
    }


@pytest.mark.parametrize("ending", ["normal", "exception", "keyboard_interrupt"])
def test_everything_restored(ending, tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    before = _patched_things()
    tb_before = (SummaryWriter.add_scalar, SummaryWriter.add_scalars)
    stdout_before = sys.stdout
    meta_path_before = list(sys.meta_path)
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(16, 8), torch.randint(0, 4, (16,))),
                        batch_size=4)
    path = tmp_path / "record.jsonl"
    exc_type = {"normal": None, "exception": ValueError,
                "keyboard_interrupt": KeyboardInterrupt}[ending]

    def body():
        with capture(str(path)) as rec:
            assert torch.Tensor.__dict__["backward"] is not before["Tensor.backward"]
            assert sys.stdout is not stdout_before
            for xb, yb in loader:
                opt.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                opt.step()
            if exc_type is not None:
                raise exc_type("stopped on purpose")  # <raise>
        return rec

    if exc_type is None:
        body()
    else:
        with pytest.raises(exc_type, match="stopped on purpose"):
            body()

    assert _patched_things() == before
    assert (SummaryWriter.add_scalar, SummaryWriter.add_scalars) == tb_before
    assert not optim_mod._global_optimizer_pre_hooks
    assert not optim_mod._global_optimizer_post_hooks
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks
        assert not m._backward_hooks and not m._backward_pre_hooks
    assert sys.stdout is stdout_before
    assert sys.meta_path == meta_path_before and _finder not in sys.meta_path
    assert active_recorder() is None

    run = Run.load(str(path))
    assert len(run.steps) == 4 and run.ended
    if exc_type is None:
        assert run.error is None and run.first("end")["status"] == "ok"
    else:
        err = run.error
        kind = "interrupted" if exc_type is KeyboardInterrupt else "exception"
        assert err["kind"] == kind and run.first("end")["status"] == kind
        assert err["type"] == exc_type.__name__ and err["message"] == "stopped on purpose"
        assert err["step"] == 4
        assert same_file(err["location"]["file"], HERE)
        assert err["location"]["line"] == line_of("raise")
        assert "stopped on purpose" in err["traceback"]
    # a later plain training loop is not observed by anything
    train_steps(model, opt, 2)
    assert active_recorder() is None


def test_real_out_of_memory_is_recorded_with_the_steps_before_it():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises((RuntimeError, MemoryError)) as info:
        with capture() as rec:
            train_steps(model, opt, 3)
            torch.empty(2**62, dtype=torch.uint8)  # <oom>
    err = rec.error
    assert err["kind"] == "oom", str(info.value)
    assert err["type"] == type(info.value).__name__
    assert err["step"] == 3 and err["location"]["line"] == line_of("oom")
    assert same_file(err["location"]["file"], HERE)
    assert len([e for e in rec.events if e["t"] == "step"]) == 3
    assert rec.events[-1]["t"] == "end" and rec.events[-1]["status"] == "oom"


# -- sampling --------------------------------------------------------------------------------------
@pytest.mark.parametrize("hist_every", [4, 0])
def test_histograms_only_every_n_steps(hist_every):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with capture(hist_every=hist_every) as rec:
        train_steps(model, opt, 10)
    hists = [e for e in rec.events if e["t"] == "hist"]
    if not hist_every:
        assert hists == []
        return
    assert sorted({e["step"] for e in hists}) == [0, 4, 8]
    names = [n for n, _ in model.named_parameters()]
    assert [e["param"] for e in hists] == names * 3
    sizes = dict((n, p.numel()) for n, p in model.named_parameters())
    for e in hists:
        assert len(e["counts"]) == 30 and sum(e["counts"]) == sizes[e["param"]]
        assert e["lo"] <= e["hi"]


def test_histograms_of_large_gradients_use_a_strided_sample():
    """A gradient above 65536 values is histogrammed on every k-th value; the event says k."""
    from model_debugger.capture.torch_grads import HIST_SAMPLE as _HIST_SAMPLE

    model = nn.Linear(512, 300)  # a 153600-value weight gradient and a small bias gradient
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with capture(hist_every=1, update_every=0) as rec:
        opt.zero_grad()
        model(torch.randn(4, 512)).pow(2).mean().backward()
        opt.step()
    hists = {e["param"]: e for e in rec.events if e["t"] == "hist"}
    weight, bias = hists["weight"], hists["bias"]
    assert weight["numel"] == 153600 and weight["stride"] == -(-153600 // _HIST_SAMPLE) == 3
    assert sum(weight["counts"]) == len(range(0, 153600, 3))
    grad = model.weight.grad.flatten()[::3]
    assert weight["lo"] == pytest.approx(float(grad.min())) and \
        weight["hi"] == pytest.approx(float(grad.max()))
    assert bias["stride"] == 1 and sum(bias["counts"]) == bias["numel"] == 300


@pytest.mark.parametrize("make_opt", [lambda ps: torch.optim.SGD(ps, lr=0.1),
                                      lambda ps: torch.optim.SparseAdam(ps, lr=0.01)],
                         ids=["sgd", "sparse-adam"])
def test_sparse_gradients_are_measured(make_opt):
    """nn.Embedding(sparse=True): norms and histograms of the stored (coalesced) values."""
    torch.manual_seed(0)
    emb, head = nn.Embedding(100, 16, sparse=True), nn.Linear(16, 3)
    opts = [make_opt(emb.parameters()), torch.optim.SGD(head.parameters(), lr=0.1)]
    x = torch.randint(0, 100, (32, 5))  # repeated rows: an uncoalesced gradient
    y = torch.randint(0, 3, (32,))
    refs = []
    with capture(hist_every=2, update_every=0) as rec:
        for _ in range(4):
            for opt in opts:
                opt.zero_grad()
            F.cross_entropy(head(emb(x).mean(1)), y).backward()
            assert emb.weight.grad.is_sparse
            refs.append(float(torch.linalg.vector_norm(emb.weight.grad.to_dense())))
            for opt in opts:
                opt.step()
    assert not [e for e in rec.events if e["t"] == "internal_error"]
    emb_steps = [e for e in rec.events if e["t"] == "step"][0::2]  # the embedding's optimizer
    assert [s["gn"] for s in emb_steps] == pytest.approx(refs, rel=1e-5)
    hists = [e for e in rec.events if e["t"] == "hist" and e.get("sparse")]
    rows = len(torch.unique(x))
    assert hists and all(sum(h["counts"]) == h["numel"] == rows * 16 for h in hists)


@pytest.mark.parametrize("nvml", [True, False])
def test_cuda_memory_every_step_and_utilisation_every_tenth(monkeypatch, nvml):
    """The CUDA fields of the step record, with torch.cuda's readings stood in on this CPU box.

    Utilisation is read every GPU_UTIL_EVERY steps; without NVML it is asked once, recorded as
    unknown, and never asked again.
    """
    from model_debugger.capture.torch_steps import GPU_UTIL_EVERY

    allocated = iter(range(1000, 10**6, 1000))
    asked = []

    def utilization():
        asked.append(1)
        if not nvml:
            raise ModuleNotFoundError("pynvml does not seem to be installed")
        return 7 * len(asked)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: next(allocated))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 123456)
    monkeypatch.setattr(torch.cuda, "utilization", utilization)
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with capture(update_every=0) as rec:
        train_steps(model, opt, 2 * GPU_UTIL_EVERY + 1)
    steps = [e for e in rec.events if e["t"] == "step"]
    assert [s["cuda"] for s in steps] == [1000 * (k + 1) for k in range(len(steps))]
    assert all(s["cuda_peak"] == 123456 for s in steps)
    util = {s["i"]: s["gpu_util"] for s in steps if "gpu_util" in s}
    if nvml:
        assert util == {0: 7, GPU_UTIL_EVERY: 14, 2 * GPU_UTIL_EVERY: 21}
    else:
        assert util == {0: None} and len(asked) == 1


def test_module_norms_off():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with capture(module_norms=False, update_every=0) as rec:
        train_steps(model, opt, 3)
    steps = [e for e in rec.events if e["t"] == "step"]
    assert len(steps) == 3
    assert all("mgn" not in s and "ur" not in s and s["gn"] > 0 for s in steps)


# -- imports -------------------------------------------------------------------------------------
def test_capture_does_not_import_torch():
    code = """
import json
import sys

import model_debugger

with model_debugger.capture() as rec:
    x = sum(range(10))
print(json.dumps({"torch_imported": "torch" in sys.modules}))
with model_debugger.capture() as rec:
    import torch  # imported inside the block: the instrument attaches right after the import
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.ones(4, 2)).sum().backward()
        opt.step()
print(json.dumps({"steps": rec.step,
                  "restored": torch.Tensor.backward.__module__ == "torch._tensor"}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert lines == [{"torch_imported": False}, {"steps": 3, "restored": True}]


# -- gradients reset between steps -------------------------------------------------------------
@pytest.mark.parametrize("reset", ["none", "zero_grad", "set_none", "zero_", "other_model"])
def test_grad_reset_measures_whether_each_step_began_with_fresh_gradients(reset):
    torch.manual_seed(0)
    model, other = nn.Linear(4, 2), nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with capture(update_every=0, hist_every=0) as rec:
        for _ in range(12):
            if reset == "zero_grad":
                opt.zero_grad()
            elif reset == "set_none":
                for p in model.parameters():
                    p.grad = None
            elif reset == "zero_":
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad.zero_()
            elif reset == "other_model":
                other.zero_grad()  # counted, but not the parameters that train
            F.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 2)).backward()
            opt.step()
    event = Run(events=rec.events).first("grad_reset")
    assert event["checked"] == 11  # every step after the first
    stale = reset in ("none", "other_model")
    assert event["not_reset"] == (11 if stale else 0)


def test_grad_reset_ignores_the_micro_batches_of_intended_accumulation():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with capture(update_every=0, hist_every=0) as rec:
        for _ in range(8):
            opt.zero_grad()
            for _ in range(4):  # four micro-batches per step, added up on purpose
                F.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1)).backward()
            opt.step()
    event = Run(events=rec.events).first("grad_reset")
    assert event == {"t": "grad_reset", "checked": 7, "not_reset": 0}


# -- the loop's own time per step ----------------------------------------------------------------
def _loop(steps: int, stall: float):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(steps * 8, 8), torch.randint(0, 2, (steps * 8,))),
                        batch_size=8)
    with capture(update_every=0, hist_every=0) as rec:
        for xb, yb in loader:
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
            if stall:
                time.sleep(stall)  # <stall>
    return Run(events=rec.events)


def test_a_stall_in_the_loop_is_measured_and_its_line_sampled():
    from model_debugger.signals import compute

    run = _loop(60, 0.02)
    steps = run.steps
    assert all(0 < s["bz"] < s["dt"] for s in steps[1:])  # forward + backward + step, timed
    sig = compute(run)
    # the stall in ms (absolute: a loaded machine slows the model's own work, not the sleep);
    # its share still above what Classify calls an overhead
    assert sig["step_overhead_ms"] >= 15 and sig["step_overhead_share"] > 0.5
    event = run.first("step_overhead")
    top = event["lines"][0]
    assert same_file(top["file"], HERE) and top["line"] == line_of("stall")
    # most samples at the stall (on a loaded machine others land elsewhere: 0.66-0.78 seen)
    assert top["share"] > 0.5 and event["samples"] >= 20


class _SlowEvaluator(nn.Module):
    def forward(self, x):
        time.sleep(0.02)  # <validate-work>
        return x


class _ValidatingTrainer:
    """A trainer whose ``fit`` validates after every batch (``validate()`` inside the batch loop),
    while the optimizer steps in ``training_step``."""

    def __init__(self, steps: int):
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.loader = DataLoader(TensorDataset(torch.randn(steps * 8, 8),
                                               torch.randint(0, 2, (steps * 8,))), batch_size=8)
        self.evaluator = _SlowEvaluator()

    def training_step(self, xb, yb):
        self.opt.zero_grad()
        F.cross_entropy(self.model(xb), yb).backward()
        self.opt.step()

    def validate(self):
        with torch.no_grad():
            self.evaluator(torch.zeros(2))  # (through torch's Module.__call__)

    def fit(self):
        for xb, yb in self.loader:
            self.training_step(xb, yb)
            self.validate()  # <validate-call>


def test_time_spent_in_a_function_the_loop_calls_is_traced_to_the_call():
    """The sampler counts where the time is spent (inside ``validate``) and the call the loop
    makes to it (in ``fit``, which calls the ``training_step`` that steps); the probe locates
    the finding at the call: doing it every step is the fault."""
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context

    trainer = _ValidatingTrainer(60)
    with capture(update_every=0, hist_every=0) as rec:
        trainer.fit()
    run = Run(events=rec.events)
    event = run.first("step_overhead")
    assert event["lines"][0]["line"] == line_of("validate-work")
    assert event["loop_lines"][0]["line"] == line_of("validate-call")
    [f] = run_probes(build_context(run, None, {}), ["step_overhead"]).findings
    assert f.confirmed and f.location["line"] == line_of("validate-call")
    assert f.evidence["spent_at"]["line"] == line_of("validate-work")


def test_a_loop_without_own_work_is_not_sampled():
    from model_debugger.signals import compute

    run = _loop(60, 0.0)
    sig = compute(run)
    # a few ms of the loop's own work (zero_grad, Python) on a loaded machine at most: far
    # below what Classify calls an overhead, and the sampler only starts above 5 ms
    assert sig["step_overhead_share"] < 0.5 and sig["step_overhead_ms"] < 10


# -- autograd graphs kept across steps -----------------------------------------------------------
@pytest.mark.parametrize("keep", ["loss", "pred", "item", "detach", "none"])
def test_graphs_kept_measures_whether_past_losses_stay_alive(keep):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    history = []
    with capture(update_every=0, hist_every=0) as rec:
        for _ in range(20):
            opt.zero_grad()
            pred = model(torch.randn(8, 4))
            loss = F.mse_loss(pred, torch.randn(8, 1))
            loss.backward()
            opt.step()
            if keep == "loss":
                history.append(loss)  # the classic leak: every graph stays alive
            elif keep == "pred":
                history.append(pred)  # kept for an epoch metric, graph and all
            elif keep == "item":
                history.append(loss.item())
            elif keep == "detach":
                history.append(loss.detach())
    event = Run(events=rec.events).first("graphs_kept")
    assert event["checked"] == 16 and event["lag"] == 3  # the first: seen while discovering
    assert event["alive"] == (16 if keep == "loss" else 0)  # a kept prediction is no loss
    # the model's hooks start at the first backward: forwards 2..20, the last three pending
    assert event["outputs_checked"] == 16
    assert event["outputs_alive"] == (16 if keep == "pred" else 0)


@pytest.mark.parametrize("how", ["frozen", "optimizer_over_the_head", "branch_unused"])
def test_the_share_of_the_model_that_trains_is_recorded(how):
    """What no step updates (frozen, left out of the optimizer, outside the loss's graph) is
    counted against the whole model: the ``trained`` event and ``untrained_share``."""
    from model_debugger.signals import compute

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    body, head = 8 * 32 + 32, 32 * 2 + 2
    if how == "frozen":
        for p in model[0].parameters():
            p.requires_grad_(False)
    params = model[2].parameters() if how == "optimizer_over_the_head" else model.parameters()
    X, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    with capture() as rec:
        opt = torch.optim.SGD(params, lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            out = model[2](torch.randn(64, 32)) if how == "branch_unused" else model(X)
            F.cross_entropy(out, y).backward()
            opt.step()
    run = Run(rec.events)
    trained = run.of("trained")
    assert [(e["params"], e["updated"]) for e in trained] == [(body + head, head)]
    assert compute(run)["untrained_share"] == pytest.approx(body / (body + head))


def test_a_model_that_trains_whole_has_no_untrained_share():
    from model_debugger.signals import compute

    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    with capture() as rec:
        opt = torch.optim.Adam(model.parameters())
        for _ in range(3):
            opt.zero_grad()
            F.cross_entropy(model(torch.randn(16, 8)), torch.randint(0, 2, (16,))).backward()
            opt.step()
    assert compute(Run(rec.events))["untrained_share"] == 0.0


@pytest.mark.parametrize("loss", [
    lambda out, y: F.cross_entropy(out, y, weight=torch.tensor([1.0, 30.0])),
    lambda out, y: nn.BCEWithLogitsLoss(pos_weight=torch.tensor(30.0))(out[:, 1], y.float())])
def test_a_class_weighted_loss_is_marked_and_has_no_baseline(loss):
    """Class weights put the loss on another scale than the prior's entropy."""
    from model_debugger.signals import compute

    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with capture() as rec:
        for _ in range(6):
            opt.zero_grad()
            loss(model(torch.randn(32, 4)), (torch.rand(32) < 0.1).long()).backward()
            opt.step()
    run = Run(rec.events)
    assert run.of("targets")[-1].get("weighted") is True
    assert compute(run).get("constant_predictor_loss") is None


def test_a_k_fold_loop_that_builds_a_model_per_fold_trains_whole():
    """A model and optimizer made first and never used, then a new model and optimizer per
    fold: each fold's optimizer trains its own model whole. What trains another model than the
    one the capture first saw says nothing of how much of that one trains (was: 1.0, every
    weight "never updated", and a healthy k-fold run read as a plateau held up)."""
    from model_debugger.signals import compute

    def make():
        return nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))

    with capture() as rec:
        model = make()
        opt = torch.optim.Adam(model.parameters())
        for _fold in range(3):
            model = make()
            opt = torch.optim.Adam(model.parameters())
            for _ in range(3):
                opt.zero_grad()
                F.cross_entropy(model(torch.randn(16, 8)), torch.randint(0, 2, (16,))).backward()
                opt.step()
    assert compute(Run(rec.events)).get("untrained_share", 0.0) == 0.0


def test_containers_the_loop_keeps_are_looked_at_during_the_run():
    """Every 50 steps the user's frames are looked at: a list growing 1 MB a step is seen
    growing, a constant list of parameters (same storage, not growing) is not a growing one."""
    from model_debugger.capture.held import HELD_EVERY
    from model_debugger.signals import growing_container

    def train():
        model = nn.Linear(512, 512)  # 1 MB of weights
        params = list(model.parameters())
        opt = torch.optim.SGD(params, lr=0.01)
        kept = []
        for _ in range(3 * HELD_EVERY):
            kept.append(torch.zeros(1 << 18))
            opt.zero_grad()
            model(torch.randn(4, 512)).sum().backward()
            opt.step()

    with capture() as rec:
        train()
    run = Run(rec.events)
    looks = run.of("held")
    assert [e["step"] for e in looks] == [HELD_EVERY, 2 * HELD_EVERY, 3 * HELD_EVERY]
    names = {c["name"] for e in looks for c in e["containers"]}
    assert {"kept", "params"} <= names
    held = growing_container(run)
    assert held["name"] == "kept" and held["file"] == HERE
    assert held["mb_per_step"] == pytest.approx(1.0, rel=0.01)
    assert held["last"]["len"] == 3 * HELD_EVERY


@pytest.mark.parametrize("budget", [1e-9, 1e9], ids=["over_budget", "within_budget"])
def test_looks_at_a_loop_of_fast_steps_are_spaced_within_their_budget(monkeypatch, budget):
    """After the first looks, a look costing more than ``HELD_BUDGET`` of the steps between
    looks waits longer (in multiples of ``HELD_EVERY``); within it, every ``HELD_EVERY``
    steps. The growing list is seen either way. (The budget is set: a loaded machine's slower
    steps would leave a look within the real one.)"""
    from model_debugger.capture import held
    from model_debugger.capture.held import HELD_EVERY, HELD_STEADY
    from model_debugger.signals import growing_container

    monkeypatch.setattr(held, "HELD_BUDGET", budget)

    def train():
        model = nn.Linear(1, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        kept = [torch.zeros(1 << 16) for _ in range(64)]  # many tensors: a look reads each
        for _ in range(12 * HELD_EVERY):
            kept.append(torch.zeros(1 << 16))
            opt.zero_grad()
            model(torch.ones(1, 1)).sum().backward()
            opt.step()

    with capture() as rec:
        train()
    run = Run(rec.events)
    steps = [e["step"] for e in run.of("held")]
    within = budget > 1
    assert steps == [HELD_EVERY * (k + 1) for k in range(12 if within else HELD_STEADY)]
    assert growing_container(run)["name"] == "kept"


def test_the_learning_rate_trajectory_and_the_scheduler_line_are_recorded():
    """An ``lr`` event when the rate moves by 1.5x or more; the scheduler's line is a ref."""
    model = nn.Linear(3, 1)
    with capture() as rec:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.1)  # <sched>
        for _ in range(12):
            opt.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
            sched.step()
    run = Run(rec.events)
    assert [(e["step"], round(e["lr"], 6)) for e in run.of("lr")] == [
        (0, 0.1), (4, 0.01), (8, 0.001)]
    ref = next(e for e in run.of("ref") if e["kind"] == "scheduler")
    assert (ref["line"], ref["cls"]) == (line_of("sched"), "StepLR")


def test_a_bfloat16_model_s_first_nonfinite_loss_is_still_recorded():
    """The replay's output is bf16 (NumPy has no such type): the event is written all the
    same, with the finite forward measured."""
    torch.manual_seed(0)
    X = torch.randn(64, 6).bfloat16()
    y = torch.poisson(torch.ones(64, 1)).bfloat16()
    with capture(update_every=0) as rec:  # (a model built inside: its first forward is seen)
        net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1), nn.ReLU()).bfloat16()
        opt = torch.optim.SGD(net.parameters(), lr=1e-2)
        for i in range(0, 64, 16):
            rate = net(X[i:i + 16])
            loss = (rate - y[i:i + 16] * torch.log(rate)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    (event,) = [e for e in rec.events if e["t"] == "nonfinite"]
    assert event["step"] == 0 and event["forward"] == "finite"
    assert not [e for e in rec.events if e["t"] == "internal_error"]


def test_a_model_of_plain_tensors_is_searched_for_a_few_times_only(monkeypatch):
    """Parameters in a dict, no nn.Module: the search for the model walks every live object
    (``gc``), and ran on every optimizer step (a 5 s loop took 190 s under capture). The
    searches now thin out (steps 0, 1, 2, 4, 8, ...); the steps are all recorded."""
    import gc

    from model_debugger.capture import torch_model

    calls = []
    real = gc.get_objects
    monkeypatch.setattr(torch_model.gc, "get_objects", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(0)
    params = {"w": torch.randn(4, 1, requires_grad=True), "b": torch.zeros(1, requires_grad=True)}
    opt = torch.optim.SGD(params.values(), lr=0.01)
    X, y = torch.randn(64, 4), torch.randn(64, 1)
    with capture(update_every=0) as rec:
        for _ in range(300):
            opt.zero_grad()
            F.mse_loss(X @ params["w"] + params["b"], y).backward()
            opt.step()
    assert len([e for e in rec.events if e["t"] == "step"]) == 300
    assert 1 <= len(calls) <= 12


def test_the_fast_event_encoder_writes_what_the_json_encoder_writes():
    """Events are encoded by one reused C encoder (``JSONEncoder.encode`` builds one per call:
    about half of a step event's cost): the text is the same, NaN, infinities, non-ASCII text
    and objects JSON cannot hold (``str()`` of them) included; a circular event falls back to
    the standard encoder, which names the problem."""
    import json
    from pathlib import PurePosixPath

    from model_debugger.capture import recorder

    events = [{"t": "step", "i": 3, "ep": 0, "loss": 0.123456789, "dt": 4.1e-4, "tm": True,
               "mgn": {"0": float("nan"), "fc": float("inf")}, "none": None},
              {"t": "warning", "message": "naïve → 💥 \"quoted\"\n", "values": [1, -2.5, 1e300]},
              {"t": "ref", "obj": complex(1, 2), "path": PurePosixPath("/tmp/x")}]
    assert recorder._C_ENCODE is not None  # (CPython: the fast path is on)
    for event in events:
        assert recorder._encode(event) == recorder._ENCODER.encode(event)
        json.loads(recorder._encode(event))
    loop: dict = {"t": "x"}
    loop["self"] = loop
    with pytest.raises(ValueError, match="Circular"):
        recorder._encode(loop)


@pytest.mark.parametrize("seconds, written", [(3600.0, [100, 450]),
                                              (0.0, [100, 200, 300, 400, 450])])
def test_target_statistics_are_written_at_most_once_in_a_few_seconds(monkeypatch, seconds,
                                                                     written):
    """Every ``hist_every`` steps, unless one was written less than ``TARGETS_SECONDS`` ago
    (reducing and writing them costs a millisecond: a loop of fast steps would pay it every
    hundred steps); the last statistics are always written when the capture ends."""
    from model_debugger.capture import torch_steps

    monkeypatch.setattr(torch_steps, "TARGETS_SECONDS", seconds)  # (not the clock: the load)
    model = nn.Linear(2, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with capture() as rec:
        for _ in range(450):
            opt.zero_grad()
            F.cross_entropy(model(torch.randn(4, 2)), torch.randint(0, 3, (4,))).backward()
            opt.step()
    assert [e["n"] // 4 for e in Run(rec.events).of("targets")] == written
