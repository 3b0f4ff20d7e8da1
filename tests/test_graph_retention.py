"""graph_retention on tensors kept in a trainer object's history (its own file: the trainer's
evaluation outside ``no_grad`` is linted, which would show in every probe test of a shared file).
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import model_debugger
from model_debugger import probing
from model_debugger.probes import run_probes
from model_debugger.probing import build_context
from model_debugger.records import Run

HERE = Path(__file__).read_text().splitlines()


def line_of(tag: str) -> int:
    return next(i for i, text in enumerate(HERE, 1) if f"# <{tag}>" in text)


class _Trainer:
    """A trainer object whose history keeps tensors: the loop's frames hold only ``self``."""

    def __init__(self, keep: str):
        torch.manual_seed(0)
        self.X, self.y = torch.randn(640, 8), torch.randint(0, 2, (640,))
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.05)
        self.keep = keep
        self.history = {"train_loss": [], "val_loss": [], "epoch_loss": []}

    def evaluate(self):
        self.net.eval()
        return F.cross_entropy(self.net(self.X[:128]), self.y[:128])  # <eval-graph>

    def fit(self, epochs: int):
        for _epoch in range(epochs):
            self.net.train()
            for i in range(0, 640, 32):
                self.opt.zero_grad()
                loss = F.cross_entropy(self.net(self.X[i:i + 32]), self.y[i:i + 32])
                loss.backward()
                self.opt.step()
                if self.keep == "train":
                    self.history["train_loss"].append(loss)  # <kept-train-loss>
            if self.keep == "epoch":
                self.history["epoch_loss"].append(loss)  # <kept-epoch-loss>
            self.history["val_loss"].append(  # <kept-val-loss>
                self.evaluate() if self.keep == "val" else self.evaluate().item())


@pytest.mark.parametrize("keep,tag", [("val", "kept-val-loss"), ("train", "kept-train-loss"),
                                      ("epoch", "kept-epoch-loss")])
def test_graphs_kept_in_a_trainer_objects_history_are_found_from_the_record(tmp_path, keep, tag):
    """``self.history['val_loss']`` gains an evaluation loss with its graph every epoch (made
    outside no_grad: located where it is kept, the evaluation named too), or the training loss
    every step or every epoch (located where it is appended; the evaluation outside no_grad in
    the file made none of it). Neither is in the namespace Isolate sees."""
    path = str(tmp_path / "record.jsonl")
    with model_debugger.capture(path) as rec:
        _Trainer(keep).fit(8)
    run = Run.load(path)
    ctx = build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 600.0)
    found = [f for f in run_probes(ctx, ["graph_retention"]).findings if f.confirmed]
    assert found, run_probes(ctx, ["graph_retention"]).findings
    f = found[0]
    assert (f.check, f.root_cause) == ("graph_retention", "training_loop")
    assert f.location["line"] == line_of(tag)
    assert f.evidence["variable"] == f"self.history['{keep}_loss']"
    assert f.evidence["tensors"] >= 3
    assert (f.evidence.get("made_at") or {}).get("line") == (
        line_of("eval-graph") if keep == "val" else None)


class _Averaging:
    """A callback-like object of the user's that keeps a copy of the weights every step."""

    def __init__(self):
        self.snapshots = []

    def on_batch_end(self, weights):
        self.snapshots.append([w.copy() for w in weights])


def test_a_users_object_in_a_list_keeping_weight_copies_is_a_held_container(tmp_path):
    import numpy as np

    from model_debugger.capture.held import _candidates, held
    from model_debugger.probes.graph_retention import _growing_line

    avg = _Averaging()
    for _ in range(8):
        avg.on_batch_end([np.zeros((256, 256)), np.zeros(256)])
    found = dict(_candidates("callbacks", [avg, "x"]))
    assert "callbacks[0].snapshots" in found
    size, _ = held(found["callbacks[0].snapshots"])
    assert size == 8 * (256 * 256 + 256) * 8  # the lists inside count
    source = open(__file__, encoding="utf-8").read()
    ctx = types.SimpleNamespace(source_files={__file__: source})
    line = _growing_line(ctx, "callbacks[0].snapshots")["line"]
    assert source.splitlines()[line - 1].strip().startswith("self.snapshots.append(")


def test_objects_that_list_each_other_are_looked_at_one_level_deep():
    from model_debugger.capture.held import _candidates

    a, b = _Averaging(), _Averaging()
    a.peers, b.peers = [b], [a]  # a cycle: never followed past the objects' own containers
    assert sorted(n for n, _ in _candidates("nodes", [a, b])) == [
        "nodes", "nodes[0].peers", "nodes[1].peers"]


