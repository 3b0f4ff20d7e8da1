"""``label_alignment`` must give the same verdict whichever rows the capture happened to keep.

With labels that carry no information, the real/shuffled held-out ratio is ~1 by construction;
what decides the probe is how far from 1 it wanders (a single train/held-out split wandered to
0.97 and the probe went silent on a misaligned dataset). Weakly informative labels must not be
called noise, and clearly informative ones must end the probe after the first fold.
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch
from torch import nn

from model_debugger.probes import label_alignment
from model_debugger.probes.label_alignment import MARGIN, LabelAlignment
from model_debugger.trainers.torch import TorchTrainer


def trainer(seed: int, signal: float, n: int = 1600, batch: int = 50) -> TorchTrainer:
    """Binary labels from ``signal * (x0 + x1) + noise``; ``signal=0``: labels permuted."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = (signal * (x[:, 0] + x[:, 1]) + rng.normal(size=n) > 0).astype(np.int64)
    if signal == 0:
        y = rng.permutation(y)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    batches = [((xt[i:i + batch],), yt[i:i + batch]) for i in range(0, n, batch)]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return TorchTrainer(model, state, {"cls": torch.optim.SGD, "hyper": {"lr": 0.1}},
                        {"name": "cross_entropy"}, batches)


def imbalanced_trainer(seed: int, n: int = 3000, batch: int = 100) -> TorchTrainer:
    """5% positives, weakly shifted inputs, a logit model trained with BCE-with-logits."""
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, generator=g) < 0.05).float()
    x = torch.randn(n, 20, generator=g) + 0.15 * y[:, None]
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 1))
    batches = [((x[i:i + batch],), y[i:i + batch]) for i in range(0, n, batch)]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return TorchTrainer(model, state, {"cls": torch.optim.SGD, "hyper": {"lr": 0.05}},
                        {"name": "binary_cross_entropy_with_logits", "input_shape": ()}, batches)


def run(tr: TorchTrainer):
    ctx = types.SimpleNamespace(trainer=tr, time_left=lambda: 300.0, ref=lambda _key: None)
    return LabelAlignment().run(ctx)


@pytest.mark.parametrize("seed", range(6))
def test_noise_labels_are_found_with_a_ratio_near_one(seed):
    found = run(trainer(seed, 0.0))
    assert len(found) == 1 and found[0].confirmed and found[0].root_cause == "data"
    ev = found[0].evidence
    ratio = ev["heldout_loss_real"] / ev["heldout_loss_shuffled"]
    assert abs(ratio - 1) < 0.5 * (1 - MARGIN), ev  # far from the margin, either way
    assert ev["folds"] == 3 and len(ev["heldout_loss_each_shuffle"]) == 2


@pytest.mark.parametrize("seed", range(3))
def test_weakly_informative_labels_are_not_called_noise(seed):
    assert run(trainer(seed, 0.3)) == []


def test_clear_labels_stop_after_the_first_fold(monkeypatch):
    tr = trainer(0, 2.0)
    fits = []
    original = TorchTrainer.fit
    monkeypatch.setattr(TorchTrainer, "fit", lambda self, *a, **k: fits.append(1) or
                        original(self, *a, **k))
    assert run(tr) == []
    assert len(fits) == 2  # real and one shuffle, on one fold


@pytest.mark.parametrize("seed", range(2))
def test_no_verdict_when_the_copies_never_learn_the_prior(seed):
    """95/5 labels: 150 Adam steps at 1e-3 do not even move the bias to the prior, so real and
    shuffled labels both sit far above the constant predictor. That says nothing about the labels
    (here they are informative)."""
    fits = []
    original = TorchTrainer.fit
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TorchTrainer, "fit", lambda self, *a, **k: fits.append(1) or
                   original(self, *a, **k))
        assert run(imbalanced_trainer(seed)) == []
    assert len(fits) == 2  # seen on the first fold: the other folds are not trained
    # ... and it is the prior check that stopped it: without it the probe goes on
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(label_alignment, "UNTRAINED", math.inf)
        mp.setattr(TorchTrainer, "fit", lambda self, *a, **k: fits.append(1) or
                   original(self, *a, **k))
        run(imbalanced_trainer(seed))
    assert len(fits) > 4


