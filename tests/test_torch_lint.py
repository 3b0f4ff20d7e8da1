"""Static lint of PyTorch training code: every rule fires on its pattern and stays silent on fixes.

Sources are plain strings (torch is never imported). In a firing case the expected line is marked
with ``# <-`` and the hit must point exactly there.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from model_debugger.pitfalls.torch_lint import LintHit, lint_file, lint_source
from model_debugger.records import ROOT_CAUSES

SCENARIOS = Path(__file__).parent / "scenarios"

HEAD = """\
import torch
from torch import nn
import torch.nn.functional as F
"""


def _src(body: str) -> str:
    return HEAD + textwrap.dedent(body)


def _marked(src: str) -> list[int]:
    return [i for i, line in enumerate(src.splitlines(), 1) if line.rstrip().endswith("# <-")]


def _hits(body: str, rule: str | None = None, **kw) -> tuple[list[LintHit], str]:
    src = _src(body)
    hits = lint_source(src, "train.py", **kw)
    return [h for h in hits if rule is None or h.rule == rule], src


def assert_fires(body: str, rule: str, root_cause: str, **kw) -> LintHit:
    hits, src = _hits(body, rule, **kw)
    lines = _marked(src)
    assert len(lines) == 1, "test source must mark exactly one line"
    assert [(h.rule, h.root_cause, h.line) for h in hits] == [(rule, root_cause, lines[0])]
    assert hits[0].file == "train.py" and hits[0].root_cause in ROOT_CAUSES
    assert len(hits[0].message) > 60
    return hits[0]


def assert_silent(body: str, **kw) -> None:
    hits, _ = _hits(body, **kw)
    assert hits == []


LOOP_HEAD = """
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()
"""


# --- missing_zero_grad ----------------------------------------------------------------------------

def test_missing_zero_grad_fires_at_backward():
    assert_fires(LOOP_HEAD + """
for epoch in range(3):
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()  # <-
        opt.step()
""", "missing_zero_grad", "training_loop")


def test_missing_zero_grad_points_at_a_zero_grad_referenced_but_not_called():
    hit = assert_fires(LOOP_HEAD + """
for epoch in range(3):
    for x, y in loader:
        opt.zero_grad  # <-
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
""", "missing_zero_grad", "training_loop")
    assert "never called" in hit.message


def test_missing_zero_grad_once_before_the_loop_is_still_missing():
    assert_fires(LOOP_HEAD + """
opt.zero_grad()
step = 0
while step < 100:
    loss = criterion(model(x), y)
    (loss / 2).backward()  # <-
    opt.step()
    step += 1
""", "missing_zero_grad", "training_loop")


@pytest.mark.parametrize("reset", [
    "opt.zero_grad()", "model.zero_grad(set_to_none=True)",
    "for p in model.parameters():\n        p.grad = None",
    "for p in model.parameters():\n        p.grad.zero_()",
])
def test_missing_zero_grad_silent_when_grads_are_reset(reset):
    assert_silent(LOOP_HEAD + f"""
for x, y in loader:
    {reset}
    loss = criterion(model(x), y)
    loss.backward()
    opt.step()
""")


def test_missing_zero_grad_silent_on_gradient_accumulation():
    assert_silent(LOOP_HEAD + """
for i, (x, y) in enumerate(loader):
    loss = criterion(model(x), y) / 4
    loss.backward()
    if (i + 1) % 4 == 0:
        opt.step()
        opt.zero_grad()
""")


def test_missing_zero_grad_silent_with_closure_and_scheduler():
    assert_silent(LOOP_HEAD + """
sched = torch.optim.lr_scheduler.StepLR(opt, 10)
for x, y in loader:
    def closure():
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        return loss
    opt.step(closure)
    sched.step()
""")


# --- loss_output_mismatch -------------------------------------------------------------------------

def test_softmax_last_layer_of_sequential_with_cross_entropy():
    hit = assert_fires("""
model = nn.Sequential(
    nn.Linear(4, 8),
    nn.ReLU(),
    nn.Linear(8, 3),
    nn.Softmax(dim=1),  # <-
)
criterion = nn.CrossEntropyLoss()
opt = torch.optim.Adam(model.parameters())
for x, y in loader:
    opt.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    opt.step()
""", "loss_output_mismatch", "architecture")
    assert "logits" in hit.message


def test_softmax_layer_attribute_used_at_end_of_forward():
    assert_fires("""
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.out = nn.Softmax(dim=-1)  # <-

    def forward(self, x):
        h = self.fc(x)
        return self.out(h)


