"""Data probes: each fires on a planted problem (numbers checked against plain reference
computations) and stays silent on healthy data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from model_debugger.probes import _numpy_stats as st
from model_debugger.probes.base import PROBES, ProbeContext, probes_for
from model_debugger.probes.class_imbalance import ClassImbalance
from model_debugger.probes.constant_baseline import ConstantBaseline
from model_debugger.probes.distribution_shift import DistributionShift
from model_debugger.probes.feature_scaling import FeatureScaling
from model_debugger.probes.leakage import Leakage
from model_debugger.probes.target_copy import TargetCopy
from model_debugger.records import Classification, Run

LOC = {"t": "ref", "kind": "loss_fn", "file": "train.py", "line": 42}


def ctx_for(train=None, val=None, signals=None, run=None, category="overfitting", **kw):
    return ProbeContext(run=run or Run([]), signals=signals or {},
                        classification=Classification(category), train_xy=train, val_xy=val, **kw)


def confirmed(findings):
    return [f for f in findings if f.confirmed]


# --- plain reference computations -----------------------------------------------------------

def ks_ref(a, b):
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return np.abs(np.searchsorted(a, grid, side="right") / len(a)
                  - np.searchsorted(b, grid, side="right") / len(b)).max()


def psi_ref(e, a, bins=10):
    edges = np.unique(np.quantile(e, np.linspace(0, 1, bins + 1)[1:-1]))
    pe = np.array([np.mean(np.searchsorted(edges, e, side="right") == k)
                   for k in range(len(edges) + 1)])
    pa = np.array([np.mean(np.searchsorted(edges, a, side="right") == k)
                   for k in range(len(edges) + 1)])
    pe, pa = np.maximum(pe, 1e-4), np.maximum(pa, 1e-4)
    return np.sum((pa - pe) * np.log(pa / pe))


def auc_ref(scores, labels):
    pos, neg = scores[labels == 1], scores[labels == 0]
    diff = pos[:, None] - neg[None, :]
    return ((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size


# --- shared statistics ----------------------------------------------------------------------

def test_ks_and_psi_match_references_including_ties():
    rng = np.random.default_rng(1)
    a = np.hstack([rng.standard_normal((300, 2)), rng.integers(0, 3, (300, 2))])
    b = np.hstack([rng.standard_normal((170, 2)) + 0.4, rng.integers(0, 4, (170, 2))])
    ks, ps = st.ks_columns(a, b), st.psi_columns(a, b)
    for j in range(4):
        assert ks[j] == pytest.approx(ks_ref(a[:, j], b[:, j]), abs=1e-12)
        assert ps[j] == pytest.approx(psi_ref(a[:, j], b[:, j]), rel=1e-9)
    assert st.ks_columns(a, a).max() == 0.0


def test_auc_matches_pairwise_count_with_ties():
    rng = np.random.default_rng(2)
    scores = rng.integers(0, 5, 60).astype(float)
    labels = rng.integers(0, 2, 60)
    assert st.auc(scores, labels) == pytest.approx(auc_ref(scores, labels))


def test_classifier_two_sample_test_separates_only_shifted_samples():
    rng = np.random.default_rng(3)
    same = st.classifier_auc(rng.standard_normal((400, 5)), rng.standard_normal((400, 5)))
    shifted = st.classifier_auc(rng.standard_normal((400, 5)), rng.standard_normal((400, 5)) + 1)
    assert abs(same - 0.5) < 0.1 and shifted > 0.9
    assert st.classifier_auc(np.zeros((5, 2)), np.ones((5, 2))) is None   # too few rows


def test_logistic_fit_in_row_space_matches_plain_gradient_descent():
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((30, 50)), (rng.random(30) < 0.5).astype(float)
    w = st.logistic_fit(x, y)                     # 30 rows < 51 columns: the dual path
    xb = np.hstack([x, np.ones((30, 1))])
    lr = 1.0 / (0.25 * np.linalg.eigvalsh(xb.T @ xb / 30).max() + 1e-2)
    ref = np.zeros(51)
    for _ in range(300):
        ref -= lr * (xb.T @ (1 / (1 + np.exp(-xb @ ref)) - y) / 30 + 1e-2 * ref)
    assert np.abs(w - ref).max() < 1e-3


def test_as_labels():
    assert st.as_labels(np.array([0.0, 1.0, 1.0, 0.0])).tolist() == [0, 1, 1, 0]
    assert st.as_labels(np.eye(3)[[2, 0, 1]]).tolist() == [2, 0, 1]
    assert st.as_labels(np.linspace(0, 1, 50)) is None
    assert st.as_labels(np.array([0.0, 1.0, 1.0]), "mse_loss") is None


def test_registry_and_categories():
    for pid in ("distribution_shift", "feature_scaling", "leakage", "class_imbalance",
                "constant_baseline"):
        assert pid in PROBES and not PROBES[pid].needs_live
    assert "*" not in Leakage.categories
    assert {"distribution_shift", "leakage"} <= set(probes_for("overfitting"))
    assert "leakage" not in probes_for("healthy")


# --- distribution_shift ---------------------------------------------------------------------

def test_distribution_shift_confirms_and_names_the_shifted_feature():
    rng = np.random.default_rng(10)
    x, v = rng.standard_normal((600, 4)), rng.standard_normal((300, 4))
    v[:, 2] += 1.5
    names = ["age", "height", "income", "score"]
    ctx = ctx_for((x, None), (v, None), feature_names=names, run=Run([LOC]))
    (f,) = DistributionShift().run(ctx)
    assert f.confirmed and f.root_cause == "data" and f.check == "distribution_shift"
    top = f.evidence["top_features"][0]
    assert top["feature"] == "income" and "income" in f.explanation
    assert top["ks"] == pytest.approx(ks_ref(x[:, 2], v[:, 2]))
    assert top["psi"] == pytest.approx(psi_ref(x[:, 2], v[:, 2]))
    assert f.evidence["auc"] >= 0.75 and 0 < f.evidence["strength"] <= 1
    assert f.location == {"file": "train.py", "line": 42}


def test_distribution_shift_confirms_a_spread_change_the_linear_classifier_misses():
    rng = np.random.default_rng(12)
    x, v = rng.standard_normal((600, 3)), rng.standard_normal((300, 3))
    v[:, 0] *= 3
    (f,) = DistributionShift().run(ctx_for((x, None), (v, None)))
    assert f.evidence["auc"] < 0.75                     # a mean-free change: not linear
    assert f.confirmed and f.evidence["major_shift_features"] == 1
    assert f.evidence["top_features"][0]["feature"] == "x0"
    assert f.evidence["top_features"][0]["ks"] >= f.evidence["ks_critical"]


def test_distribution_shift_silent_on_one_distribution_and_needs_arrays():
    rng = np.random.default_rng(11)
    x, v = rng.standard_normal((600, 6)), rng.standard_normal((300, 6))
    assert not confirmed(DistributionShift().run(ctx_for((x, None), (v, None))))
    assert not DistributionShift().applies(ctx_for((x, None), None))
    assert not DistributionShift().applies(ctx_for(None, None))


# --- feature_scaling ------------------------------------------------------------------------

def test_feature_scaling_confirms_and_names_offending_columns():
    rng = np.random.default_rng(20)
    x = rng.standard_normal((500, 4))
    x[:, 1] = 40000 + 15000 * x[:, 1]          # salary
    x[:, 3] = 2000 + 5 * x[:, 3]               # year: offset, not spread
    ctx = ctx_for((x, None), category="gradient_instability",
                  feature_names=["age", "salary", "rate", "year"])
    (f,) = FeatureScaling().run(ctx)
    assert f.confirmed and f.root_cause == "data"
    std = x.std(axis=0)
    assert f.evidence["std_ratio"] == pytest.approx(std.max() / std.min())
    named = {o["feature"] for o in f.evidence["offending"]}
    assert {"salary", "year"} <= named and "age" not in named
    assert f.evidence["offset_features"] == ["year"]
    assert set(f.evidence["large_features"]) == {"salary", "year"}
    salary = next(o for o in f.evidence["offending"] if o["feature"] == "salary")
    assert salary["std"] == pytest.approx(std[1]) and salary["mean"] == pytest.approx(x[:, 1].mean())


def test_feature_scaling_silent_on_standardised_and_sparse_inputs():
    rng = np.random.default_rng(21)
    assert FeatureScaling().run(ctx_for((rng.standard_normal((500, 8)), None))) == []
    pixels = np.zeros((500, 30))
    pixels[:, 10:20] = rng.random((500, 10))
    pixels[3, 2] = 0.6                          # a nearly-always-black pixel: tiny std, same range
    assert FeatureScaling().run(ctx_for((pixels, None))) == []
    assert not FeatureScaling().applies(ctx_for(None))


# --- leakage --------------------------------------------------------------------------------

def _split(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((400, 5))
    y = (x[:, 0] + x[:, 1] + rng.standard_normal(400) > 0).astype(int)
    v = rng.standard_normal((100, 5))
    return x, y, v, (v[:, 0] + v[:, 1] > 0).astype(int)


# --- target_copy ----------------------------------------------------------------------------

@pytest.mark.parametrize("encode", [lambda y: y, lambda y: 10.0 - 3.0 * y,
                                    lambda y: np.array([0.2, 7.0, -1.0])[y]])
def test_target_copy_finds_the_label_in_a_column_whatever_its_encoding(encode):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 5))
    y = rng.integers(0, 3, 300)
    x[:, 3] = encode(y)
    (f,) = TargetCopy().run(ctx_for((x, y), None, category="healthy"))
    assert f.confirmed and f.evidence["decisive"] and f.evidence["column"] == 3
    assert TargetCopy.reveals == "overfitting" and "target_copy" in probes_for("healthy")


def test_target_copy_finds_a_regression_target_copied_into_a_feature():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 4))
    target = x[:, :2].sum(axis=1) + 0.1 * rng.standard_normal(300)
    x[:, 2] = 2.0 * target + 5.0
    (f,) = TargetCopy().run(ctx_for((x, target), None, category="healthy"))
    assert f.evidence["column"] == 2


@pytest.mark.parametrize("case", ["separable", "noisy_copy", "one_column", "few_rows"])
def test_target_copy_silent_on_easy_tasks_and_near_copies(case):
    """An easy task (a feature that separates the classes still varies within each), a label
    column with 5% noise, a one-feature fit of y = 2x + 1 and a handful of rows: no finding."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((400, 4))
    y = (x[:, 0] > 0).astype(int)
    if case == "noisy_copy":
        x[:, 1] = np.where(rng.random(400) < 0.05, 1 - y, y)
    if case == "one_column":
        x, y = x[:, :1], 2 * x[:, 0] + 1
    if case == "few_rows":
        x[:, 1] = y
        x, y = x[:30], y[:30]
    assert TargetCopy().run(ctx_for((x, y), None, category="healthy")) == []


