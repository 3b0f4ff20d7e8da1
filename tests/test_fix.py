"""Fix: the gate, approval, one change at a time, boundaries, and the queue of findings."""

from __future__ import annotations

import os

import pytest

from model_debugger._change import hunks_of, touches, unrelated_groups
from model_debugger.phases import FixRefused, plan_fix
from model_debugger.probes.suggestions import suggestion_for as suggest
from model_debugger.records import Classification, Evidence, Finding
from model_debugger.session import DebugSession, GateError

SCRIPT = '''import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

X = torch.randn(256, 4) * 1000
y = (X[:, 0] > 0).long()
ds = TensorDataset(X, y)
loader = DataLoader(ds, batch_size=32)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x):
        return self.body(x)


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=5.0)
for epoch in range(3):
    for xb, yb in loader:
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
'''


def _session(tmp_path, findings, script=SCRIPT) -> DebugSession:
    s = DebugSession.create(str(tmp_path / "sessions"), title="train.py")
    path = tmp_path / "train.py"
    path.write_text(script)
    with open(os.path.join(s.directory, "artifact.py"), "w") as fh:
        fh.write(script)
    s._append("artifact", type="script", script=str(path), args=[], seed=0, max_seconds=None)
    s.record_reproduce({"status": "reproduced", "problem": "gradient_instability", "steps": 24,
                       "epochs": 3, "error": None, "seconds": 1.0, "summary": "reproduced 1/1",
                       "runs": {"total": 1, "reproduced": 1,
                                "categories": ["gradient_instability"]}})
    s.record_classification(Classification("gradient_instability", (), (
        Evidence("first_nonfinite_step", 3, "first non-finite loss"),)), {})
    s.record_findings(findings)
    return s


def _f(check, cause, confirmed=True, **evidence) -> Finding:
    return Finding(check, cause, confirmed, f"{check} explanation", {"file": "train.py",
                                                                     "line": 21}, evidence)


def _edit(old: str, new: str, script: str = SCRIPT) -> str:
    assert old in script
    return script.replace(old, new)


LR_FIX = ("lr=5.0", "lr=0.05")


def test_a_single_change_is_planned_with_diff_suggestion_and_expected_effect(tmp_path):
    s = _session(tmp_path, [_f("lr_range", "hyperparameter", lr=5.0, safe_lr=0.05)])
    plan = plan_fix(s, _edit(*LR_FIX))
    assert plan["finding"] == "lr_range" and plan["root_cause"] == "hyperparameter"
    assert "-opt = torch.optim.SGD(model.parameters(), lr=5.0)" in plan["diff"]
    assert "+opt = torch.optim.SGD(model.parameters(), lr=0.05)" in plan["diff"]
    assert len(plan["hunks"]) == 1 and plan["touches"] == []
    assert "0.05" in plan["suggestion"]
    assert "first_nonfinite_step=3" in plan["expected"]
    s.record_fix(plan, approved=True)
    assert s.phase == "verify" and s.fix_allowed is False
    fix = s.report()["fix"]
    assert fix["approved"] is True and fix["finding"] == "lr_range"
    with open(os.path.join(s.directory, fix["copy"])) as fh:
        assert "lr=0.05" in fh.read()


def test_no_confirmed_finding_no_fix_and_no_state_change(tmp_path):
    s = _session(tmp_path, [_f("lr_range", "hyperparameter", confirmed=False)])
    events = len(s.events)
    with pytest.raises(GateError, match="needs a confirmed finding"):
        plan_fix(s, _edit(*LR_FIX))
    with pytest.raises(GateError, match="needs a confirmed finding"):
        s.record_fix({"finding": "lr_range", "diff": ""}, approved=True)
    assert len(s.events) == events and s.phase == "isolate"


def test_no_approval_no_fix(tmp_path):
    s = _session(tmp_path, [_f("lr_range", "hyperparameter")])
    plan = plan_fix(s, _edit(*LR_FIX))
    events = len(s.events)
    with pytest.raises(GateError, match="not approved"):
        s.record_fix(plan, approved=False)
    assert len(s.events) == events and s.phase == "fix" and s.pending_fix is None
    assert not os.path.exists(os.path.join(s.directory, "fixes"))