net = Net()
loss = F.cross_entropy(net(x), y)
loss.backward()
""", "loss_output_mismatch", "architecture")


def test_forward_returning_softmax_in_a_file_that_uses_cross_entropy():
    assert_fires("""
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        x = self.fc(x)
        x = F.softmax(x, dim=1)  # <-
        return x

loss_fn = nn.CrossEntropyLoss()
""", "loss_output_mismatch", "architecture")


def test_softmax_inside_the_loss_call():
    assert_fires(LOOP_HEAD + """
for x, y in loader:
    opt.zero_grad()
    logits = model(x)
    loss = F.cross_entropy(
        torch.softmax(logits, dim=1),  # <-
        y)
    loss.backward()
    opt.step()
""", "loss_output_mismatch", "architecture")


def test_sigmoid_fed_to_bce_with_logits():
    hit = assert_fires("""
model = nn.Sequential(nn.Linear(4, 1))
criterion = nn.BCEWithLogitsLoss()
for x, y in loader:
    probs = torch.sigmoid(model(x)).squeeze(1)  # <-
    loss = criterion(probs, y)
    loss.backward()
""", "loss_output_mismatch", "architecture")
    assert "BCEWithLogitsLoss" in hit.message


def test_log_softmax_fed_to_cross_entropy_is_a_double_log_softmax():
    hit = assert_fires("""
model = nn.Sequential(nn.Linear(4, 3), nn.LogSoftmax(dim=1))  # <-
loss = nn.CrossEntropyLoss()(model(x), y)
""", "loss_output_mismatch", "architecture")
    assert "double log-softmax" in hit.message and "harmless" in hit.message


def test_log_softmax_with_nll_is_silent_even_when_cross_entropy_is_used_elsewhere():
    assert_silent("""
model = nn.Sequential(nn.Linear(4, 3), nn.LogSoftmax(dim=1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    opt.zero_grad()
    out = model(x)
    loss = F.nll_loss(out, y)
    loss.backward()
    opt.step()
other = F.cross_entropy(teacher_logits, y)
""")


def test_softmax_only_for_reporting_is_silent():
    assert_silent(LOOP_HEAD + """
for x, y in loader:
    opt.zero_grad()
    logits = model(x)
    loss = criterion(logits, y)
    loss.backward()
    opt.step()
    probs = F.softmax(logits, dim=1)
    logits = logits.softmax(dim=1)
with torch.no_grad():
    p = torch.softmax(model(xv), dim=1)
    conf = p.max(1).values.mean().item()
""")


def test_softmax_only_at_inference_and_sigmoid_with_bce_are_silent():
    assert_silent("""
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        logits = self.fc(x)
        if self.training:
            return logits
        return F.softmax(logits, dim=1)


head = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())
net = Net()
loss = F.cross_entropy(net(x), y) + nn.BCELoss()(head(x).squeeze(1), t)
loss.backward()
""")


def test_log_of_softmax_with_nll_is_not_a_mismatch():
    assert_silent("""
class LogProb(nn.Module):
    def forward(self, x):
        return torch.log(torch.softmax(x, dim=1))


net = nn.Sequential(nn.Linear(4, 3), LogProb())
loss = F.nll_loss(net(x), y)
""")


# --- graph_retention ------------------------------------------------------------------------------

def test_append_loss_in_training_loop():
    assert_fires(LOOP_HEAD + """
losses = []
for x, y in loader:
    opt.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss)  # <-
""", "graph_retention", "training_loop")


def test_accumulate_loss_with_plus_equals():
    assert_fires(LOOP_HEAD + """
for epoch in range(3):
    total = 0.0
    for x, y in loader:
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
        total += loss  # <-
    print(total / len(loader))
""", "graph_retention", "training_loop")


def test_accumulate_with_explicit_sum_and_model_output_append():
    hits, src = _hits(LOOP_HEAD + """
running = 0
outputs = {"train": []}
for x, y in loader:
    opt.zero_grad()
    out = model(x)
    loss = criterion(out, y)
    loss.backward()
    opt.step()
    running = running + loss  # <-
    outputs["train"].append(out)  # <-
""", "graph_retention")
    assert [h.line for h in hits] == _marked(src)


@pytest.mark.parametrize("kept", [
    "losses.append(loss.item())", "losses.append(loss.detach())", "losses.append(float(loss))",
    "losses.append(loss.cpu().numpy())", "total += loss.item()", "total = total + loss.detach()",
    "preds.append(out.argmax(1))", "with torch.no_grad():\n        preds.append(model(x))",
])
def test_graph_retention_silent_when_history_is_dropped(kept):
    assert_silent(LOOP_HEAD + f"""