def test_data_volume_finds_a_training_set_of_a_few_rows_repeated():
    from model_debugger.probes.data_volume import DataVolume

    rng = np.random.default_rng(3)
    x = rng.standard_normal((32, 6))[np.arange(1024) % 32]
    y = rng.integers(0, 2, 32)[np.arange(1024) % 32]
    (f,) = DataVolume().run(ctx_for((x, y), None))
    assert f.confirmed and f.evidence["decisive"]
    assert (f.evidence["rows"], f.evidence["distinct_rows"]) == (1024, 32)
    varied = rng.standard_normal((1024, 6))
    assert DataVolume().run(ctx_for((varied, y), None)) == []  # no record: nothing else to say


@pytest.mark.parametrize("case", ["memorised", "no_gap", "other_targets", "acc_gap"])
def test_data_volume_on_a_healthy_looking_run_needs_repeated_examples_and_a_gap(case):
    """A regression that memorised 32 rows repeated can end with its validation loss still
    falling slowly, far above the training loss: no rule fires, the repeated rows reveal
    overfitting. Not without a gap, nor when the inputs repeat with other targets (a few
    categorical features): those are different examples."""
    from model_debugger.probes.data_volume import GAP_RATIO, DataVolume

    rng = np.random.default_rng(4)
    x = rng.standard_normal((32, 6))[np.arange(1024) % 32]
    y = x @ rng.standard_normal(6)
    if case == "other_targets":
        y = y + rng.standard_normal(1024)
    train, val = 0.002, (0.3 if case != "no_gap" else GAP_RATIO * 0.002 * 0.9)
    sig = {"val_loss_final": val, "train_loss_final": train, "gap_final": val - train}
    if case == "acc_gap":
        sig = {"acc_gap": 0.4}
    found = DataVolume().run(ctx_for((x, y), None, signals=sig, category="healthy"))
    if case in ("memorised", "acc_gap"):
        (f,) = found
        assert f.confirmed and f.evidence["decisive"] and f.evidence["distinct_rows"] == 32
        assert DataVolume.reveals == "overfitting" and "data_volume" in probes_for("healthy")
    else:
        assert found == []


