"""Verify: verdicts from the defining signal across seeds, and the same initial state for every run.

The in-process tests run real torch training in a namespace the way a notebook kernel does: a
model and optimizer defined *before* the reproduced code, ruined by it, must be restored for each
Verify run.
"""

from __future__ import annotations

import math

import pytest

from model_debugger.fix import plan_fix
from model_debugger.inprocess import KernelArtifact, Snapshot
from model_debugger.session import DebugSession, GateError
from model_debugger.verify import judge

torch = pytest.importorskip("torch")


def _m(categories, crashed=False, **signals):
    return {"signals": signals, "categories": list(categories), "crashed": crashed,
            "error": "RuntimeError: boom" if crashed else None}


GI = "gradient_instability"


def test_judge_resolved_when_gone_in_every_seed_and_beyond_noise():
    before = [_m([GI], finite_fraction=0.02) for _ in range(3)]
    after = [_m(["healthy"], finite_fraction=1.0) for _ in range(3)]
    v = judge(GI, before, after)
    assert v["verdict"] == "resolved" and v["metric"] == "finite_fraction"
    assert v["before"]["present"] == "3/3" and v["after"]["present"] == "0/3"
    assert v["improvement"] == pytest.approx(0.98)


def test_judge_partial_names_the_remaining_symptom():
    before = [_m(["loss_not_decreasing"], loss_relative_drop=0.01) for _ in range(3)]
    after = [_m(["loss_not_decreasing"], loss_relative_drop=0.04),
             _m(["healthy"], loss_relative_drop=0.30), _m(["healthy"], loss_relative_drop=0.35)]
    v = judge("loss_not_decreasing", before, after)
    assert v["verdict"] == "partially_resolved"
    assert "still present in 1/3" in v["remaining_symptom"]


def test_judge_not_resolved_within_the_noise_band():
    before = [_m(["loss_not_decreasing"], loss_relative_drop=x) for x in (0.01, 0.03, 0.02)]
    after = [_m(["loss_not_decreasing"], loss_relative_drop=x) for x in (0.02, 0.04, 0.03)]
    v = judge("loss_not_decreasing", before, after)
    assert v["verdict"] == "not_resolved"
    assert v["noise_band"] >= 0.02 and "noise band" in v["remaining_symptom"]


def test_judge_a_flaky_problem_that_did_not_move_is_not_called_resolved():
    """Present in 1/3 seeds before and 0/3 after with the same numbers: that is noise."""
    before = [_m([GI], finite_fraction=0.5), _m(["healthy"], finite_fraction=1.0),
              _m(["healthy"], finite_fraction=1.0)]
    after = [_m(["healthy"], finite_fraction=1.0) for _ in range(3)]
    assert judge(GI, before, after)["verdict"] == "not_resolved"


def test_judge_a_crashing_fix_is_not_resolved():
    before = [_m([GI], finite_fraction=0.02) for _ in range(2)]
    after = [_m(["healthy"], crashed=True, finite_fraction=1.0) for _ in range(2)]
    v = judge(GI, before, after)
    assert v["verdict"] == "not_resolved" and "crashed in 2/2" in v["remaining_symptom"]


def test_judge_a_fix_that_brings_a_new_problem_is_only_partial():
    """Zeroing gradients between backward and step cures the NaN and stops all learning."""
    before = [_m([GI, "overfitting"], finite_fraction=0.02)]
    after = [_m(["loss_not_decreasing", "overfitting"], finite_fraction=1.0)]
    v = judge(GI, before, after)
    assert v["verdict"] == "partially_resolved" and "loss_not_decreasing" in \
        v["remaining_symptom"]
    assert v["remaining"] == ["loss_not_decreasing", "overfitting"]


def test_judge_lists_secondary_problems_for_the_queue():
    before = [_m([GI, "overfitting"], finite_fraction=0.02)]
    after = [_m(["overfitting"], finite_fraction=1.0)]
    v = judge(GI, before, after)
    assert v["verdict"] == "resolved" and v["remaining"] == ["overfitting"]