losses, preds, total = [], [], 0.0
for x, y in loader:
    opt.zero_grad()
    out = model(x)
    loss = criterion(out, y)
    loss.backward()
    opt.step()
    {kept}
""")


def test_graph_retention_silent_on_per_step_list_and_summed_loss_backward():
    assert_silent(LOOP_HEAD + """
acc = 0
for i, (x, y) in enumerate(loader):
    parts = []
    for chunk in x.chunk(4):
        parts.append(model(chunk))
    acc = acc + criterion(torch.cat(parts), y)
    if (i + 1) % 4 == 0:
        opt.zero_grad()
        acc.backward()
        opt.step()
        acc = 0
""")


# --- eval_without_no_grad -------------------------------------------------------------------------

def test_model_call_after_eval_without_no_grad():
    assert_fires(LOOP_HEAD + """
def evaluate(net, loader):
    net.eval()
    correct = 0
    for x, y in loader:
        out = net(x)  # <-
        correct += (out.argmax(1) == y).sum().item()
    return correct
""", "eval_without_no_grad", "training_loop")


@pytest.mark.parametrize("wrap", ["with torch.no_grad():", "with torch.inference_mode():"])
def test_eval_under_no_grad_is_silent(wrap):
    assert_silent(LOOP_HEAD + f"""
model.eval()
{wrap}
    out = model(xv)
    acc = (out.argmax(1) == yv).float().mean().item()
""")


def test_eval_in_decorated_function_or_after_train_is_silent():
    assert_silent(LOOP_HEAD + """
@torch.no_grad()
def evaluate(model, xs):
    model.eval()
    return [model(x).argmax(1) for x in xs]


model.eval()
model.train()
out = model(x)
""")


def test_frozen_batchnorm_finetuning_in_eval_mode_is_silent():
    assert_silent(LOOP_HEAD + """
model.eval()  # keep batch-norm statistics frozen while fine-tuning
for x, y in loader:
    opt.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    opt.step()
""")


# --- optimizer_recreated --------------------------------------------------------------------------

@pytest.mark.parametrize("build", [
    "opt = torch.optim.Adam(model.parameters(), lr=1e-3)",
    "opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)",
    "opt = AdamW(model.parameters())",
])
def test_optimizer_recreated_fires_in_the_stepping_loop(build):
    assert_fires("""
from torch import optim
from torch.optim import AdamW
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
criterion = nn.CrossEntropyLoss()
for epoch in range(3):
    for x, y in loader:
        """ + build + """  # <-
        opt.zero_grad()
        criterion(model(x), y).backward()
        opt.step()
""", "optimizer_recreated", "training_loop")


@pytest.mark.parametrize("body", [
    # built once, before the loop
    """opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(3):
    for x, y in loader:
        opt.zero_grad()
        criterion(model(x), y).backward()
        opt.step()""",
    # once per epoch, outside the loop that steps (a restart per epoch, not per step)
    """for epoch in range(3):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for x, y in loader:
        opt.zero_grad()
        criterion(model(x), y).backward()
        opt.step()""",
    # switching optimizer at one step, on a condition
    """opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step, (x, y) in enumerate(loader):
    if step == 1000:
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    opt.zero_grad()
    criterion(model(x), y).backward()
    opt.step()""",
    # an adversarial perturbation's own optimizer, new for every batch
    """opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for x, y in loader:
    delta = torch.zeros_like(x, requires_grad=True)
    attack = torch.optim.SGD([delta], lr=0.01)
    attack.zero_grad()
    (-criterion(model(x + delta), y)).backward()
    attack.step()
    opt.zero_grad()
    criterion(model(x + delta.detach()), y).backward()
    opt.step()""",
])
def test_optimizer_recreated_silent_unless_built_on_every_step(body):
    assert_silent("""
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
criterion = nn.CrossEntropyLoss()
""" + body + "\n")


# --- eval_mode_not_reset --------------------------------------------------------------------------

def test_eval_inside_training_loop_without_train():
    hit = assert_fires(LOOP_HEAD + """
model.train()
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
    model.eval()  # <-
    with torch.no_grad():
        val = criterion(model(xv), yv).item()