def test_leakage_counts_duplicate_rows_across_splits():
    x, y, v, yv = _split(30)
    v[:15] = x[100:115]
    v[15] = -0.0 * x[0] + x[200]               # same values, fresh array
    (f,) = Leakage().run(ctx_for((x, y), (v, yv)))
    assert f.confirmed and f.root_cause == "data"
    ref = sum(any(np.array_equal(r, t) for t in x) for r in v)
    assert f.evidence["duplicate_count"] == ref == 16
    assert f.evidence["duplicate_fraction"] == pytest.approx(0.16)


def test_leakage_does_not_confirm_duplicates_of_naturally_discrete_rows():
    rng = np.random.default_rng(31)
    x, v = rng.integers(0, 2, (400, 3)).astype(float), rng.integers(0, 2, (100, 3)).astype(float)
    findings = Leakage().run(ctx_for((x, rng.integers(0, 2, 400)), (v, None)))
    assert findings and not confirmed(findings)


def test_leakage_finds_a_feature_that_carries_the_label():
    x, y, v, yv = _split(32)
    y3 = np.where(x[:, 0] > 0.5, 2, y)        # three classes
    x[:, 4] = y3 * 10 + np.random.default_rng(0).random(400)   # the answer, plus noise
    (f,) = Leakage().run(ctx_for((x, y3), None, feature_names=list("abcde")))
    assert f.confirmed and f.evidence["feature"] == "e" and f.evidence["accuracy"] >= 0.98
    assert f.evidence["majority_rate"] == pytest.approx(np.bincount(y3).max() / len(y3))


