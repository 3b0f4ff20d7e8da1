"""In-process safety of ``capture()``: recorders stack, nothing stays patched, memory is bounded.

Real PyTorch training on the CPU (and a real Keras ``fit``): two recorders exited in either
order restore every patched attribute (``is`` the original) and ``sys.stdout``; a Keras capture
leaves the class dicts as they were; the model is collected once the Recorder goes, even when
something kept a patched function or ``sys.stdout`` from inside the block; the initial-weight
copy spills to disk above ``MODEL_DEBUGGER_SPILL_MB`` and Isolate still restarts from it; a model
with 5000 parameter tensors records a few KB per step and still names the layer of a NaN.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import model_debugger
from model_debugger import probing
from model_debugger.capture import patches
from model_debugger.probes import run_probes
from model_debugger.probing import build_context
from model_debugger.records import Run


def _patched_attributes():
    """Every attribute the torch instrument patches, with its current value."""
    from torch.optim import optimizer as optim_mod

    owners = [(torch.Tensor, "backward"), (torch.autograd, "backward"),
              (optim_mod.Optimizer, "__init__"), (DataLoader, "__iter__"),
              (optim_mod.Optimizer, "zero_grad"), (nn.Module, "zero_grad")]
    owners += [(F, n) for n in ("cross_entropy", "mse_loss", "nll_loss", "l1_loss",
                                "binary_cross_entropy", "binary_cross_entropy_with_logits")]
    return {(o, n): o.__dict__[n] for o, n in owners if n in o.__dict__}


def _train(steps: int = 4, say: bool = True):
    torch.manual_seed(0)
    X, y = torch.randn(32, 4), torch.randn(32, 1)
    net = nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for i, (xb, yb) in enumerate(DataLoader(TensorDataset(X, y), batch_size=8)):
        if i >= steps:
            break
        opt.zero_grad()
        loss = F.mse_loss(net(xb), yb)
        loss.backward()
        opt.step()
        if say:
            print(f"step {i}: probe_metric={loss.item():.4f}")
    return net


@pytest.mark.parametrize("outer_first", [True, False])
def test_recorders_exited_out_of_order_restore_everything(outer_first):
    before = _patched_attributes()
    stdout, meta_path = sys.stdout, list(sys.meta_path)
    outer, inner = model_debugger.capture(), model_debugger.capture()
    outer.__enter__()
    inner.__enter__()
    _train()
    first, second = (outer, inner) if outer_first else (inner, outer)
    first.__exit__(None, None, None)
    # the one left still records, and is still patched in
    steps_left = second.step
    _train(steps=2)
    assert second.step == steps_left + 2
    second.__exit__(None, None, None)

    after = _patched_attributes()
    assert after.keys() == before.keys()
    assert all(after[k] is before[k] for k in before), \
        [f"{o.__name__}.{n}" for (o, n) in before if after[(o, n)] is not before[(o, n)]]
    assert sys.stdout is stdout
    assert sys.meta_path == meta_path
    assert patches.patched() == []
    for rec in (outer, inner):
        metrics = [e for e in rec.events if e["t"] == "metric" and e["name"] == "probe_metric"]
        assert metrics, "printed metrics reached both recorders"
    assert [e for e in inner.events if e["t"] == "model"]


def test_a_stream_or_function_kept_from_inside_the_block_holds_nothing():
    """Like torch._dynamo (which snapshots Tensor methods) or ``from sys import stdout``."""
    kept = {}
    with model_debugger.capture() as rec:
        net = _train()
        kept["backward"] = torch.Tensor.backward
        kept["stdout"] = sys.stdout
    ref = weakref.ref(net)
    del net
    gc.collect()
    assert ref() is not None  # the Recorder kept after its block keeps it for Isolate
    assert rec.keeper is not None and rec.keeper.model is ref()
    rec.release()
    gc.collect()
    assert ref() is None, "the model outlived the capture"
    # what was kept still works: a pass-through, not a recorder
    x = torch.ones(2, requires_grad=True)
    kept["backward"](x.sum())
    assert x.grad.tolist() == [1.0, 1.0]
    kept["stdout"].write("")


def _captured_in_a_function(kept: list):
    with model_debugger.capture() as rec:
        net = _train()
        kept.append(torch.Tensor.backward)
        kept.append(sys.stdout)
    return weakref.ref(net), rec


def test_model_collected_when_the_recorder_goes():
    # (Python 3.11: a frame whose locals the capture read keeps a snapshot of them until the
    # function returns, so the block runs in a function of its own here)
    kept: list = []
    ref, rec = _captured_in_a_function(kept)
    assert ref() is not None
    del rec
    gc.collect()
    assert ref() is None, "the model outlived the Recorder"


def test_initial_weights_spill_to_disk_and_probes_restart_from_them(tmp_path, monkeypatch):
    monkeypatch.setenv("MODEL_DEBUGGER_SPILL_MB", "0.001")  # ~1 KB: this small model spills
    torch.manual_seed(2)
    X = torch.randn(256, 8)
    y = (X[:, 0] > 0).long()
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    nn.init.constant_(net[0].bias, -50.0)  # dead at initialisation
    start = {k: v.clone() for k, v in net.state_dict().items()}
    path = str(tmp_path / "record.jsonl")
    with model_debugger.capture(path) as rec:
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        for _ in range(3):
            for i in range(0, 256, 32):
                opt.zero_grad()
                F.cross_entropy(net(X[i:i + 32]), y[i:i + 32]).backward()
                opt.step()
    keeper = rec.keeper
    spill = keeper.spill_path
    assert spill and os.path.exists(spill)
    assert os.path.getsize(spill) >= sum(v.numel() * 4 for v in start.values())
    assert not keeper._initial_state  # nothing of the copy in RAM
    assert not torch.equal(net[2].bias, start["2.bias"])  # training moved the weights
    loaded = keeper.initial_state
    assert list(loaded) == list(start)
    assert all(torch.equal(loaded[k], start[k]) for k in start)

    run = Run.load(path)
    ctx = build_context(run, keeper, probing.user_sources(run, [__file__]), 300.0)
    fresh = ctx.trainer.fresh_model()
    assert all(torch.equal(fresh.state_dict()[k], start[k]) for k in start)
    findings = run_probes(ctx, ["dead_units"]).findings
    dead = [f for f in findings if f.check == "dead_units" and f.confirmed]
    assert dead, findings
    assert dead[0].evidence["at_init"]["1"] == 1.0  # the ReLU, measured on the spilled weights
    rec.release()
    assert not os.path.exists(spill)


class ManyTensors(nn.Module):
    """2500 two-by-two linear layers: 5000 parameter tensors."""

    def __init__(self, n: int = 2500):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(n))

    def forward(self, x):
        return torch.stack([layer(x) for layer in self.layers]).sum(0)


def test_thousands_of_tensors_record_a_few_kb_per_step_and_still_locate_a_nan(tmp_path):
    torch.manual_seed(0)
    many = ManyTensors()
    assert len(list(many.parameters())) == 5000
    opt = torch.optim.SGD(many.parameters(), lr=1e-3)
    poisoned = many.layers[1777].weight
    path = tmp_path / "record.jsonl"
    steps = 50
    with model_debugger.capture(str(path), norm_every=1):
        for i in range(steps):
            x, y = torch.randn(8, 2), torch.randn(8, 2)
            loss = F.mse_loss(many(x), y)
            opt.zero_grad()
            if i == steps - 1:
                poisoned.register_hook(lambda g: g * float("nan"))
            loss.backward()
            opt.step()
    lines = path.read_text().splitlines()
    step_bytes = [len(line) + 1 for line in lines if json.loads(line)["t"] == "step"]
    assert len(step_bytes) >= steps - 1
    assert max(step_bytes) <= 10_000, max(step_bytes)
    run = Run.load(str(path))
    bad = run.first("nonfinite")
    assert bad is not None and bad["what"] == "grad" and bad["module"] == "layers.1777"
    assert all(isinstance(s.get("gn"), float) for s in run.steps[:steps - 2])
    names, norms = run.module_norms()
    assert len(names) == 2500 and names[0] == "layers.0" and names[-1] == "layers.2499"
    assert (~torch.isnan(torch.tensor(norms))).sum(0).min() >= 1  # every module measured


def test_keras_capture_leaves_the_classes_as_they_were(monkeypatch):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv("MODEL_DEBUGGER_SPILL_MB", "0")  # the Keras copy spills too
    keras = pytest.importorskip("keras")
    import numpy as np
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    from keras.src.layers.layer import Layer
    from keras.src.optimizers.base_optimizer import BaseOptimizer
    from keras.src.trainers.trainer import Trainer
    from tensorflow.python.eager import backprop

    classes = [keras.Model, TensorFlowTrainer, Trainer, Layer, BaseOptimizer,
               keras.losses.Loss, backprop.GradientTape]
    before = [dict(vars(c)) for c in classes]
    with model_debugger.capture() as rec:
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        start = [w.copy() for w in model.get_weights()]
        model.compile(optimizer="sgd", loss="mse")
        model.fit(np.ones((16, 4)), np.ones((16, 1)), epochs=1, batch_size=8, verbose=0)
    spill = rec.keeper.spill_path
    assert spill and os.path.exists(spill)
    assert not np.array_equal(model.get_weights()[0], start[0])
    assert all(np.array_equal(a, b) for a, b in zip(rec.keeper.initial_state, start))
    from model_debugger.trainers import trainer_for

    fresh = trainer_for(rec.keeper)
    assert fresh.initial_state is not None
    rec.release()
    assert not os.path.exists(spill)
    for cls, was in zip(classes, before):
        now = dict(vars(cls))
        assert now.keys() == was.keys(), (cls.__name__, now.keys() ^ was.keys())
        changed = [k for k in was if now[k] is not was[k]]
        assert not changed, (cls.__name__, changed)


def _train_small(path: str):
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    start = {k: v.clone() for k, v in net.state_dict().items()}
    X, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    with model_debugger.capture(path) as rec:
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            F.cross_entropy(net(X), y).backward()
            opt.step()
    return rec, start


def _spill_event(path: str) -> dict:
    (event,) = [json.loads(line) for line in open(path) if json.loads(line)["t"] == "spill"]
    return event


def test_the_spill_lies_beside_the_record_never_on_a_memory_file_system(tmp_path, monkeypatch):
    """The copy goes to the record's folder; a tmpfs folder (RAM as shared memory) is not used
    unless MODEL_DEBUGGER_SPILL_DIR names it: the copy stays in RAM and the record says why."""
    monkeypatch.setenv("MODEL_DEBUGGER_SPILL_MB", "0")
    monkeypatch.delenv("MODEL_DEBUGGER_SPILL_DIR", raising=False)
    path = str(tmp_path / "run" / "record.jsonl")
    rec, start = _train_small(path)
    spill = rec.keeper.spill_path
    assert spill and os.path.dirname(spill) == os.path.dirname(path)
    assert os.stat(spill).st_mode & 0o777 == 0o600
    assert _spill_event(path)["spilled"] is True
    assert all(torch.equal(rec.keeper.initial_state[k], start[k]) for k in start)
    rec.release()
    assert not os.path.exists(spill)

    from model_debugger.capture.spill import _fs_type

    if _fs_type("/dev/shm") != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    shm = f"/dev/shm/model_debugger-test-{os.getpid()}"
    os.makedirs(shm, exist_ok=True)
    try:
        path = os.path.join(shm, "record.jsonl")
        rec, start = _train_small(path)
        assert rec.keeper.spill_path is None  # kept in RAM, not as shared memory in tmpfs
        assert not [n for n in os.listdir(shm) if n.endswith(".bin")]
        event = _spill_event(path)
        assert event["spilled"] is False and "tmpfs" in event["reason"]
        assert all(torch.equal(rec.keeper.initial_state[k], start[k]) for k in start)
        rec.release()

        monkeypatch.setenv("MODEL_DEBUGGER_SPILL_DIR", shm)  # named explicitly: used as named
        rec, start = _train_small(str(tmp_path / "named" / "record.jsonl"))
        spill = rec.keeper.spill_path
        assert spill and os.path.dirname(spill) == shm
        assert all(torch.equal(rec.keeper.initial_state[k], start[k]) for k in start)
        rec.release()
        assert not os.path.exists(spill)
    finally:
        import shutil

        shutil.rmtree(shm, ignore_errors=True)


def test_session_copies_are_written_atomically_and_never_through_a_link(tmp_path):
    """The fix copy and the artifact copy: a planted ``fixes`` symlink is refused, a hard link
    to a file outside is replaced (never written through), the copy is 0600."""
    from model_debugger.records import Classification, Finding
    from model_debugger.redact import write_private
    from model_debugger.safe_write import UnsafePath
    from model_debugger.session import DebugSession

    s = DebugSession.create(str(tmp_path / "s"))
    outside = tmp_path / "user.py"
    outside.write_text("print('the user file')\n")
    artifact = os.path.join(s.directory, "artifact.py")
    os.link(outside, artifact)  # the same file under two names
    write_private(artifact, "print('the session copy')\n")
    assert outside.read_text() == "print('the user file')\n"
    assert open(artifact).read() == "print('the session copy')\n"
    assert os.stat(artifact).st_mode & 0o777 == 0o600

    s.record_reproduce({"status": "reproduced", "steps": 3})  # a session at the fix phase
    s.record_classification(Classification("gradient_instability", (), ()), {})
    s.record_findings([Finding("lr_too_high", "hyperparameter", True, "the learning rate")])
    assert s.phase == "fix"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, os.path.join(s.directory, "fixes"))
    with pytest.raises(UnsafePath):
        s.record_fix({"finding": "lr_too_high", "root_cause": "hyperparameter",
                  "source": "lr = 0.01\n"}, approved=True)
    assert list(elsewhere.iterdir()) == [] and s.pending_fix is None
    os.unlink(os.path.join(s.directory, "fixes"))
    s.record_fix({"finding": "lr_too_high", "root_cause": "hyperparameter",
                  "source": "lr = 0.01\n"}, approved=True)
    copy = os.path.join(s.directory, "fixes", "1.py")
    assert open(copy).read() == "lr = 0.01\n" and os.stat(copy).st_mode & 0o777 == 0o600


def test_a_symlink_planted_at_the_record_path_is_not_followed(tmp_path):
    """A record (a session's or a rank's) is a fresh private file: a symlink left where it is
    about to be written is refused, and the file it points at is untouched."""
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me\n")
    record = tmp_path / "record.jsonl"
    record.symlink_to(target)
    with pytest.raises(OSError), model_debugger.capture(str(record)):
        pass
    assert target.read_text() == "keep me\n"
    assert patches.patched() == []  # nothing was left patched by the refused capture
    plain = tmp_path / "fresh.jsonl"
    plain.write_text("an older record\n")
    with model_debugger.capture(str(plain)):
        pass
    assert "an older record" not in plain.read_text()  # replaced, never appended to
    assert os.stat(plain).st_mode & 0o777 == 0o600