""", "eval_mode_not_reset", "training_loop")
    assert "model.train()" in hit.message


@pytest.mark.parametrize("where", ["top", "bottom"])
def test_eval_mode_reset_each_epoch_is_silent(where):
    top = "model.train()" if where == "top" else "pass"
    bottom = "model.train()" if where == "bottom" else "pass"
    assert_silent(LOOP_HEAD + f"""
for epoch in range(10):
    {top}
    for x, y in loader:
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        val = criterion(model(xv), yv).item()
    {bottom}
""")


def test_eval_outside_the_training_loop_is_not_this_rule():
    assert_silent(LOOP_HEAD + """
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
model.eval()
with torch.no_grad():
    print(criterion(model(xv), yv).item())
""")


# --- detached_output ------------------------------------------------------------------------------

def test_detached_model_output_reaches_backward():
    assert_fires(LOOP_HEAD + """
for x, y in loader:
    opt.zero_grad()
    out = model(x)
    pred = out.detach()  # <-
    loss = criterion(pred, y)
    loss.backward()
    opt.step()
""", "detached_output", "training_loop")


def test_detach_in_a_multiline_chain_points_at_the_detach():
    assert_fires(LOOP_HEAD + """
for x, y in loader:
    opt.zero_grad()
    pred = (model(x)
            .squeeze(1)
            .detach()  # <-
            .requires_grad_())
    loss = criterion(pred, y)
    loss.backward()
    opt.step()
""", "detached_output", "training_loop")


def test_dot_data_on_model_output_reaches_backward():
    assert_fires(LOOP_HEAD + """
for x, y in loader:
    opt.zero_grad()
    loss = F.mse_loss(model(x).data.squeeze(1), y)  # <-
    loss.backward()
    opt.step()
""", "detached_output", "training_loop")


def test_detach_of_teacher_or_generator_output_is_silent():
    assert_silent("""
student = nn.Linear(4, 3)
teacher = nn.Linear(4, 3)
G, D = nn.Linear(2, 4), nn.Linear(4, 1)
opt = torch.optim.Adam(student.parameters())
for x, y in loader:
    opt.zero_grad()
    soft = teacher(x).detach()
    kd = F.kl_div(F.log_softmax(student(x), 1), F.softmax(soft, 1))
    loss = kd + F.cross_entropy(student(x), y)
    loss.backward()
    opt.step()
    d_loss = F.binary_cross_entropy_with_logits(D(G(z).detach()), zeros)
    d_loss.backward()
""")


def test_frozen_backbone_and_logging_detach_are_silent():
    assert_silent("""
backbone = nn.Linear(4, 8)
head = nn.Linear(8, 2)
opt = torch.optim.SGD(head.parameters(), lr=0.1)
for x, y in loader:
    opt.zero_grad()
    feats = backbone(x).detach()
    loss = F.cross_entropy(head(feats), y)
    loss.backward()
    opt.step()
    log = loss.detach().item()
""")


# --- model names, inference, robustness -----------------------------------------------------------

RETAIN_UNSEEN_MODEL = """
net = build_model(cfg)
for x, y in loader:
    opt.zero_grad()
    loss = compute(x, y)
    loss.backward()
    opt.step()
    outputs.append(net(x))  # <-
"""


def test_model_names_from_capture_are_used():
    assert_silent(RETAIN_UNSEEN_MODEL)  # nothing says net is a model
    assert_fires(RETAIN_UNSEEN_MODEL, "graph_retention", "training_loop", model_names=["net"])


def test_model_inferred_from_a_call_reaching_the_loss():
    assert_fires("""
net = build_model(cfg)
for x, y in loader:
    opt.zero_grad()
    pred = net(x).detach()  # <-
    loss = crit(pred, y)
    loss.backward()
    opt.step()