def test_no_verdict_and_no_error_when_the_copies_diverge():
    tr = trainer(0, 0.0)
    tr.inputs[0][::7] = float("nan")  # NaN rows: every loss is NaN
    assert run(tr) == []


def test_constant_loss_for_token_targets_bf16_and_huber():
    from model_debugger.probes.label_alignment import constant_loss

    tokens = torch.tensor([[0, 1, -100], [1, 1, -100]])  # padded positions are ignored
    p = np.array([1 / 4, 3 / 4])
    assert constant_loss("cross_entropy", tokens) == pytest.approx(float(-(p * np.log(p)).sum()))
    assert constant_loss("cross_entropy", torch.full((2, 3), -100)) is None
    y = torch.tensor([0.0, 1.0, 2.0, 5.0])
    assert constant_loss("mse_loss", y.bfloat16()) == pytest.approx(float(y.var(unbiased=False)))
    assert constant_loss("l1_loss", y) == pytest.approx(1.5)
    # the least mean Smooth-L1 (beta 1) over constants: f'(c) = 2c - 3 on [1, 2], c = 1.5
    assert constant_loss("smooth_l1_loss", y) == pytest.approx(1.0625, abs=1e-6)
    assert constant_loss("huber_loss", y, kwargs={"delta": 1.0}) == pytest.approx(1.0625, abs=1e-6)
    # delta 10 covers every residual: Huber is half the squared error, at the mean (2)
    assert constant_loss("huber_loss", y, kwargs={"delta": 10.0}) == pytest.approx(
        0.5 * float(y.var(unbiased=False)), abs=1e-6)


def test_a_copy_that_cannot_learn_gives_no_verdict_on_aligned_labels(monkeypatch):
    """Clear labels, but the user's optimizer settings (a weight decay of 50, carried into the
    copies) pin every weight at zero: real and shuffled labels tie at the prior. The positive
    controls (planted labels, memorising 64 rows) fail too, so the probe says nothing about the labels; without
    the control it blamed them."""
    tr = trainer(0, 2.0)
    tr.hyper["weight_decay"] = 50.0
    assert run(tr) == []
    monkeypatch.setattr(label_alignment, "_witness", lambda *a: None)  # the control alone
    assert run(tr) == []
    monkeypatch.setattr(label_alignment, "memorises", lambda *a: None)
    monkeypatch.setattr(label_alignment, "learns_planted", lambda *a: None)
    found = run(tr)
    assert len(found) == 1 and found[0].root_cause == "data"  # the false alarm it prevents


@pytest.mark.parametrize("seed", range(2))
def test_the_control_passes_for_a_healthy_copy_on_misaligned_labels(seed):
    found = run(trainer(seed, 0.0))
    ev = found[0].evidence
    assert ev["control_loss"] < label_alignment.MEMORISED * ev["control_constant_loss"]


def test_no_control_on_inputs_without_spread():
    tr = trainer(0, 0.0)
    inputs = (torch.ones(200, 8),)
    target = torch.randint(0, 2, (200,))
    assert label_alignment.memorises(tr, inputs, target, np.random.default_rng(0)) is None


def deep_sigmoid_trainer(seed: int, n: int = 1200, batch: int = 50) -> TorchTrainer:
    """Two interleaved moons (clearly aligned labels) under six stacked sigmoids: copies
    trained with Adam for the probe's budget learn nothing from the labels, though one can
    still memorise 64 rows (the positive control passes)."""
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, np.pi, n)
    y = rng.integers(0, 2, n)
    x = np.stack([np.cos(t) + y, np.sin(t) * (1 - 2 * y) + 0.5 * y], 1)
    x = (x + 0.1 * rng.normal(size=x.shape)).astype(np.float32)
    torch.manual_seed(seed)
    layers = [nn.Linear(2, 16), nn.Sigmoid()]
    for _ in range(5):
        layers += [nn.Linear(16, 16), nn.Sigmoid()]
    model = nn.Sequential(*layers, nn.Linear(16, 2))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))
    batches = [((xt[i:i + batch],), yt[i:i + batch]) for i in range(0, n, batch)]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return TorchTrainer(model, state, {"cls": torch.optim.SGD, "hyper": {"lr": 0.05}},
                        {"name": "cross_entropy"}, batches)