def test_changes_in_unrelated_places_are_refused_with_their_hunks(tmp_path):
    s = _session(tmp_path, [_f("lr_range", "hyperparameter")])
    fixed = _edit(*LR_FIX)
    fixed = _edit("        opt.step()\n", "        opt.step()\n        opt.zero_grad()\n", fixed)
    with pytest.raises(FixRefused) as err:
        plan_fix(s, fixed)
    assert "2 unrelated places" in str(err.value)
    assert len(err.value.hunks) == 2
    assert "hunk 1: @@ -21" in str(err.value) and "hunk 2:" in str(err.value)
    assert s.phase == "fix"


def test_an_import_and_its_use_are_one_change(tmp_path):
    s = _session(tmp_path, [_f("gradient_flow", "training_loop")])
    fixed = _edit("import torch\n", "import math\nimport torch\n")
    fixed = _edit("        opt.step()\n",
                  "        torch.nn.utils.clip_grad_norm_(model.parameters(), math.sqrt(2))\n"
                  "        opt.step()\n", fixed)
    plan = plan_fix(s, fixed)
    assert len(plan["hunks"]) == 2


def test_architecture_change_refused_for_a_hyperparameter_cause_unless_overridden(tmp_path):
    s = _session(tmp_path, [_f("lr_range", "hyperparameter")])
    fixed = _edit("nn.Linear(4, 16), nn.ReLU()", "nn.Linear(4, 16), nn.Tanh()")
    with pytest.raises(FixRefused, match="touches the architecture but the root cause is "
                                         "hyperparameter"):
        plan_fix(s, fixed)
    plan = plan_fix(s, fixed, allow_architecture=True)
    assert plan["touches"] == ["architecture"]
    assert "explicit override" in plan["overrides"][0]
    s.record_fix(plan, approved=True)
    assert "explicit override" in s.report()["fix"]["overrides"][0]


def test_architecture_change_allowed_for_an_architecture_cause(tmp_path):
    s = _session(tmp_path, [_f("loss_output_mismatch", "architecture")])
    fixed = _edit("        return self.body(x)", "        return self.body(x).clamp(-50, 50)")
    plan = plan_fix(s, fixed)
    assert plan["touches"] == ["architecture"] and plan["overrides"] == []


def test_data_preprocessing_needs_explicit_consent(tmp_path):
    s = _session(tmp_path, [_f("feature_scaling", "data")])
    fixed = _edit("X = torch.randn(256, 4) * 1000\n",
                  "X = torch.randn(256, 4) * 1000\nX = (X - X.mean(0)) / X.std(0)\n")
    with pytest.raises(FixRefused, match=r"data preprocessing, which needs explicit consent "
                                         r"\(--data-consent\)"):
        plan_fix(s, fixed)
    plan = plan_fix(s, fixed, data_consent=True)
    assert "data_preprocessing" in plan["touches"]
    assert plan["overrides"] == ["data preprocessing changed with explicit consent"]


def test_loader_settings_are_not_preprocessing(tmp_path):
    s = _session(tmp_path, [_f("dataloader_throughput", "data")])
    plan = plan_fix(s, _edit("batch_size=32)", "batch_size=32, num_workers=2)"))
    assert plan["touches"] == []


def test_hardware_cause_is_escalated_not_fixed(tmp_path):
    s = _session(tmp_path, [_f("hardware", "hardware")])
    with pytest.raises(GateError, match="escalate"):
        plan_fix(s, _edit(*LR_FIX))
    assert s.fix_allowed is False and [f.check for f in s.escalations] == ["hardware"]
    assert s.report()["escalations"][0]["check"] == "hardware"


def test_a_hardware_finding_does_not_block_the_queue(tmp_path):
    s = _session(tmp_path, [_f("hardware", "hardware"), _f("lr_range", "hyperparameter")])
    assert [f.check for f in s.queue] == ["lr_range"]
    assert plan_fix(s, _edit(*LR_FIX))["finding"] == "lr_range"


