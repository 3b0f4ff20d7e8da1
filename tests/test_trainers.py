"""Capture inside the trainers people use: Lightning, Hugging Face ``Trainer``, Accelerate.

Every number in the record is checked against what the trainer itself computed or logged
(Lightning's ``callback_metrics`` and ``on_before_optimizer_step``, HF's ``state.log_history``),
or against the test's own reference (the losses ``training_step`` returned, the norm
``clip_grad_norm_`` returned). Tiny models built from configs; nothing is downloaded.
"""

from __future__ import annotations

import inspect
import math
import os

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")
transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402

from model_debugger import capture  # noqa: E402
from model_debugger.records import Run  # noqa: E402

HERE = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    """The line of this file that ends with ``# <marker>``."""
    with open(HERE, encoding="utf-8") as fh:
        hits = [i for i, line in enumerate(fh, 1) if line.rstrip().endswith(f"# <{marker}>")]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def close(a, b, rel=1e-5) -> bool:
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=1e-9)


def norm(params) -> float:
    return float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params
                                if p.grad is not None)))


def run_of(rec) -> Run:
    return Run(events=list(rec.events))


# -- clip_grad_norm_ in a plain loop ---------------------------------------------------------
def test_a_clipped_loop_records_the_norm_before_the_clip_and_after_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 4) * 5, torch.randn(64, 1) * 20
    returned, after = [], []
    with capture(update_every=0, hist_every=0) as rec:
        for _ in range(12):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            params = (p for p in model.parameters())  # a generator, read once by the clip
            returned.append(float(torch.nn.utils.clip_grad_norm_(params, 1.0)))  # <clip>
            after.append(norm(model.parameters()))
            opt.step()
    run = run_of(rec)
    steps = run.steps
    assert len(steps) == 12
    assert all(r > 1.0 for r in returned)  # every step was clipped
    for s, r, a in zip(steps, returned, after):
        assert close(s["gn"], r), (s["gn"], r)  # the norm before the clip
        assert close(s["gnc"], a)  # and after it
        assert s["gnc"] <= 1.0 + 1e-5
    clip = run.first("clip")
    assert clip["max_norm"] == 1.0 and clip["location"]["line"] == line_of("clip")


def test_an_unclipped_loop_has_no_clipped_norm():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with capture(update_every=0, hist_every=0) as rec:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 3)).pow(2).mean().backward()
            opt.step()
    assert all("gnc" not in s for s in run_of(rec).steps)
    assert run_of(rec).first("clip") is None


# -- Lightning ---------------------------------------------------------------------------------
class LitNet(pl.LightningModule):
    def __init__(self, lr=0.05):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.lr = lr
        self.train_losses: list[float] = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):  # <training_step>
        x, t = batch
        loss = F.cross_entropy(self(x), t)
        self.train_losses.append(loss.item())
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, t = batch
        out = self(x)
        self.log_dict({"val_loss": F.cross_entropy(out, t),
                       "val_acc": (out.argmax(1) == t).float().mean()})

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)  # <pl_optimizer>


class Truth(pl.Callback):
    """What Lightning itself saw: the gradient norm before clipping, its validation metrics."""

    def __init__(self):
        self.norms: list[float] = []
        self.val: list[dict] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.norms.append(norm(pl_module.parameters()))

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.val.append({k: float(v) for k, v in trainer.callback_metrics.items()
                             if k.startswith("val_")})


def _loaders():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    train = DataLoader(TensorDataset(x[:136], y[:136]), batch_size=16, shuffle=True,
                       generator=torch.Generator().manual_seed(1))
    val = DataLoader(TensorDataset(x[136:], y[136:]), batch_size=32)
    return train, val