def _attach_monitor(model, names):
    log = {name: [] for name in names}

    def make_hook(name):
        def hook(module, inputs, out):
            if module.training:
                log[name].append(out)  # <hooked-append>
        return hook

    for name in names:
        getattr(model, name).register_forward_hook(make_hook(name))
    return log


def _six_epochs(net):
    """The user's loop: six epochs of SGD over 640 random rows of 8 features, two classes."""
    X, y = torch.randn(640, 8), torch.randint(0, 2, (640,))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for _epoch in range(6):
        for i in range(0, 640, 32):
            opt.zero_grad()
            F.cross_entropy(net(X[i:i + 32]), y[i:i + 32]).backward()
            opt.step()


def _train_monitored():
    torch.manual_seed(1)
    net = nn.Sequential()
    net.add_module("hidden", nn.Linear(8, 64))
    net.add_module("act", nn.ReLU())
    net.add_module("out", nn.Linear(64, 2))
    activity = _attach_monitor(net, ["act"])
    _six_epochs(net)
    return activity


def test_a_container_a_helper_made_and_a_hook_fills_is_located_at_the_hooks_append(tmp_path):
    """``activity = _attach_monitor(net, ...)`` returns ``log``, which a forward hook (a closure)
    appends each training output to, graph included: seen as ``activity['act']`` in the
    loop's frame, located at the hook's append."""
    path = str(tmp_path / "record.jsonl")
    with model_debugger.capture(path) as rec:
        _train_monitored()
    run = Run.load(path)
    ctx = build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 600.0)
    found = [f for f in run_probes(ctx, ["graph_retention"]).findings if f.confirmed]
    assert found and found[0].evidence["variable"] == "activity['act']"
    assert found[0].location["line"] == line_of("hooked-append")


class _Block(nn.Module):
    """A block of the user's that keeps each call's activation "for inspection"."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 64)
        self.maps = []

    def forward(self, x):
        h = torch.relu(self.lin(x))
        self.maps.append(h)  # <block-keeps>
        return h


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = _Block()
        self.out = nn.Linear(64, 2)

    def forward(self, x):
        return self.out(self.block(x))


def _train_inspected():
    torch.manual_seed(2)
    _six_epochs(_Net())


def test_a_container_a_nested_layer_of_the_model_fills_is_looked_at(tmp_path):
    """``net.block.maps`` gains each call's activation, graph included: two levels below any
    frame's variable, it is found among the model's own parts and located at the append in
    the block's ``forward``."""
    path = str(tmp_path / "record.jsonl")
    with model_debugger.capture(path) as rec:
        _train_inspected()
    run = Run.load(path)
    held = [c for e in run.of("held") for c in e["containers"] if c["scope"] == "model"]
    assert held and held[-1]["name"] == "model.block.maps" and held[-1]["func"] == "_Block"
    ctx = build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 600.0)
    found = [f for f in run_probes(ctx, ["graph_retention"]).findings if f.confirmed]
    assert found and found[0].evidence["variable"] == "model.block.maps"
    assert found[0].location["line"] == line_of("block-keeps")


class _DecodingSet(torch.utils.data.Dataset):
    """A dataset that caches each decoded sample under its index: the sampler's indices are
    0-d tensors, which hash by identity, so the cache never hits and grows every step."""

    def __init__(self, n: int):
        self.codes = torch.randint(0, 255, (n, 8))
        self.labels = torch.randint(0, 2, (n,))
        self.decoded = {}

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        if idx not in self.decoded:
            self.decoded[idx] = self.codes[idx].float().repeat(4096) / 255  # <decoded-cache>
        return self.decoded[idx][:8], self.labels[idx]


def _train_decoding():
    torch.manual_seed(0)
    data = _DecodingSet(512)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for _epoch in range(6):
        for order in torch.randperm(len(data)).split(32):
            rows = [data[i] for i in order]  # (0-d tensor indices)
            xb, yb = torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])
            opt.zero_grad()
            F.cross_entropy(net(xb), yb).backward()
            opt.step()


def test_a_cache_the_dataset_fills_is_the_datas_where_it_grows(tmp_path, monkeypatch):
    """A cache of plain tensors that a dataset adds to for every sample it makes: the memory
    grows in the data pipeline, so the root cause is ``data``, located at the line that adds
    to it (a cache the loop fills stays ``training_loop``)."""
    from model_debugger.capture import held as held_mod
    from model_debugger.capture import torch_steps

    for module in (held_mod, torch_steps):  # a look every 10 steps, whatever it costs
        monkeypatch.setattr(module, "HELD_EVERY", 10)
    monkeypatch.setattr(held_mod, "HELD_BUDGET", 1.0)
    path = str(tmp_path / "record.jsonl")
    rec = model_debugger.capture(path)
    with rec:
        _train_decoding()
    run = Run.load(path)
    ctx = build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 60.0)
    ctx.classification = types.SimpleNamespace(primary="memory_issue", secondary=[],
                                               evidence=[])
    assert len(run.of("held")) >= 3
    ctx.signals = {**ctx.signals, "held_share": 1.0}  # (RSS in a test process reuses freed memory)
    [f] = run_probes(ctx, ["graph_retention"]).findings
    assert (f.root_cause, f.confirmed) == ("data", True), f
    assert f.location["line"] == line_of("decoded-cache"), f.location