""", "detached_output", "training_loop")


def test_lint_file_and_syntax_errors(tmp_path):
    bad = tmp_path / "cell.py"
    bad.write_text("%timeit model(x)\nfor x in y:\n")
    assert lint_file(str(bad)) == []
    assert lint_source("def f(:\n", "x.py") == []
    good = tmp_path / "train.py"
    good.write_text(_src(LOOP_HEAD + "for x, y in d:\n    criterion(model(x), y).backward()\n"
                         "    opt.step()\n"))
    hits = lint_file(str(good))
    assert [(h.rule, h.file, h.line) for h in hits] == [("missing_zero_grad", str(good), 9)]


def test_lint_module_does_not_import_torch():
    tree = ast.parse(Path(lint_source.__code__.co_filename).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names} | {n.module for n in ast.walk(tree)
                                     if isinstance(n, ast.ImportFrom)}
    assert not any(m and m.split(".")[0] in ("torch", "tensorflow") for m in imported)


# --- the scenario scripts -------------------------------------------------------------------------

def _line_of(path: Path, needle: str) -> int:
    lines = [i for i, text in enumerate(path.read_text().splitlines(), 1) if needle in text]
    assert len(lines) == 1, needle
    return lines[0]


@pytest.mark.parametrize("names", [(), ("model",)])
def test_scenario_detached_output(names):
    path = SCENARIOS / "lnd_detached_output.py"
    hits = lint_file(str(path), model_names=names)
    assert [(h.rule, h.root_cause, h.line) for h in hits] == [
        ("detached_output", "training_loop", _line_of(path, "model(xb).detach()"))]


def test_scenario_retained_graph():
    path = SCENARIOS / "mem_retained_graph.py"
    hits = lint_file(str(path), model_names=["model"])
    assert [(h.rule, h.root_cause, h.line) for h in hits] == [
        ("graph_retention", "training_loop", _line_of(path, "history.append(model(x))"))]
    assert [(h.rule, h.line) for h in lint_file(str(path))] == [(hits[0].rule, hits[0].line)]


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("healthy_*.py")), ids=lambda p: p.name)
def test_healthy_scenarios_are_clean(path):
    assert lint_file(str(path)) == []
    assert lint_file(str(path), model_names=["model"]) == []


QUIET = ["cws_imbalanced_majority", "cws_minority_f1", "gi_log_of_zero", "gi_lr_too_high",
         "lnd_vanishing_sigmoid", "lnd_lr_too_low", "lnd_random_labels", "mem_oom",
         "ovf_auto_val_regression", "ovf_small_data_big_mlp", "perf_python_collate",
         "perf_slow_dataset"]


@pytest.mark.parametrize("name", QUIET)
def test_scenarios_whose_fault_is_not_a_code_pitfall_are_quiet(name):
    assert lint_file(str(SCENARIOS / f"{name}.py")) == []
    assert lint_file(str(SCENARIOS / f"{name}.py"), model_names=["model"]) == []


# --- which training loop a hit belongs to -----------------------------------------------------

TWO_LOOPS = """
model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def pretrain():
    for x, y in loader:                                  # first loop: lines 6-9
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()


def evaluate():
    for x, y in loader:                                  # no backward: not a training loop
        model.eval()


for epoch in range(2):                                   # outer loop: lines 17-22
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    model.eval()
"""


def test_hits_carry_the_span_of_their_outermost_training_loop():
    hits, _ = _hits(TWO_LOOPS)
    at = len(HEAD.splitlines()) + 1  # TWO_LOOPS starts with an empty line
    by_rule = {(h.rule, h.line - at): (h.loop[0] - at, h.loop[1] - at) if h.loop else None
               for h in hits}
    # both loops lack zero_grad(); the nested one reports the outer loop's span
    assert by_rule == {("missing_zero_grad", 8): (6, 9), ("missing_zero_grad", 20): (17, 22),
                       # eval() in the epoch loop belongs to it
                       ("eval_mode_not_reset", 22): (17, 22)}


@pytest.mark.parametrize("recorded, kept", [
    ({"train.py": [20, 21]}, {("missing_zero_grad", 20), ("eval_mode_not_reset", 22)}),
    ({"train.py": [8]}, {("missing_zero_grad", 8)}),
    # nothing recorded in this file (the loop that ran lives elsewhere), or nothing at all
    ({"other.py": [3]}, {("missing_zero_grad", 8), ("missing_zero_grad", 20),
                         ("eval_mode_not_reset", 22)}),
    ({}, {("missing_zero_grad", 8), ("missing_zero_grad", 20), ("eval_mode_not_reset", 22)}),
])
def test_probes_see_only_hits_from_training_loops_that_ran(recorded, kept):
    from model_debugger.probes import ProbeContext
    from model_debugger.probes._lint import lint_hits
    from model_debugger.records import Classification, Run

    at = len(HEAD.splitlines()) + 1
    refs = [{"t": "ref", "kind": kind, "file": f, "line": line + at}
            for f, lines in recorded.items() for line in lines for kind in ("backward", "step")]
    ctx = ProbeContext(run=Run(refs), signals={}, source_files={"train.py": _src(TWO_LOOPS)},
                       classification=Classification("gradient_instability", ()))
    got = {(h.rule, h.line - at) for rule in ("missing_zero_grad", "eval_mode_not_reset")
           for h in lint_hits(ctx, rule)}
    assert got == kept