def test_a_model_that_cannot_use_aligned_labels_does_not_blame_them(monkeypatch):
    """The copies tie real and shuffled labels (the stack cannot learn in the budget), but a
    k-nearest-neighbour predictor, a second learner that needs no training, tells the labels
    from the inputs: they are aligned, the model is what fails. Without the witness the probe
    blamed the labels."""
    tr = deep_sigmoid_trainer(0)
    assert run(tr) == []
    monkeypatch.setattr(label_alignment, "_witness", lambda *a: None)
    found = run(tr)
    assert len(found) == 1 and found[0].root_cause == "data"  # the false alarm it prevents


def test_the_witness_agrees_with_misaligned_labels():
    ev = run(trainer(0, 0.0))[0].evidence
    assert abs(ev["knn_real"] - ev["knn_shuffled"]) < label_alignment.WITNESS_MARGIN


def test_knn_score_reads_classes_and_regression_targets():
    from model_debugger.probes._numpy_stats import knn_score

    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 3))
    assert knn_score(x, (x[:, 0] > 0).astype(int), classes=True) > 0.9
    assert abs(knn_score(x, rng.integers(0, 2, 600), classes=True) - 0.5) < 0.1
    assert knn_score(x, 3 * x[:, 1], classes=False) > 0.8
    assert knn_score(x, rng.normal(size=600), classes=False) < 0.1


@pytest.mark.parametrize("sig", [
    {"constant_predictor_loss": 0.69, "val_loss_min": 0.5},
    {"majority_rate": 0.5, "val_acc_max": 0.75, "val_acc_final": 0.72}])
def test_a_run_that_generalised_is_a_witness_that_its_labels_are_aligned(sig):
    """Copies that learn nothing in the budget (here: noise labels) say nothing when the run
    itself predicted validation rows well beyond the prior: misaligned labels cannot do that."""
    tr = trainer(0, 0.0)
    ctx = types.SimpleNamespace(trainer=tr, time_left=lambda: 300.0, ref=lambda _key: None,
                                signals=sig)
    assert LabelAlignment().run(ctx) == []
    ctx.signals = {"constant_predictor_loss": 0.69, "val_loss_min": 0.68,
                   "majority_rate": 0.5, "val_acc_max": 0.52}  # at the prior: no witness
    assert len(LabelAlignment().run(ctx)) == 1
    # one lucky reading of a noisy accuracy, back at the prior at the end: no witness either
    ctx.signals.update(val_acc_max=0.75, val_acc_final=0.51)
    assert len(LabelAlignment().run(ctx)) == 1
    # nor is an accuracy read off a run that never fitted its own training labels
    ctx.signals.update(val_acc_final=0.75, loss_floor_share=0.99)
    assert len(LabelAlignment().run(ctx)) == 1
    ctx.signals.update(loss_floor_share=0.5)
    assert LabelAlignment().run(ctx) == []


def test_the_witness_gives_no_answer_on_ignored_positions():
    """Class ids of -100 (ignored positions) are not one label per row: no k-NN verdict,
    and no error that would hide the probe's own."""
    tr = trainer(0, 0.0)
    target = tr.targets.clone()
    target[::5] = -100
    ctx = types.SimpleNamespace(trainer=tr)
    assert label_alignment._witness(ctx, tr.inputs, target, np.random.default_rng(0)) is None


def test_the_witness_reads_no_token_ids_and_weighs_its_own_noise():
    """Token ids (a tiny BERT's ``input_ids`` and mask) have no distances: no k-NN verdict
    (a 0.53 vs 0.47 by chance on 480 rows of ids let misaligned labels pass as aligned). On
    numbers, the gap it needs grows with the noise of two accuracies on few rows."""
    tr = trainer(0, 0.0)
    ctx = types.SimpleNamespace(trainer=tr)
    ids = torch.randint(0, 30, (len(tr.targets), 12))
    assert label_alignment._witness(ctx, (ids, torch.ones_like(ids)), tr.targets,
                                    np.random.default_rng(0)) is None
    real, chance, noise = label_alignment._witness(ctx, tr.inputs, tr.targets,
                                                   np.random.default_rng(0))
    rows = min(len(tr.targets), 1536)
    assert noise == pytest.approx(2 * np.sqrt(2 * chance * (1 - chance) / rows))