def test_isolate_refused_while_a_fix_awaits_verify_and_plans_need_code(tmp_path):
    s = _session(tmp_path, [_f("lr_range", "hyperparameter")])
    with pytest.raises(GateError, match="not a fix plan"):
        s.record_fix({"finding": "lr_range", "diff": ""}, approved=True)
    with pytest.raises(GateError, match="holds no code"):
        s.record_fix({"finding": "lr_range", "root_cause": "hyperparameter", "diff": ""},
                     approved=True)
    s.record_fix(plan_fix(s, _edit(*LR_FIX)), approved=True)
    with pytest.raises(GateError, match="awaiting Verify"):
        s.record_findings([_f("feature_scaling", "data")])
    assert s.pending_fix is not None


def test_framework_switch_is_refused(tmp_path):
    s = _session(tmp_path, [_f("lr_range", "hyperparameter")])
    keras = "import keras\n" + SCRIPT.split("\n", 2)[2].replace("torch", "keras")
    with pytest.raises(FixRefused, match="switching framework"):
        plan_fix(s, keras)


def test_identical_code_is_not_a_fix(tmp_path):
    s = _session(tmp_path, [_f("lr_range", "hyperparameter")])
    with pytest.raises(FixRefused, match="identical"):
        plan_fix(s, SCRIPT)


def test_findings_are_fixed_in_priority_order(tmp_path):
    s = _session(tmp_path, [_f("lr_range", "hyperparameter", category="gradient_instability"),
                            _f("missing_zero_grad", "training_loop",
                               category="loss_not_decreasing")])
    assert [f.check for f in s.queue] == ["lr_range", "missing_zero_grad"]
    with pytest.raises(GateError, match="current finding is 'lr_range'"):
        s.record_fix({"finding": "missing_zero_grad", "root_cause": "training_loop", "diff": "",
                      "source": SCRIPT},
                     approved=True)
    s.record_fix(plan_fix(s, _edit(*LR_FIX)), approved=True)
    s.record_verification({"verdict": "resolved", "category": "gradient_instability",
                           "seeds": [0], "remaining": ["loss_not_decreasing"]})
    assert [f.check for f in s.queue] == ["missing_zero_grad"] and s.phase == "fix"
    # the next fix is planned against the kept fix, not the original script
    plan = plan_fix(s, _edit("        opt.step()\n", "        opt.step()\n        opt.zero_grad()\n",
                             _edit(*LR_FIX)))
    assert "lr=" not in plan["diff"] and "+        opt.zero_grad()" in plan["diff"]
    s.record_fix(plan, approved=True)
    s.record_verification({"verdict": "resolved", "seeds": [0], "remaining": []})
    assert s.phase == "done" and s.queue == []


def test_a_fix_whose_runs_show_no_problem_ends_the_session(tmp_path):
    """Confirmed findings of the secondary category are moot when the fixed runs are healthy."""
    s = _session(tmp_path, [_f("lr_range", "hyperparameter", category="gradient_instability"),
                            _f("constant_baseline", "hyperparameter",
                               category="loss_not_decreasing")])
    s.record_fix(plan_fix(s, _edit(*LR_FIX)), approved=True)
    s.record_verification({"verdict": "resolved", "category": "gradient_instability",
                           "seeds": [0], "remaining": []})
    assert s.phase == "done" and s.queue == [] and not s.fix_allowed


def test_verdicts_move_the_phase(tmp_path):
    s = _session(tmp_path, [_f("lr_range", "hyperparameter")])
    s.record_fix(plan_fix(s, _edit(*LR_FIX)), approved=True)
    with pytest.raises(GateError, match="awaiting Verify"):
        plan_fix(s, _edit(*LR_FIX))
    s.record_verification({"verdict": "not_resolved", "seeds": [0], "remaining": []})
    assert s.phase == "fix" and s.fix_allowed  # try another change for the same finding
    s.record_fix(plan_fix(s, _edit(*LR_FIX)), approved=True)
    s.record_verification({"verdict": "partially_resolved", "seeds": [0], "remaining": []})
    assert s.phase == "isolate" and not s.fix_allowed
    assert "partially resolved" in s.gates()["fix"]
    s.record_findings([_f("feature_scaling", "data")])
    assert s.phase == "fix" and [f.check for f in s.queue] == ["feature_scaling"]