class _HandNorm(nn.Module):
    """Running statistics written by hand; ``detached`` decides whether they keep a graph."""

    def __init__(self, dim: int, detached: bool):
        super().__init__()
        self.detached = detached
        self.register_buffer("running_mean", torch.zeros(dim))

    def forward(self, x):
        if not self.training:
            return x - self.running_mean
        mean = x.mean(dim=0)
        kept = mean.detach() if self.detached else mean
        self.running_mean = 0.9 * self.running_mean + 0.1 * kept  # <hand-norm>
        return x - mean


def _train_hand_norm(detached: bool):
    torch.manual_seed(0)
    X, y = torch.randn(320, 8), torch.randint(0, 2, (320,))
    net = nn.Sequential(nn.Linear(8, 16), _HandNorm(16, detached), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for i in range(0, 320, 32):
        opt.zero_grad()
        F.cross_entropy(net(X[i:i + 32]), y[i:i + 32]).backward()
        opt.step()


class _AuxLoss(nn.Module):
    """A layer keeping its step's auxiliary loss as an attribute (read by the loop): one
    step's graph, on purpose; not a buffer."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.aux = torch.zeros(())

    def forward(self, x):
        out = self.proj(x)
        self.aux = out.pow(2).mean()
        return out


def test_a_plain_attribute_holding_one_steps_graph_is_not_a_buffer_kept(tmp_path):
    path = str(tmp_path / "record.jsonl")
    rec = model_debugger.capture(path)
    with rec:
        torch.manual_seed(0)
        X, y = torch.randn(320, 8), torch.randint(0, 2, (320,))
        aux = _AuxLoss()
        net = nn.Sequential(nn.Linear(8, 16), aux, nn.ReLU(), nn.Linear(16, 2))
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        for i in range(0, 320, 32):
            opt.zero_grad()
            (F.cross_entropy(net(X[i:i + 32]), y[i:i + 32]) + 0.01 * aux.aux).backward()
            opt.step()
    run = Run.load(path)
    ctx = build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 60.0)
    assert not [f for f in run_probes(ctx, ["graph_retention"]).findings
                if f.evidence.get("state")]


@pytest.mark.parametrize("detached", [False, True])
def test_a_buffer_assigned_from_the_graph_is_the_layers_state_keeping_it(tmp_path, detached):
    """A hand-written norm layer assigns its running mean from the batch's graph: the buffer
    carries autograd history, each step's built on the last. Read on the live model, decisive,
    ``architecture``, located at the assignment; detached, nothing is kept."""
    path = str(tmp_path / "record.jsonl")
    rec = model_debugger.capture(path)
    with rec:
        _train_hand_norm(detached)
    run = Run.load(path)
    ctx = build_context(run, rec.keeper, probing.user_sources(run, [__file__]), 60.0)
    findings = [f for f in run_probes(ctx, ["graph_retention"]).findings if f.confirmed]
    if detached:
        assert findings == []
        return
    [f] = findings
    assert (f.root_cause, f.evidence["state"], f.evidence["module"]) == \
        ("architecture", ["running_mean"], "1")
    assert f.location["line"] == line_of("hand-norm"), f.location


@pytest.mark.parametrize("kept", [False, True])
def test_outputs_are_looked_at_steps_later_not_forwards_later(tmp_path, kept):
    """A step that calls the model five times (a consistency penalty on several forwards) still
    holds its first outputs in its loss's graph when the fifth is made: no prediction is kept
    past its step unless the loop keeps one (then every step's is)."""
    torch.manual_seed(0)
    X, y = torch.randn(640, 8), torch.randint(0, 2, (640,))
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    preds = []
    path = str(tmp_path / "record.jsonl")
    with model_debugger.capture(path):
        for i in range(0, 640, 32):
            xb = X[i:i + 32]
            views = [net(xb + 0.01 * k) for k in range(4)]
            loss = F.cross_entropy(net(xb), y[i:i + 32]) + \
                0.1 * torch.stack(views).var(0).mean()
            if kept:
                preds.append(views[0])
            opt.zero_grad()
            loss.backward()
            opt.step()
    kept_event = Run.load(path).first("graphs_kept")
    assert kept_event["outputs_checked"] >= 50, kept_event
    assert (kept_event["outputs_alive"] >= 16) is kept, kept_event