def test_leakage_finds_a_regression_feature_correlated_with_the_target():
    rng = np.random.default_rng(33)
    x = rng.standard_normal((300, 4))
    target = 3 * x[:, 1] + 0.01 * rng.standard_normal(300)
    (f,) = Leakage().run(ctx_for((x, target), None))
    assert f.confirmed and f.evidence["feature"] == "x1"
    assert f.evidence["abs_pearson_r"] == pytest.approx(abs(np.corrcoef(x[:, 1], target)[0, 1]))


def test_leakage_too_good_validation_from_signals_only():
    sig = {"val_loss_final": 0.1, "train_loss_final": 0.5, "constant_predictor_loss": 0.69}
    ctx = ctx_for(None, None, signals=sig)
    assert Leakage().applies(ctx)
    (f,) = Leakage().run(ctx)
    assert f.confirmed and f.evidence["ratio"] == pytest.approx(0.2)
    near_zero = {"val_loss_final": 0.001, "train_loss_final": 0.003, "val_acc_final": 1.0,
                 "train_acc_final": 1.0, "constant_predictor_loss": 0.69}
    (g,) = Leakage().run(ctx_for(None, None, signals=near_zero))
    assert not g.confirmed                     # a perfect score alone: maybe an easy task
    (h,) = Leakage().run(ctx_for(None, None, signals={"val_acc_final": 0.9995,
                                                      "train_acc_final": 0.93}))
    assert h.confirmed
    assert not Leakage().applies(ctx_for(None, None))