def circle_trainer(seed: int, shuffled: bool, n: int = 1600, batch: int = 64) -> TorchTrainer:
    """Points in the square, labelled inside/outside a circle (two input columns, a BCE logit
    output); ``shuffled``: the labels permuted apart from the points."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 2)).astype(np.float32)
    y = ((x ** 2).sum(1) < 0.5).astype(np.float32)[:, None]
    if shuffled:
        y = y[rng.permutation(n)]
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 1))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    batches = [((xt[i:i + batch],), yt[i:i + batch]) for i in range(0, n, batch)]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return TorchTrainer(model, state, {"cls": torch.optim.Adam, "hyper": {"lr": 0.01}},
                        {"name": "binary_cross_entropy_with_logits"}, batches)


@pytest.mark.parametrize("seed", range(2))
def test_misaligned_labels_on_two_input_columns_are_found(seed):
    """Random labels on two coordinates cannot be memorised in the control's steps (no
    network separates 64 random points of the plane that fast), so the memorising control
    alone called a healthy copy unable to learn and the probe stayed silent; labels planted
    along a direction of the inputs are learned, and the misalignment is found."""
    found = run(circle_trainer(seed, True))
    assert len(found) == 1 and found[0].root_cause == "data", found
    assert found[0].evidence["control"] == "planted"
    assert run(circle_trainer(seed, False)) == []  # the aligned circle: nothing to find


def test_planted_labels_keep_every_label_and_follow_the_inputs():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(300, 5)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 3, 300))
    got = label_alignment.planted((x,), y, np.random.default_rng(1), "cross_entropy")
    assert got.dtype == y.dtype and sorted(got.tolist()) == sorted(y.tolist())
    # a nearest-neighbour predictor reads them back from the inputs; the originals it cannot
    from model_debugger.probes import _numpy_stats as st
    assert st.knn_score(x.numpy(), got.numpy(), True) > 0.6  # chance: 1/3
    assert st.knn_score(x.numpy(), y.numpy(), True) < 0.5
    one_hot = np.eye(3, dtype=np.float32)[y.numpy()]  # a Keras one-hot target keeps its form
    got = label_alignment.planted((x.numpy(),), one_hot, np.random.default_rng(1))
    assert got.shape == one_hot.shape and (got.sum(0) == one_hot.sum(0)).all()
    assert label_alignment.planted((np.ones((50, 3)),), y[:50], np.random.default_rng(0)) is None


@pytest.mark.parametrize("left, shuffles", [(300.0, 2), (6.0, 1), (2.0, None)])
def test_a_short_budget_drops_the_second_shuffle_before_the_verdict(monkeypatch, left, shuffles):
    """Each fit takes one (fake) second: with the budget left after the first two fits too short
    for the 7 others and the control, the verdict is kept with one shuffle (4 more fits); with
    too little even for those, no verdict (was: no verdict at once, and a Keras CNN on shuffled
    labels went without its label check)."""
    clock = [0.0]
    original = TorchTrainer.fit

    def fit(self, *a, **k):
        clock[0] += 1.0
        return original(self, *a, **k)

    monkeypatch.setattr(TorchTrainer, "fit", fit)
    monkeypatch.setattr(label_alignment.time, "monotonic", lambda: clock[0])
    ctx = types.SimpleNamespace(trainer=trainer(0, 0.0), time_left=lambda: left,
                                ref=lambda _key: None)
    found = LabelAlignment().run(ctx)
    if shuffles is None:
        assert found == []
        return
    assert len(found) == 1 and found[0].confirmed
    assert len(found[0].evidence["heldout_loss_each_shuffle"]) == shuffles