def test_lightning_steps_norms_losses_and_logged_metrics_agree_with_lightning(tmp_path):
    torch.manual_seed(0)
    train, val = _loaders()
    module, truth = LitNet(), Truth()
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", logger=False, callbacks=[truth],
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path),
                         accumulate_grad_batches=2, gradient_clip_val=0.05,
                         num_sanity_val_steps=2)
    init, log = pl.Trainer.__init__, pl.LightningModule.log
    with capture(update_every=0, hist_every=0) as rec:
        trainer.fit(module, train, val)  # <pl_fit>
    assert pl.Trainer.__init__ is init and pl.LightningModule.log is log  # all undone
    run = run_of(rec)
    steps = run.steps
    # one row per optimizer step, not per micro-batch
    assert len(steps) == trainer.global_step == 3 * math.ceil(9 / 2)
    # gradient norms: this step's, before the clip (Lightning clips inside the closure)
    assert len(truth.norms) == len(steps)
    for s, true in zip(steps, truth.norms):
        assert close(s["gn"], true), (s["gn"], true)
        assert s["gnc"] <= 0.05 + 1e-6
    # the loss as training_step computed it, not divided by accumulate_grad_batches
    assert run.first("loss_scaled")["accumulate"] == 2
    per_epoch = [module.train_losses[i:i + 9] for i in range(0, 27, 9)]
    windows = [ep[j:j + 2] for ep in per_epoch for j in range(0, 9, 2)]
    for s, w in zip(steps, windows):
        assert close(s["loss"], sum(w) / 2), (s["loss"], w)  # Lightning divides by 2 always
    # metrics from self.log / log_dict, as Lightning reduced them; the sanity check is no epoch
    metrics = run.metrics()
    assert [v for _, _, v in metrics["val_loss"]] == pytest.approx([m["val_loss"] for m in
                                                                     truth.val])
    assert [v for _, _, v in metrics["val_acc"]] == pytest.approx([m["val_acc"] for m in
                                                                    truth.val])
    assert len(metrics["train_loss"]) == 27  # on_step: every batch
    assert len(metrics["train_loss_epoch"]) == 3
    assert [v for _, _, v in metrics["train_loss"]] == pytest.approx(module.train_losses)
    assert len(metrics["eval_loss"]) == 3  # the automatic one skipped the sanity pass too
    assert run.epochs == 3
    assert run.metric_by_role("val", "loss")[0] == "val_loss"
    # where the evidence points: the user's hooks, not trainer.fit(...)
    refs = run.refs()
    assert refs["backward"]["line"] == line_of("training_step")
    assert refs["step"]["line"] == line_of("pl_optimizer")
    assert refs["optimizer"]["line"] == line_of("pl_optimizer")
    assert run.first("trainer")["fit"]["line"] == line_of("pl_fit")
    # probes train copies of the module, not copies of the trainer and its data
    from model_debugger.trainers.torch import copy_model

    assert module._trainer is trainer
    twin = copy_model(module)
    assert twin._trainer is None and module._trainer is trainer
    x = next(iter(train))[0]
    assert torch.equal(twin(x), module(x))


# -- Hugging Face Trainer ----------------------------------------------------------------------
class Tokens(Dataset):
    def __init__(self, n, seed, vocab=40, length=10):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(5, vocab, (n, length), generator=g)
        self.labels = (self.ids[:, 0] > vocab // 2).long()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]),
                "labels": self.labels[i]}


def test_hf_trainer_steps_norms_losses_and_logs_agree_with_its_log_history(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=16, num_labels=2)
    init = Trainer.__init__
    with capture(update_every=0, hist_every=0) as rec:
        model = BertForSequenceClassification(cfg)
        args = TrainingArguments(  # <hf_args>
            output_dir=str(tmp_path), num_train_epochs=2, per_device_train_batch_size=8,
            gradient_accumulation_steps=2, learning_rate=5e-3, max_grad_norm=0.5,
            logging_steps=1, eval_strategy="epoch", save_strategy="no", report_to=[],
            use_cpu=True, seed=0, disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(64, 1),
                          eval_dataset=Tokens(32, 2))
        trainer.train()
    assert Trainer.__init__ is init
    run = run_of(rec)
    steps = run.steps
    history = trainer.state.log_history
    assert len(steps) == trainer.state.global_step == 2 * 4
    logged = {h["step"]: h for h in history if "grad_norm" in h}
    assert len(logged) == len(steps)
    for s in steps:
        h = logged[s["i"] + 1]  # HF counts steps from 1
        assert close(s["gn"], h["grad_norm"], rel=1e-4), (s["gn"], h["grad_norm"])
        assert s["gnc"] <= 0.5 + 1e-5  # clipped: HF's default hides growth under 1.0
        assert close(s["loss"], h["loss"], rel=1e-4), (s["loss"], h["loss"])
    assert run.first("loss_scaled")["accumulate"] == 2
    metrics = run.metrics()
    evals = [h["eval_loss"] for h in history if "eval_loss" in h]
    assert [v for _, _, v in metrics["eval_loss"]] == pytest.approx(evals)
    # from the trainer's callback (exact), not the rounded dicts it also printed
    assert [v for _, _, v in metrics["grad_norm"]] == [logged[s]["grad_norm"] for s in
                                                       sorted(logged)]
    assert any(e["source"] == "stdout" for e in run.of("metric") if e["name"] == "grad_norm")
    assert run.epochs == 2
    refs = run.refs()
    for kind in ("backward", "step", "optimizer"):
        assert refs[kind]["line"] == line_of("hf_args"), (kind, refs[kind])