def test_resolved_with_a_remaining_problem_goes_back_to_isolate(tmp_path):
    s = _session(tmp_path, [_f("lr_range", "hyperparameter")])
    s.record_fix(plan_fix(s, _edit(*LR_FIX)), approved=True)
    s.record_verification({"verdict": "resolved", "seeds": [0], "remaining": ["overfitting"]})
    assert s.phase == "isolate"


@pytest.mark.parametrize("check, words", [
    ("lr_range", "0.0123"), ("missing_zero_grad", "zero_grad"), ("loss_output_mismatch",
                                                                  "Softmax"),
    ("feature_scaling", "Standardise"), ("graph_retention", ".item()"),
    ("dataloader_throughput", "num_workers"), ("class_imbalance", "weight"),
    ("optimizer_recreated", "once, before the training loop"),
])
def test_suggested_fix_per_finding(check, words):
    f = _f(check, "data", safe_lr=0.0123, lr=1.0, num_workers=0)
    assert words in suggest(f)


def test_change_helpers_on_their_own():
    a = "x = 1\ny = 2\n\n\n\n\nz = 3\n"
    b = "x = 1\ny = 20\n\n\n\n\nz = 30\n"
    hunks = hunks_of(a, b)
    assert len(hunks) == 2 and len(unrelated_groups(hunks, a, b)) == 2
    assert touches(a, b, hunks) == set()


def test_cli_refusal_prints_one_json_object_and_records_nothing(tmp_path, capsys):
    import json

    from model_debugger.cli import main

    s = _session(tmp_path, [_f("lr_range", "hyperparameter")])
    fixed = tmp_path / "fixed.py"
    fixed.write_text(_edit("        opt.step()\n", "        opt.step()\n        opt.zero_grad()\n",
                           _edit(*LR_FIX)))
    events = len(s.events)
    assert main(["verify", s.directory, "--fixed", str(fixed), "--yes", "--json"]) == 3
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert "unrelated places" in report["refused"][0] and len(report["hunks"]) == 2
    assert report["fix"] is None and "hunk 2:" in err
    assert len(DebugSession.load(s.directory).events) == events
    assert main(["verify", s.directory, "--fixed", str(tmp_path / "nope.py")]) == 2


def test_a_resolved_category_settles_the_other_findings_that_explained_it(tmp_path):
    s = _session(tmp_path, [
        _f("lr_range", "hyperparameter", category="gradient_instability"),
        _f("constant_baseline", "hyperparameter", category="gradient_instability"),
        _f("class_imbalance", "data", category="convergence_to_wrong_solution")])
    s.record_fix(plan_fix(s, _edit(*LR_FIX)), approved=True)
    s.record_verification({"verdict": "resolved", "category": "gradient_instability",
                           "seeds": [0], "remaining": ["convergence_to_wrong_solution"]})
    assert [f.check for f in s.queue] == ["class_imbalance"] and s.phase == "fix"


def test_training_code_inside_a_model_class_is_not_architecture():
    a = ("import torch\nfrom torch import nn\n\n\nclass Lit(nn.Module):\n"
         "    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(2, 2)\n\n"
         "    def configure_optimizers(self):\n"
         "        return torch.optim.SGD(self.parameters(), lr=5.0)\n")
    b = a.replace("lr=5.0", "lr=0.05")
    assert touches(a, b, hunks_of(a, b)) == set()
    c = a.replace("nn.Linear(2, 2)", "nn.Linear(2, 4)")
    assert touches(a, c, hunks_of(a, c)) == {"architecture"}


def test_a_loss_reduction_and_backend_flags_are_not_preprocessing():
    a = ("import torch\nX = torch.randn(8, 2)\nds = torch.utils.data.TensorDataset(X, X)\n"
         "loss = (X - 1).pow(2).mean()\n")
    b = a.replace("(X - 1).pow(2).mean()", "(X - 1).abs().mean()") + \
        "torch.backends.cudnn.benchmark = True\n"
    assert touches(a, b, hunks_of(a, b, merge=False)) == set()
    d = a.replace("X = torch.randn(8, 2)\n", "X = torch.randn(8, 2)\nX = X / 255\n")
    assert touches(a, d, hunks_of(a, d)) == {"data_preprocessing"}