def test_judge_compares_ratios_in_decades():
    before = [_m([GI], grad_norm_growth=1e5) for _ in range(2)]
    after = [_m([GI], grad_norm_growth=5e4) for _ in range(2)]
    v = judge(GI, before, after)
    assert v["scale"] == "log10" and v["verdict"] == "not_resolved"


# -- in-process: the same initial state --------------------------------------------------------
SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
X = torch.randn(512, 6)
y = X @ torch.randn(6, 1)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=LR)
"""
TRAIN = """
for step in range(120):
    idx = torch.randint(0, len(X), (64,))
    loss = nn.functional.mse_loss(model(X[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
FIXED = """
for group in opt.param_groups:
    group["lr"] = 0.05
""" + TRAIN


def _kernel(tmp_path, lr=3.0):
    ns: dict = {}
    exec(SETUP.replace("LR", str(lr)), ns)
    session = DebugSession.create(str(tmp_path / "s"))
    return KernelArtifact(session, ns), ns


def test_snapshot_restores_a_model_ruined_by_the_code(tmp_path):
    art, ns = _kernel(tmp_path)
    start = {k: v.clone() for k, v in ns["model"].state_dict().items()}
    snap = Snapshot(ns)
    exec(TRAIN, ns)
    assert any(not torch.isfinite(p).all() for p in ns["model"].parameters())  # NaN weights
    ns["made_by_the_cell"] = 1
    snap.restore()
    for k, v in ns["model"].state_dict().items():
        assert torch.equal(v, start[k]), k
    assert "made_by_the_cell" not in ns and ns["opt"].state_dict()["param_groups"][0]["lr"] == 3.0


def test_in_process_fix_is_verified_from_the_same_initial_state(tmp_path):
    art, ns = _kernel(tmp_path)
    first = ns["model"][0].weight.detach().clone()
    verdict, error = art.reproduce(TRAIN, runs=2, seed=0)
    assert error is None and verdict["status"] == "reproduced"
    assert art.session.classification.primary == GI
    art.isolate(["lr_range"], budget=20)
    assert art.session.queue and art.session.queue[0].check == "lr_range"
    art.session.record_fix(plan_fix(art.session, FIXED), approved=True)
    v = art.verify([0, 1])
    assert v["verdict"] == "resolved", v
    assert v["after"]["values"] == [1.0, 1.0] and math.isclose(v["before"]["values"][0],
                                                                 v["before"]["values"][1])
    # every run started from the weights the model had before the reproduced code ran
    assert torch.equal(ns["model"][0].weight, first)
    assert art.session.phase == "done"


def test_in_process_wrong_fix_is_not_resolved(tmp_path):
    art, ns = _kernel(tmp_path)
    art.reproduce(TRAIN, runs=1, seed=0)
    art.isolate(["lr_range"], budget=20)
    wrong = FIXED.replace("0.05", "2.5")
    art.session.record_fix(plan_fix(art.session, wrong), approved=True)
    v = art.verify([0, 1])
    assert v["verdict"] == "not_resolved" and art.session.phase == "fix"


def test_verify_refused_without_an_approved_fix(tmp_path):
    art, _ = _kernel(tmp_path)
    art.reproduce(TRAIN, runs=1, seed=0)
    with pytest.raises(GateError, match="needs an approved fix"):
        art.verify([0])


def test_the_compared_signal_is_the_one_the_classification_cited():
    sig = dict(finite_fraction=1.0, grad_norm_growth=1e5, first_to_last_grad_ratio=1e-5,
               loss_relative_drop=0.01)
    before = [_m([GI], **sig)]
    after = [_m(["healthy"], **{**sig, "first_to_last_grad_ratio": 0.5})]
    v = judge(GI, before, after, cited=["first_to_last_grad_ratio", "loss_relative_drop"])
    assert v["metric"] == "first_to_last_grad_ratio" and v["verdict"] == "resolved"
    # without a NaN, finite_fraction (always 1.0) never judges an explosion
    assert judge(GI, before, after)["metric"] == "grad_norm_growth"
    nan = [_m([GI], **{**sig, "finite_fraction": 0.1, "first_nonfinite_step": 3})]
    assert judge(GI, nan, after, cited=["first_nonfinite_step"])["metric"] == "finite_fraction"