# -- time in the trainers' callbacks ---------------------------------------------------------
def _overhead_finding(run: Run):
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context

    return run_probes(build_context(run, None, {}), ["step_overhead"]).findings


@pytest.mark.parametrize("every", [1, 0], ids=["every_step", "at_epoch_end"])
def test_lightning_checkpoints_saved_every_step_are_timed_to_the_callback(tmp_path, every):
    """Each of the trainer's callbacks has its per-batch hooks timed during ``fit`` (a
    ``callbacks`` event); a ``ModelCheckpoint`` saving every step holds the loop's own time
    and is located where it was constructed."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    torch.manual_seed(0)
    train, val = _loaders()
    with capture(update_every=0, hist_every=0) as rec:
        ckpt = ModelCheckpoint(dirpath=str(tmp_path), every_n_train_steps=every or None,  # <pl_ckpt>
                               save_top_k=-1)
        trainer = pl.Trainer(max_epochs=4, accelerator="cpu", logger=False, callbacks=[ckpt],
                             enable_progress_bar=False, enable_model_summary=False,
                             default_root_dir=str(tmp_path), num_sanity_val_steps=0)
        trainer.fit(LitNet(), train, val)
    assert "on_train_batch_end" not in vars(ckpt)  # untimed after fit
    run = run_of(rec)
    (event,) = run.of("callbacks")
    assert event["steps"] == trainer.global_step == 36
    timed = {c["cls"]: c for c in event["callbacks"]}
    assert timed["ModelCheckpoint"]["line"] == line_of("pl_ckpt")
    assert timed["ModelCheckpoint"]["calls"] >= 36
    findings = _overhead_finding(run)
    if every:
        [f] = findings
        assert f.confirmed and f.evidence["callback"] == "ModelCheckpoint"
        assert f.location["line"] == line_of("pl_ckpt")
    else:  # (saved once an epoch, not in a batch hook)
        assert not [f for f in findings if f.evidence.get("callback")]


class _Named:
    def __init__(self, name, **kwargs):
        super().__init__(**kwargs)
        self.name = name


class _MixedIn(pl.Callback, _Named):
    """A callback whose constructor passes arguments on to a mixin after ``Callback``."""

    def __init__(self):
        super().__init__("mixed")


def test_callbacks_built_during_a_capture_keep_their_method_order():
    """``Callback`` has no ``__init__`` of its own: the one the capture adds to note where a
    callback is made calls on along the instance's order, so a mixin after it still gets its
    arguments."""
    with capture(update_every=0, hist_every=0):
        assert _MixedIn().name == "mixed"
    assert "__init__" not in vars(pl.Callback)


def test_hf_checkpoints_saved_every_step_are_timed_to_the_training_arguments(tmp_path):
    """A Hugging Face trainer's own checkpoint saving is timed (``save_steps=1``: every step)
    and located at the ``save_steps`` passed to the ``TrainingArguments`` that configure it."""
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=16, num_labels=2)
    with capture(update_every=0, hist_every=0) as rec:
        model = BertForSequenceClassification(cfg)
        args = TrainingArguments(  # <hf_save_args>
            output_dir=str(tmp_path), num_train_epochs=3, per_device_train_batch_size=8,
            learning_rate=5e-3, save_strategy="steps", report_to=[], use_cpu=True, seed=0,
            save_steps=1, disable_tqdm=True)  # <hf_save_steps>
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(64, 1))
        trainer.train()
    assert "_save_checkpoint" not in vars(trainer)
    run = run_of(rec)
    (event,) = run.of("callbacks")
    saving = next(c for c in event["callbacks"] if c["cls"] == "checkpoint saving")
    assert event["steps"] == 24 and saving["calls"] == 24
    assert saving["line"] == line_of("hf_save_args")
    sig = __import__("model_debugger.signals", fromlist=["compute"]).compute(run)
    assert sig["step_overhead_share"] >= 0.5, sig["step_overhead_share"]
    [f] = _overhead_finding(run)
    assert f.confirmed and f.evidence["callback"] == "checkpoint saving"
    assert f.location["line"] == line_of("hf_save_steps")  # the setting, in the call


class _Silent(pl.LightningModule):
    """A training_step that logs its loss and returns nothing."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, t = batch
        loss = F.cross_entropy(self.net(x), t)
        self.log("train_loss", loss)  # <silent-end>

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def test_a_lightning_training_step_that_returns_nothing_is_located_at_its_end(tmp_path):
    """Lightning skips backward when training_step returns None: no step has a gradient, and
    the finding is located where the ``return loss`` belongs (the step's last line)."""
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context

    torch.manual_seed(0)
    train, _ = _loaders()
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path))
    with capture(update_every=0, hist_every=0) as rec:
        trainer.fit(_Silent(), train)
    run = run_of(rec)
    ctx = build_context(run, None, {HERE: open(HERE, encoding="utf-8").read()})
    [f] = run_probes(ctx, ["detached_output"]).findings
    assert f.confirmed and f.root_cause == "training_loop" and "returns nothing" in f.explanation
    assert f.location == {"file": HERE, "line": line_of("silent-end")}