def test_leakage_silent_on_a_clean_split():
    x, y, v, yv = _split(34)
    sig = {"val_loss_final": 0.45, "train_loss_final": 0.40, "val_acc_final": 0.8}
    assert Leakage().run(ctx_for((x, y), (v, yv), signals=sig)) == []


# --- class_imbalance ------------------------------------------------------------------------

def test_class_imbalance_from_arrays_relates_accuracy_to_majority_rate():
    rng = np.random.default_rng(40)
    y = (rng.random(1000) < 0.08).astype(float)       # 0/1 floats
    sig = {"val_acc_final": 1 - y.mean() + 0.002, "val_acc_name": "val_acc"}
    (f,) = ClassImbalance().run(ctx_for((np.zeros((1000, 2)), y), signals=sig,
                                        category="convergence_to_wrong_solution"))
    counts = np.bincount(y.astype(int))
    assert f.confirmed and f.root_cause == "data"
    assert f.evidence["counts"] == {"0": int(counts[0]), "1": int(counts[1])}
    assert f.evidence["majority_share"] == pytest.approx(counts[0] / 1000)
    assert f.evidence["accuracy_at_majority"] == ["val_acc"] and "majority rate" in f.explanation


def test_class_imbalance_from_the_record_without_arrays():
    run = Run([{"t": "targets", "loss": "cross_entropy", "n": 1000, "counts": [880, 100, 20]}])
    ctx = ctx_for(run=run, category="loss_not_decreasing")
    assert ClassImbalance().applies(ctx)
    (f,) = ClassImbalance().run(ctx)
    assert f.confirmed and f.evidence["source"] == "record"
    assert f.evidence["minority_class"] == 2 and f.evidence["minority_share"] == pytest.approx(0.02)


def test_class_imbalance_from_sampled_record_counts_says_so():
    """Counts from a sample of the targets never claim that a class is absent from the data."""
    run = Run([{"t": "targets", "loss": "cross_entropy", "n": 8000, "sampled": 1000,
                "counts": [880, 120, 0]}])
    (f,) = ClassImbalance().run(ctx_for(run=run, category="loss_not_decreasing"))
    assert "a sample of 1000 of the 8000 training targets" in f.explanation
    assert "[2] do not occur in that sample" in f.explanation and "never" not in f.explanation
    whole = Run([{"t": "targets", "loss": "cross_entropy", "n": 1000, "counts": [880, 120, 0]}])
    (g,) = ClassImbalance().run(ctx_for(run=whole, category="loss_not_decreasing"))
    assert "[2] never occur" in g.explanation and "a sample of" not in g.explanation


def test_a_single_class_in_every_training_target_is_the_extreme_of_imbalance():
    from model_debugger.probes.suggestions import suggestion_for

    (f,) = ClassImbalance().run(ctx_for((np.ones((600, 2)), np.zeros(600, dtype=int)),
                                        category="convergence_to_wrong_solution"))
    assert f.confirmed and f.evidence["single_class"] and f.evidence["majority_share"] == 1.0
    assert "Every one of the 600 training targets is class 0" in f.explanation
    assert "overwrote" in suggestion_for(f)
    assert ClassImbalance().run(ctx_for((np.ones((10, 2)), np.zeros(10, dtype=int)))) == []
    # a contrastive loss's positive is always column 0: without a constant prediction seen,
    # one class is only a hypothesis
    (h,) = ClassImbalance().run(ctx_for((np.ones((600, 2)), np.zeros(600, dtype=int)),
                                        category="loss_not_decreasing"))
    assert not h.confirmed and h.evidence["single_class"]


