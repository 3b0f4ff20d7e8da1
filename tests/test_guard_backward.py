"""A finite loss whose gradient is not: an operation at the edge of its domain, found by a re-run.

A square root of squared distances that are exactly 0 (a pairwise-distance loss's diagonal, a
distance from a prototype that starts at a training row) hands back ``inf * 0 = NaN`` in backward while every forward value
is finite, from the first step, at any learning rate. ``gradient_flow`` names that as a
hypothesis; the ``guard_backward`` re-run (each operation that turns finite gradients into
non-finite ones hands back 0 instead) must remove the symptom, and report which operation and
line made it: the loss's code (``training_loop``) or a layer's forward (``architecture``). Its
fixed twin (an epsilon under the root) stays healthy, and the intervention leaves an overflow
of huge values alone (that is a rate's doing, not an operation's domain).
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from model_debugger._interventions_torch import _moderate
from model_debugger.artifacts import CellArtifact, Intervention, Version
from model_debugger.interventions import INTERVENTIONS
from model_debugger.records import Run

LOSS = textwrap.dedent("""\
    import torch
    from torch import nn
    torch.manual_seed(0)
    X = torch.randn(512, 8)
    y = (X[:, :4].sum(1) > 0).long()
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)


    def spread(emb):
        diff = emb[:, None] - emb[None]
        return (diff ** 2).sum(-1){root}


    def contrastive(emb, labels):
        dist = spread(emb)
        same = (labels[:, None] == labels[None]).float()
        return (same * dist).mean() + (1 - same).mul(torch.relu(2.0 - dist)).mean()


    finite = []
    for epoch in range(6):
        for i in range(0, 512, 64):
            opt.zero_grad()
            loss = contrastive(model(X[i:i + 64]), y[i:i + 64])
            loss.backward()
            finite.append(all(bool(p.grad.isfinite().all()) for p in model.parameters()))
            opt.step()
            print(f"loss {{loss.item():.4f}}")
""")
BUGGY = LOSS.format(root=".sqrt()")
FIXED = LOSS.format(root=".clamp_min(1e-12).sqrt()")
ROOT_LINE = 1 + BUGGY.splitlines().index("    return (diff ** 2).sum(-1).sqrt()")

LAYER = textwrap.dedent("""\
    import torch
    from torch import nn
    torch.manual_seed(0)
    X = torch.randn(512, 8)
    y = (X[:, :4].sum(1) > 0).long()


    class Prototypes(nn.Module):
        def __init__(self, start):
            super().__init__()
            self.centres = nn.Parameter(start.clone())

        def forward(self, x):
            dist = ((x[:, None] - self.centres[None]) ** 2).sum(-1).sqrt()
            return torch.exp(-dist)


    model = nn.Sequential(Prototypes(X[:16]), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(6):
        for i in range(0, 512, 64):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(X[i:i + 64]), y[i:i + 64])
            loss.backward()
            opt.step()
            print(f"loss {loss.item():.4f}")
""")
LAYER_LINE = 1 + LAYER.splitlines().index(
    "        dist = ((x[:, None] - self.centres[None]) ** 2).sum(-1).sqrt()")


def _cell_run(tmp_path, code: str, change=None, tag: str = "r"):
    ns: dict = {}
    art = CellArtifact(ns, code)
    version = Version("reproduced", str(tmp_path / "copy.py"))
    record = str(tmp_path / f"{tag}.jsonl")
    cap = art.run(version, 0, record, intervention=change)
    assert cap.error is None, cap.error
    return ns, Run.load(record)


def test_the_guard_removes_the_nan_and_reports_the_operation_and_its_line(tmp_path):
    ns, run = _cell_run(tmp_path, BUGGY, tag="plain")
    assert not ns["finite"][0] and not run.of("intervened")  # NaN from the first step
    ns, run = _cell_run(tmp_path, BUGGY, Intervention("guard_backward", {"from_step": 0}),
                        tag="guarded")
    assert all(ns["finite"]), ns["finite"]
    acted = run.of("intervened")
    assert acted and acted[0]["op"] == "SqrtBackward0", acted
    assert acted[0]["line"] == ROOT_LINE and acted[0]["func"] == "spread", acted[0]
    assert [f["func"] for f in acted[0]["frames"]][-2:] == ["contrastive", "spread"]
    assert not torch.is_anomaly_enabled()  # the tracing is off again after the run
    ns, run = _cell_run(tmp_path, BUGGY, tag="again")  # removed: the code as written again
    assert not ns["finite"][0] and not run.of("intervened")


def test_the_guard_leaves_a_healthy_run_and_an_overflow_alone(tmp_path):
    ns, run = _cell_run(tmp_path, FIXED, Intervention("guard_backward", {"from_step": 0}))
    assert all(ns["finite"]) and not run.of("intervened")
    # a product of two huge gradients overflowing is no operation's domain: not guarded
    assert _moderate([torch.tensor([1e3, -2.0]), None], torch)
    assert not _moderate([torch.tensor([3e19])], torch)
    assert not _moderate([torch.tensor([300.0], dtype=torch.float16)], torch)
    with pytest.raises(ValueError, match="from_step as an int"):
        INTERVENTIONS["guard_backward"].validate({"from_step": -1})


def _diagnosed(tmp_path, code: str) -> dict:
    from model_debugger.diagnose import diagnose_script

    script = tmp_path / "train.py"
    script.write_text(code)
    with open(tmp_path / "out.txt", "w") as sink:
        session = diagnose_script(str(script), seed=0, root=str(tmp_path / "s"), stdout=sink,
                                  probe_seconds=30, intervene_seconds=90)
    return json.loads(json.dumps(session.report(), default=str))


@pytest.mark.slow
@pytest.mark.parametrize("code,root_cause,line", [
    (BUGGY, "training_loop", ROOT_LINE), (LAYER, "architecture", LAYER_LINE)])
def test_a_nan_gradient_of_a_finite_loss_is_confirmed_at_the_operation(tmp_path, code,
                                                                         root_cause, line):
    report = _diagnosed(tmp_path, code)
    assert report["classification"]["primary"] == "gradient_instability"
    top = report["findings"][0]
    assert top["check"] == "gradient_flow" and top["confirmed"], top
    assert top["root_cause"] == root_cause and top["location"]["line"] == line, top
    assert top["evidence"]["unsafe_op"] == "SqrtBackward0"
    assert top["evidence"]["intervention"]["id"] == "guard_backward"
    assert top["evidence"]["intervention"]["symptom_gone"], top["evidence"]["intervention"]


@pytest.mark.slow
def test_the_fixed_twin_is_healthy(tmp_path):
    report = _diagnosed(tmp_path, FIXED)
    assert report["classification"]["primary"] == "healthy", report["classification"]


SPARSE = textwrap.dedent("""\
    import torch
    from torch import nn
    torch.manual_seed(0)
    emb = nn.Embedding(100, 8, sparse=True)
    head = nn.Linear(8, 2)
    opt = torch.optim.SGD([*emb.parameters(), *head.parameters()], lr=0.1)
    ids, y = torch.randint(0, 100, (64, 5)), torch.randint(0, 2, (64,))
    done = 0
    for _ in range(4):
        opt.zero_grad()
        nn.functional.cross_entropy(head(emb(ids).mean(1)), y).backward()
        opt.step()
        done += 1
""")


def test_the_guard_never_breaks_a_backward_with_sparse_gradients(tmp_path):
    ns, run = _cell_run(tmp_path, SPARSE, Intervention("guard_backward", {"from_step": 2}))
    assert ns["done"] == 4 and not run.of("intervened")
    assert not torch.is_anomaly_enabled()