class _ManualNoClear(pl.LightningModule):
    """Manual optimisation that steps without ever clearing the gradients."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.net = nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, t = batch
        loss = F.cross_entropy(self.net(x), t)
        self.manual_backward(loss)
        opt.step()  # <manual-step>
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-2, momentum=0.9)


def test_a_manual_lightning_step_without_zero_grad_is_located_at_the_users_step(tmp_path):
    """Lightning's own ``zero_grad`` calls (seen at the ``fit`` line) are not the user's: the
    clearing belongs beside the ``opt.step()`` of the manual ``training_step``."""
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context

    torch.manual_seed(0)
    train, _ = _loaders()
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path))
    with capture(update_every=0, hist_every=0) as rec:
        trainer.fit(_ManualNoClear(), train)
    run = run_of(rec)
    ctx = build_context(run, None, {HERE: open(HERE, encoding="utf-8").read()})
    [f] = run_probes(ctx, ["missing_zero_grad"]).findings
    assert f.confirmed and f.root_cause == "training_loop", f
    assert f.location["line"] == line_of("manual-step"), (f.location, run.refs())


# -- Accelerate --------------------------------------------------------------------------------
def test_accelerate_accumulation_records_the_users_loss():
    from accelerate import Accelerator

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = nn.Linear(6, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = DataLoader(TensorDataset(torch.randn(48, 6), torch.randn(48, 1)), batch_size=8)
    model, opt, data = accelerator.prepare(model, opt, data)
    losses = []
    with capture(update_every=0, hist_every=0) as rec:
        for x, y in data:
            with accelerator.accumulate(model):
                loss = F.mse_loss(model(x), y)
                losses.append(loss.item())
                accelerator.backward(loss)  # <accelerate_backward>
                opt.step()
                opt.zero_grad()
    run = run_of(rec)
    assert len(run.steps) == 3
    for s, (a, b) in zip(run.steps, zip(losses[::2], losses[1::2])):
        assert close(s["loss"], (a + b) / 2)
    assert run.refs()["backward"]["line"] == line_of("accelerate_backward")


def test_lightning_training_step_location_is_its_def_line():
    from model_debugger.capture.torch_trainers import _code_location

    loc = _code_location(LitNet.training_step)
    assert loc["line"] == line_of("training_step")
    assert _code_location(inspect.getsource) is None  # not the user's code


# -- Isolate under a trainer: probes on copies, a confirmation by intervention ---------------
@pytest.mark.slow
def test_under_lightning_the_learning_rate_is_confirmed_by_an_intervention(tmp_path):
    """The re-runs go through the user's Trainer.fit: lr_scale reaches its optimizer."""
    import json
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(HERE), "scenarios", "pl_gi_lr_too_high.py")
    proc = subprocess.run(
        [sys.executable, "-m", "model_debugger.cli", "diagnose", script, "--json", "--root",
         str(tmp_path), "--intervene-seconds", "60"], capture_output=True, text=True,
        timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    first = next(f for f in report["findings"] if f["confirmed"])
    assert first["check"] == "lr_range" and first["root_cause"] == "hyperparameter"
    assert first["evidence"]["confirmed_by"] == "intervention"
    change = first["evidence"]["intervention"]
    assert change["id"] == "lr_scale" and change["params"]["factor"] < 1
    assert change["moved"] and change["after_mean"] > change["before_mean"]
    with open(script, encoding="utf-8") as fh:
        assert "torch.optim.SGD" in fh.read().splitlines()[first["location"]["line"] - 1]


def test_lr_scale_reaches_a_schedule_built_on_an_accelerate_wrapped_optimizer():
    """HF's Trainer builds its schedule on Accelerate's wrapper of the optimizer."""
    from accelerate import Accelerator

    from model_debugger.artifacts.base import Intervention
    from model_debugger.interventions import installed

    with installed(Intervention("lr_scale", {"factor": 0.01})):
        model = nn.Linear(3, 1)
        model, opt = Accelerator(cpu=True).prepare(model, torch.optim.AdamW(model.parameters(),
                                                                            lr=1.0))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / 10)
        rates = []
        for _ in range(4):
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
            sched.step()
            opt.zero_grad()
            rates.append(opt.param_groups[0]["lr"])
    assert rates == pytest.approx([0.01 * (1.0 - s / 10) for s in range(1, 5)])