def test_class_imbalance_silent_on_balanced_or_regression_targets():
    rng = np.random.default_rng(41)
    assert ClassImbalance().run(ctx_for((np.zeros((600, 1)), rng.integers(0, 3, 600)))) == []
    assert ClassImbalance().run(ctx_for((np.zeros((600, 1)), rng.standard_normal(600)))) == []
    assert not ClassImbalance().applies(ctx_for(None))


# --- constant_baseline ----------------------------------------------------------------------

def test_constant_baseline_measures_the_symptom_and_confirms_no_cause():
    """The loss at the constant predictor's is what every stalled run shows (a low rate, unscaled
    inputs, an unused input path): a hypothesis for the experiments to test, never confirmed."""
    sig = {"constant_predictor_loss": math.log(2), "loss_final": 0.69, "loss_min": 0.66}
    (f,) = ConstantBaseline().run(ctx_for(signals=sig, category="loss_not_decreasing"))
    assert not f.confirmed and f.root_cause == "hyperparameter"
    assert f.check == "constant_baseline" and f.evidence["strength"] == 0.5
    assert f.evidence["ratio"] == pytest.approx(0.69 / math.log(2))
    assert "nothing beyond the label prior" in f.explanation


def test_constant_baseline_computes_entropy_and_variance_from_arrays():
    rng = np.random.default_rng(50)
    y = rng.choice(4, 500, p=[0.4, 0.3, 0.2, 0.1])
    p = np.bincount(y) / len(y)
    entropy = float(-(p * np.log(p)).sum())
    (f,) = ConstantBaseline().run(ctx_for((None, y), signals={"loss_final": entropy * 0.99},
                                          loss={"name": "cross_entropy"}))
    assert f.evidence["baseline_loss"] == pytest.approx(entropy)
    target = 2 + 3 * rng.standard_normal(500)
    (g,) = ConstantBaseline().run(ctx_for((None, target), signals={"loss_final": 9.0},
                                          loss={"name": "mse_loss"}))
    assert g.evidence["baseline_loss"] == pytest.approx(target.var())
    assert g.evidence["ratio"] == pytest.approx(9.0 / target.var())


def test_constant_baseline_silent_when_the_model_clearly_beats_it():
    sig = {"constant_predictor_loss": math.log(2), "loss_final": 0.2, "loss_min": 0.15}
    assert ConstantBaseline().run(ctx_for(signals=sig)) == []
    (f,) = ConstantBaseline().run(ctx_for(signals={"constant_predictor_loss": 1.0,
                                                   "loss_final": 0.9}))
    assert not f.confirmed                     # barely beats it: reported, not confirmed
    assert not ConstantBaseline().applies(ctx_for(signals={"loss_final": 0.5}))


def test_token_ids_looked_up_by_an_embedding_are_no_features_to_scale():
    """Integer ids into a model with an embedding: a vocabulary index of 9000 is not a feature
    9000 times larger (a stop_gradient fault was blamed on 'unscaled features'); integer inputs
    to a model without one (prices read as int64) are still judged."""
    import types

    from torch import nn

    from model_debugger.probes._layers import token_ids as _token_ids

    ids = np.random.default_rng(0).integers(0, 9000, size=(64, 20))
    embed = nn.Sequential(nn.Embedding(9000, 8), nn.Flatten(), nn.Linear(160, 1))
    plain = nn.Sequential(nn.Linear(20, 1))
    assert _token_ids(types.SimpleNamespace(train_xy=(ids, None), model=embed))
    assert not _token_ids(types.SimpleNamespace(train_xy=(ids, None), model=plain))
    assert _token_ids(types.SimpleNamespace(train_xy=(ids.astype("float32"), None),
                                            model=embed))  # ids handed over as floats
    assert not _token_ids(types.SimpleNamespace(train_xy=(ids + 0.5, None), model=embed))


