"""Verify: verdicts from the defining signal across seeds, and the same initial state for every run.

The in-process tests run real torch training in a namespace the way a notebook kernel does: a
model and optimizer defined *before* the reproduced code, ruined by it, must be restored for each
Verify run.
"""

from __future__ import annotations

import json
import math
import os

import pytest

from model_debugger import phases
from model_debugger.artifacts import CellArtifact, Snapshot
from model_debugger.phases import plan_fix
from model_debugger.phases.verify import judge
from model_debugger.session import DebugSession, GateError

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


def test_judge_a_tentative_plateau_after_regularising_is_no_new_problem():
    """Weight decay against memorising 64 rows keeps the training loss from reaching zero: it
    settles at a share of the prior's that only a tentative plateau reads (no experiment runs
    in Verify). Overfitting gone everywhere is resolved; a plateau the rule table stands by
    (the loss never moved) is still a new problem."""
    before = [_m(["overfitting"], val_loss_rise=0.8)] * 3
    settled = [dict(_m(["loss_not_decreasing"], val_loss_rise=0.0), tentative=True)] * 3
    assert judge("overfitting", before, settled)["verdict"] == "resolved"
    stuck = [dict(_m(["loss_not_decreasing"], val_loss_rise=0.0), tentative=False)] * 3
    assert judge("overfitting", before, stuck)["verdict"] == "partially_resolved"


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


class _Kernel:
    """A kernel's session and the cell artifact of its last reproduction (what the magics
    keep), calling the phases."""

    def __init__(self, session, ns):
        self.session, self.ns, self.cell = session, ns, None

    def reproduce(self, code, runs=1, seed=None):
        self.cell = CellArtifact(self.ns, code)
        verdict = phases.reproduce(self.session, self.cell, runs=runs, seed=seed)
        return verdict.to_json(), (self.cell.errors[0] if self.cell.errors else None)

    def isolate(self, ids=None, budget=30.0):
        return phases.isolate(self.session, self.cell, ids, budget)

    def verify(self, seeds):
        return phases.verify(self.session, self.cell, seeds).to_json()


def _kernel(tmp_path, lr=3.0):
    ns: dict = {}
    exec(SETUP.replace("LR", str(lr)), ns)
    session = DebugSession.create(str(tmp_path / "s"))
    return _Kernel(session, ns), ns


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
    ruined = ns["model"][0].weight.detach().clone()
    assert not torch.isfinite(ruined).all() and not torch.equal(first, ruined)
    v = art.verify([0, 1])
    assert v["verdict"] == "resolved", v
    assert v["after"]["values"] == [1.0, 1.0] and math.isclose(v["before"]["values"][0],
                                                                 v["before"]["values"][1])
    # every run started from the weights the model had before the reproduced code ran: the
    # first loss (before any update) of the fixed run equals the reproduction's, NaN weights
    # left by the reproduction notwithstanding
    from model_debugger.records import Run

    d = art.session.directory
    first_loss = [Run.load(os.path.join(d, *p)).series("loss")[0]
                  for p in (("runs", "0", "record.jsonl"), ("verify", "1", "after-0.jsonl"))]
    assert math.isfinite(first_loss[0]) and first_loss[0] == first_loss[1]
    # and the kernel is left as Verify found it
    assert torch.allclose(ns["model"][0].weight, ruined, equal_nan=True)
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


def test_judge_a_fix_that_changes_nothing_is_not_kept():
    before = [_m([GI], finite_fraction=0.3), _m([GI], finite_fraction=0.3),
              _m(["healthy"], finite_fraction=1.0)]
    after = [_m([GI], finite_fraction=0.3), _m(["healthy"], finite_fraction=1.0),
             _m([GI], finite_fraction=0.3)]
    assert judge(GI, before, after)["verdict"] == "not_resolved"


def test_a_queued_finding_is_judged_on_its_own_category(tmp_path):
    """After the primary is resolved, a finding about overfitting is verified on overfitting."""
    import _synthetic as syn

    from model_debugger.records import Classification, Evidence, Finding

    s = DebugSession.create(str(tmp_path / "s"))
    code = "x = 1\n"
    (tmp_path / "s" / s.id / "artifact.py").write_text(code)
    s._append("artifact", type="script", script=str(tmp_path / "t.py"), args=[], seed=0)
    s.record_reproduce({"status": "reproduced", "runs": {"total": 0}})
    s.record_classification(Classification(GI, ("overfitting",), (
        Evidence("first_nonfinite_step", 3, ""),)), {})
    s.record_findings([Finding("data_volume", "data", True, "", None,
                               {"category": "overfitting"})])
    s.record_fix(plan_fix(s, "x = 2\n"), approved=True)
    assert s.pending_fix["category"] == "overfitting"

    def ovf(rise):
        val = [1.0, 0.8, 0.7, 0.7 * (1 + rise)]
        return syn.make_run(syn.steps_events(syn.decay(40)), syn.metric("val_loss", val))

    from model_debugger.phases import verify

    art = syn.CannedArtifact({"current": ovf(0.5), "fixed": ovf(0.0)})
    v = verify(s, art, [0, 1])
    assert art.calls == [("current", 0), ("current", 1), ("fixed", 0), ("fixed", 1)]
    assert v["category"] == "overfitting" and v["metric"] == "val_loss_rise"
    assert v["verdict"] == "resolved", v