class LitStepDecay(LitNet):
    """An epoch-sized ExponentialLR handed to Lightning to step after every batch."""

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        decay = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.7)
        return {"optimizer": opt,
                "lr_scheduler": {"scheduler": decay, "interval": "step"}}  # <interval>


def test_an_epoch_sized_schedule_lightning_steps_every_batch_is_a_loop_finding(tmp_path):
    """``"interval": "step"``: 0.7 per batch, ~0 within two epochs, where 0.7 per epoch would
    have kept a quarter of the rate by the end. Confirmed by copies at the peak and the median
    rate, and located at the entry that makes Lightning step it per batch (was: a setting,
    at the scheduler's line)."""
    from model_debugger.probes import run_probes
    from model_debugger.probing import build_context

    torch.manual_seed(0)
    train, val = _loaders()
    with capture() as rec:
        pl.Trainer(max_epochs=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False,
                   default_root_dir=str(tmp_path)).fit(LitStepDecay(), train, val)
    with open(HERE, encoding="utf-8") as fh:
        source = fh.read()
    ctx = build_context(run_of(rec), rec.keeper, {HERE: source}, budget=60.0,
                        classification={"primary": "loss_not_decreasing", "secondary": [],
                                        "evidence": []})
    assert ctx.signals["lr_collapsed_share"] >= 0.5
    [f] = [f for f in run_probes(ctx, ["lr_schedule"]).findings if f.confirmed]
    assert f.root_cause == "training_loop"
    assert (f.location["file"], f.location["line"]) == (HERE, line_of("interval"))


def test_batches_padded_each_to_its_own_longest_row_are_stacked_whole():
    """A ``collate_fn`` with ``pad_sequence`` pads each batch to its own length: the kept
    batches of token ids differ in their steps and stacked only where they matched the first
    (40 rows of a run's 160). Padded at the end with 0, they are padded to the longest; ids
    of another shape, or shorter rows that do not end with 0, are not guessed at."""
    from model_debugger.trainers.torch import _stack

    def batch(width, pad=True, rows=4):
        ids = torch.randint(1, 9, (rows, width))
        if pad:
            ids[1:, -1] = 0  # the longest row fills the batch, the others end padded
        return (ids, torch.full((rows,), width)), torch.arange(rows)

    inputs, target = _stack([batch(5), batch(7), batch(3)])
    assert inputs[0].shape == (12, 7) and len(target) == 12
    assert bool((inputs[0][:4, 5:] == 0).all()) and bool((inputs[0][8:, 3:] == 0).all())
    assert inputs[1].tolist() == [5] * 4 + [7] * 4 + [3] * 4  # other inputs as they were
    inputs, target = _stack([batch(5), batch(7), batch(3, pad=False)])
    assert inputs[0].shape == (4, 5)  # a shorter batch not ended by 0: only the first shape