def test_rows_holding_nan_are_left_out_of_the_sample_probes_train_on():
    import torch
    from torch import nn

    from model_debugger.trainers.keras import _finite_rows as keras_rows
    from model_debugger.trainers.torch import TorchTrainer

    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x @ torch.ones(4, 1)
    x[5, 2] = float("nan")  # one row of the inputs, one of the targets
    y[9, 0] = float("inf")
    model = nn.Linear(4, 1)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    tr = TorchTrainer(model, state, {"cls": torch.optim.SGD, "hyper": {"lr": 0.05}},
                      {"name": "mse_loss"}, [((x[:32],), y[:32]), ((x[32:],), y[32:])])
    assert tr.n == 62 and torch.isfinite(tr.inputs[0]).all()
    rates, losses = tr.sweep(1e-6, 1e-3, 20)  # a sweep at tiny rates stays finite
    assert np.isfinite(losses).all()
    xs, ys = keras_rows((x.numpy(),), y.numpy())
    assert len(ys) == 62 and np.isfinite(xs[0]).all() and np.isfinite(ys).all()
    every = (np.full((3, 2), -np.inf),)  # inf in every row: a mask by design, all kept
    assert keras_rows(every, np.zeros(3))[0] is every


def test_nonfinite_inputs_are_located_where_numpy_warned_it_made_them():
    from types import SimpleNamespace

    from model_debugger.probes.nonfinite_inputs import _made_nonfinite

    def warning(message, line, step=0, category="RuntimeWarning", file="/w/train.py"):
        return {"t": "warning", "category": category, "message": message, "file": file,
                "line": line, "step": step}

    run = Run([{"t": "start"}, warning("`shuffle=True` was passed", 61, category="UserWarning"),
               warning("divide by zero encountered in log", 28),
               warning("invalid value encountered in subtract", 33), {"t": "end"}])
    ctx = SimpleNamespace(run=run, source_files={"/w/train.py": ""})
    assert _made_nonfinite(ctx) == {"file": "/w/train.py", "line": 28}  # the first one
    late = Run([{"t": "start"}, {"t": "step", "i": 0},  # after training began: not the data's
                warning("divide by zero encountered in log", 80, step=1)])
    assert _made_nonfinite(SimpleNamespace(run=late, source_files=ctx.source_files)) is None
    cast = Run([{"t": "start"}, warning("invalid value encountered in cast", 12)])
    assert _made_nonfinite(SimpleNamespace(run=cast, source_files=ctx.source_files)) is None
    elsewhere = Run([{"t": "start"}, warning("overflow encountered in exp", 9, file="/lib/x.py")])
    assert _made_nonfinite(SimpleNamespace(run=elsewhere, source_files=ctx.source_files)) is None


@pytest.mark.parametrize("dropped", [False, True, "shuffled"],
                         ids=["imbalanced_at_source", "rows_dropped", "rows_shuffled"])
def test_class_imbalance_is_located_where_it_is_undone(tmp_path, dropped):
    """Labels imbalanced at their source are what the data is: the finding sits where the loss
    weighs the classes (the line that made the criterion, where ``pos_weight=`` goes; two
    held-out writers put the fix there). Rows dropped by the code (``X[keep], y[keep]``) made
    the imbalance: that line. Rows only shuffled (a permutation) drop none."""
    lines = ["import torch",
             "from torch import nn",
             "y = (torch.rand(1000) < 0.05).float()",
             "X = torch.randn(1000, 4)",
             "keep = (y == 1) | (torch.arange(1000) % 2 == 0)",
             {True: "X, y = X[keep], y[keep]", False: "pass",
              "shuffled": "X, y = X[torch.randperm(1000)], y[torch.randperm(1000)]"}[dropped],
             "criterion = nn.BCEWithLogitsLoss()",
             "model = nn.Linear(4, 1)",
             "loss = criterion(model(X).squeeze(1), y)"]
    script = tmp_path / "train.py"
    script.write_text("\n".join(lines) + "\n")
    run = Run([{"t": "ref", "kind": "loss_fn", "file": str(script), "line": 9},
               {"t": "targets", "loss": "binary_cross_entropy_with_logits", "n": 1000,
                "mean": 0.05}])
    (f,) = ClassImbalance().run(ctx_for(run=run, category="convergence_to_wrong_solution"))
    assert f.confirmed and f.location["line"] == (6 if dropped is True else 7)