def test_verify_leaves_the_users_later_names_and_objects_alone(tmp_path):
    art, ns = _kernel(tmp_path)
    art.reproduce(TRAIN, runs=1, seed=0)
    art.isolate(["lr_range"], budget=20)
    ns["my_helper"] = "kept"  # a later cell of the user's
    art.session.record_fix(plan_fix(art.session, FIXED), approved=True)
    art.verify([0])
    assert ns["my_helper"] == "kept"
    assert "group" not in ns  # made only by the fixed code's runs: removed again


TINY = """import torch
from torch import nn
torch.manual_seed(0)
X = torch.randn(512, 6)
y = X @ torch.randn(6, 1)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=3.0)
for step in range(60):
    idx = torch.randint(0, len(X), (64,))
    loss = nn.functional.mse_loss(model(X[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.fixture(scope="module")
def tiny_session(tmp_path_factory):
    from model_debugger.diagnose import diagnose_script

    root = tmp_path_factory.mktemp("tiny")
    script = root / "train.py"
    script.write_text(TINY)
    devnull = open(os.devnull, "w")
    s = diagnose_script(str(script), runs=1, seed=0, root=str(root / "s"), probe_seconds=15,
                        stdout=devnull)
    assert s.phase == "fix", s.report()["findings"]
    return root, s.directory


def test_cli_finishes_an_interrupted_verification(tiny_session, tmp_path, capsys):
    import shutil

    from model_debugger.cli import main

    root, directory = tiny_session
    copy = tmp_path / "s"
    shutil.copytree(directory, copy)
    s = DebugSession.load(str(copy))
    fixed = root / "fixed.py"
    fixed.write_text(TINY.replace("lr=3.0", "lr=0.05"))
    s.record_fix(plan_fix(s, fixed.read_text(), fixed_path=str(fixed)), approved=True)
    # the verify process died here; the next call finishes the pending verification
    assert main(["verify", str(copy), "--fixed", str(fixed), "--json", "--seeds", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verification"]["verdict"] == "resolved" and report["phase"] == "done"
    other = root / "other.py"
    other.write_text(TINY.replace("lr=3.0", "lr=0.01"))
    s2 = DebugSession.load(str(copy))
    assert s2.pending_fix is None


def test_cli_isolate_probes_the_kept_fix_after_a_partial_verdict(tiny_session, tmp_path, capsys):
    import shutil

    from model_debugger.cli import main

    root, directory = tiny_session
    copy = tmp_path / "s"
    shutil.copytree(directory, copy)
    s = DebugSession.load(str(copy))
    half = TINY.replace("lr=3.0", "lr=1.5")  # still diverges
    s.record_fix(plan_fix(s, half), approved=True)
    s.record_verification({"verdict": "partially_resolved", "category": GI, "seeds": [0],
                           "remaining": []})
    assert s.phase == "isolate" and not s.fix_allowed
    assert main(["isolate", str(copy), "--json", "--probe-seconds", "15"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["phase"] == "fix" and report["queue"][0] == "lr_range"
    lr = [f for f in report["findings"] if f["check"] == "lr_range"][0]
    assert lr["evidence"]["lr"] == 1.5  # measured on the kept fix, not the original code


def test_snapshot_restores_schedulers_and_keeps_later_names_when_asked(tmp_path):
    _, ns = _kernel(tmp_path)
    exec("sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)", ns)
    snap = Snapshot(ns)
    exec("for _ in range(3):\n    opt.step()\n    sched.step()\nmine = 1\nmade = 2", ns)
    assert ns["sched"].last_epoch == 3
    snap.restore(drop={"made"})
    assert ns["sched"].last_epoch == 0 and ns["opt"].param_groups[0]["lr"] == 3.0
    assert "made" not in ns and ns["mine"] == 1


def test_judge_a_problem_seen_in_some_seeds_is_judged_on_those_seeds():
    """Present in 2/3 seeds: a 0-1 signal's bimodal spread makes a band wider than its range,
    but each seed where it occurred is cured by the fix (runs are paired by seed)."""
    before = [_m([GI], finite_fraction=0.02), _m(["healthy"], finite_fraction=1.0),
              _m([GI], finite_fraction=0.03)]
    after = [_m(["healthy"], finite_fraction=1.0) for _ in range(3)]
    v = judge(GI, before, after)
    assert v["noise_band"] > v["improvement"]  # the band alone would refuse it
    assert v["verdict"] == "resolved" and v["cured_where_seen"] == [0, 2]


def test_judge_where_seen_needs_every_such_seed_cured():
    before = [_m([GI], finite_fraction=0.02), _m(["healthy"], finite_fraction=1.0),
              _m([GI], finite_fraction=0.03)]
    after = [_m(["healthy"], finite_fraction=1.0), _m(["healthy"], finite_fraction=1.0),
             _m(["healthy"], finite_fraction=0.03)]
    v = judge(GI, before, after)
    assert v["verdict"] == "not_resolved" and v["cured_where_seen"] == []
    still = [_m(["healthy"], finite_fraction=1.0), _m(["healthy"], finite_fraction=1.0),
             _m([GI], finite_fraction=1.0)]  # the signal moved, but the problem is still there
    assert judge(GI, before, still)["cured_where_seen"] == []
