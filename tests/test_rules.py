"""Each rule of classify.RULES on both sides of its thresholds, from synthetic run records.

Thresholds are read from model_debugger.classify, so these tests follow the table when it is tuned.
"""

from __future__ import annotations

import json
import math

import _synthetic as syn
import numpy as np
import pytest

from model_debugger import classify as C
from model_debugger.records import HEALTHY, Classification, Run, metric_role
from model_debugger.signals import compute, constant_predictor

# -- helpers ---------------------------------------------------------------------------------


def _check_evidence(sig: dict, evidence) -> set[str]:
    """Every cited signal exists in the signal dict with the cited value; returns the names."""
    for ev in evidence:
        assert ev.signal in sig, f"evidence cites unknown signal {ev.signal!r}"
        expected = sig[ev.signal]
        if isinstance(expected, float):  # cited rounded: compare to ~6 significant digits
            assert ev.value == pytest.approx(expected, rel=1e-5, abs=1e-6)
        else:
            assert ev.value == expected
        assert ev.detail
    return {ev.signal for ev in evidence}


def fires(rule, run, category: str, cites: set[str], primary: bool = True):
    """Assert ``rule`` fires on ``run`` with ``category`` and cites at least ``cites``."""
    sig = compute(run)
    out = rule(sig)
    assert out is not None, f"{rule.__name__} did not fire; signals: {sig}"
    cat, evidence = out
    assert cat == category
    cited = _check_evidence(sig, evidence)
    assert cites <= cited, f"{rule.__name__} cites {cited}, expected at least {cites}"
    cls = classify_and_check(sig)
    if primary:
        assert cls.primary == category, cls
        assert cites <= {e.signal for e in cls.evidence}
    else:
        assert category in (cls.primary, *cls.secondary), cls
    return sig, cls


def quiet(rule, run):
    """Assert ``rule`` does not fire on ``run``; returns the signals and the classification."""
    sig = compute(run)
    assert rule(sig) is None, f"{rule.__name__} fired: {rule(sig)}; signals: {sig}"
    return sig, classify_and_check(sig)


def classify_and_check(sig: dict) -> Classification:
    cls = C.classify(sig)
    _check_evidence(sig, cls.evidence)
    assert cls.primary not in cls.secondary
    assert len(set(cls.secondary)) == len(cls.secondary)
    json.dumps(cls.to_json(), allow_nan=False)  # evidence is valid JSON (no bare NaN)
    return cls


def test_rule_table_is_the_one_these_tests_cover():
    names = [r.__name__ for r in C.RULES]
    assert names == ["nonfinite", "unbounded_below", "oom", "rank_hang", "loss_without_metric", "broadcast_loss",
                     "exploding", "memory_growth",
                     "rank_desync", "bounded_output", "restored_wrong_way", "below_zero",
                     "one_value_targets",
                     "overfitting", "wrong_solution", "generalisation_gap", "trivial_validation",
                     "not_decreasing", "stalled_head",
                     "vanishing",
                     "rank_straggler", "slow_data", "loop_overhead", "retraced", "gpu_idle",
                     "plateau"]


# -- nonfinite -------------------------------------------------------------------------------


def test_nonfinite_event_fires_and_cites_step_and_module():
    run = syn.make_run(syn.healthy_steps(20), syn.nonfinite(7, "grad", "layers.2"))
    sig, cls = fires(C.nonfinite, run, "gradient_instability",
                     {"first_nonfinite_step", "nonfinite_module"})
    assert sig["first_nonfinite_step"] == 7
    assert sig["nonfinite_what"] == "grad"
    assert sig["nonfinite_module"] == "layers.2"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_loss_in_steps_fires_without_event(bad):
    loss = syn.decay(30)
    loss[12] = bad
    run = syn.make_run(syn.steps_events(loss))
    sig, _ = fires(C.nonfinite, run, "gradient_instability", {"first_nonfinite_step"})
    assert sig["first_nonfinite_step"] == 12
    assert sig["nonfinite_what"] == "loss"


def test_nonfinite_from_weights_cites_the_last_finite_gradients():
    """Norms every 4th step: a NaN loss from NaN weights points back to the last finite norms."""
    steps = syn.healthy_steps(20)
    for st in steps:
        if st["i"] % 4:
            del st["gn"]  # not measured (norm_every=4)
    event = {**syn.nonfinite(14, "loss", "layers.0"), "in_weights": True}
    sig, cls = fires(C.nonfinite, syn.make_run(steps, event), "gradient_instability",
                     {"first_nonfinite_step", "nonfinite_module", "last_finite_grad_step"})
    assert sig["last_finite_grad_step"] == 12
    # a NaN loss from the forward pass (finite weights) says nothing of earlier updates
    sig, _ = fires(C.nonfinite, syn.make_run(steps, syn.nonfinite(14, "loss", "layers.0")),
                   "gradient_instability", {"first_nonfinite_step", "nonfinite_module"})
    assert "last_finite_grad_step" not in sig


def test_nonfinite_quiet_on_finite_run():
    sig, cls = quiet(C.nonfinite, syn.make_run(syn.healthy_steps(30)))
    assert "first_nonfinite_step" not in sig
    assert cls.primary == HEALTHY


# -- oom -------------------------------------------------------------------------------------


def test_oom_error_fires_memory_issue():
    run = syn.make_run(syn.healthy_steps(20), syn.error("oom", step=20))
    sig, _ = fires(C.oom, run, "memory_issue", {"error"})
    assert "out of memory" in sig["error"]


def test_other_exception_is_not_oom():
    err = syn.error("exception", "ValueError", "shapes (3,) and (4,) not aligned")
    sig, cls = quiet(C.oom, syn.make_run(syn.healthy_steps(20), err))
    assert sig["error_kind"] == "exception"
    assert cls.primary != "memory_issue"
    assert "memory_issue" not in cls.secondary


# -- exploding -------------------------------------------------------------------------------


def test_exploding_divergence_fires_above_ratio():
    run = syn.make_run(syn.steps_events(syn.two_level(100, 1.0, C.DIVERGE_RATIO * 1.05)))
    sig, _ = fires(C.exploding, run, "gradient_instability", {"loss_initial", "loss_final"})
    assert sig["loss_final"] >= C.DIVERGE_RATIO * sig["loss_initial"]


def test_exploding_divergence_quiet_below_ratio():
    final = C.DIVERGE_RATIO * 0.95
    assert final < C.SPIKE_RATIO
    sig, cls = quiet(C.exploding, syn.make_run(syn.steps_events(syn.two_level(100, 1.0, final))))
    assert sig["loss_final"] < C.DIVERGE_RATIO * sig["loss_initial"]
    assert cls.primary != "gradient_instability"


def _spiky(factor: float) -> np.ndarray:
    loss = syn.decay(100)
    head = float(np.median(loss[:10]))
    loss[50] = C.SPIKE_RATIO * head * factor
    return loss


def test_exploding_spike_fires_above_ratio():
    run = syn.make_run(syn.steps_events(_spiky(1.05)))
    sig, _ = fires(C.exploding, run, "gradient_instability", {"loss_initial", "loss_spike"})
    assert sig["loss_final"] < sig["loss_initial"]  # it is the spike, not divergence


def test_exploding_spike_quiet_below_ratio():
    sig, cls = quiet(C.exploding, syn.make_run(syn.steps_events(_spiky(0.95))))
    assert sig["loss_spike"] < C.SPIKE_RATIO * sig["loss_initial"]
    assert cls.primary == HEALTHY


def test_exploding_spike_during_warm_up_is_ignored():
    loss = syn.decay(100)
    loss[2] = 2 * C.SPIKE_RATIO * float(np.median(loss[:10]))  # first 10%: warm-up
    sig, cls = quiet(C.exploding, syn.make_run(syn.steps_events(loss)))
    assert sig["loss_max"] >= C.SPIKE_RATIO * sig["loss_initial"]
    assert sig["loss_spike"] < C.SPIKE_RATIO * sig["loss_initial"]
    assert cls.primary == HEALTHY


def _overshot(final: float, peak: float) -> list:
    """Classification targets of 10 classes (prior loss ln 10); a loss that starts at 2.2,
    peaks at ``peak`` x its start mid-run and ends at ``final`` x it."""
    loss = np.full(100, 2.2)
    loss[40:60] = np.linspace(2.2, 2.2 * peak, 20)
    loss[60:] = 2.2 * final
    return [syn.targets_counts([100] * 10), syn.steps_events(loss)]


def test_a_loss_driven_up_and_left_worse_than_the_prior_is_instability():
    """Momentum 0.99 on a CNN: 2.2 -> a peak of 14 -> 3.3, above ln 10 = 2.30. Under the
    divergence ratio (2x) and the spike ratio (10x), it read as a plateau."""
    sig, _ = fires(C.exploding, syn.make_run(*_overshot(1.5, 6.0)), "gradient_instability",
                   {"loss_initial", "loss_spike", "loss_final", "constant_predictor_loss"})
    assert sig["loss_final"] < C.DIVERGE_RATIO * sig["loss_initial"]
    assert sig["loss_spike"] < C.SPIKE_RATIO * sig["loss_initial"]


@pytest.mark.parametrize("final,peak", [(1.5, 1.5), (1.1, 6.0)])
def test_a_loss_that_ends_near_its_start_or_never_peaked_is_not_instability(final, peak):
    sig, cls = quiet(C.exploding, syn.make_run(*_overshot(final, peak)))
    assert cls.primary != "gradient_instability"


def _grad_burst(factor: float, loss=None):
    gn = np.ones(100)
    gn[60] = C.GRAD_GROWTH * factor
    loss = np.linspace(1.0, 0.8, 100) if loss is None else loss  # the loss barely falls
    return syn.make_run(syn.steps_events(loss, gn=gn))


def test_exploding_gradient_growth_quiet_while_the_loss_halves():
    """A burst from a near-zero start (zero-initialised head) while training works is not
    instability."""
    sig, _ = quiet(C.exploding, _grad_burst(10, loss=syn.decay(100)))
    assert sig["loss_relative_drop"] >= C.GROWTH_WITH_LEARNING


def test_exploding_gradient_growth_fires_above_threshold():
    sig, _ = fires(C.exploding, _grad_burst(1.1), "gradient_instability", {"grad_norm_growth"})
    assert sig["grad_norm_growth"] == pytest.approx(C.GRAD_GROWTH * 1.1)


def test_exploding_gradient_growth_quiet_below_threshold():
    sig, cls = quiet(C.exploding, _grad_burst(0.9))
    assert sig["grad_norm_growth"] == pytest.approx(C.GRAD_GROWTH * 0.9)
    assert cls.primary == HEALTHY


# -- memory_growth ---------------------------------------------------------------------------


def _rss_run(growth_mb: float, noise_mb: float = 0.0):
    n = 100
    i = np.arange(n)
    body_start = n // 10  # signals.compute skips the first ~10% (warm-up)
    trend = growth_mb * (i - body_start) / (n - 1 - body_start)
    noise = np.where(i % 2 == 0, noise_mb, -noise_mb)
    noise[-1] = noise[body_start]  # endpoints of the body carry the same noise
    rss = (500.0 + trend + noise) * syn.MB
    return syn.make_run(syn.healthy_steps(n, rss=rss))


def test_memory_growth_fires_on_steady_growth_above_threshold():
    sig, _ = fires(C.memory_growth, _rss_run(1.2 * C.RSS_GROWTH_MB), "memory_issue",
                   {"rss_growth_mb", "rss_slope_mb_per_step", "rss_growth_r2"})
    assert sig["rss_growth_mb"] == pytest.approx(1.2 * C.RSS_GROWTH_MB, rel=1e-3)
    assert sig["rss_growth_r2"] == pytest.approx(1.0, abs=1e-6)


def test_memory_growth_quiet_below_threshold():
    sig, cls = quiet(C.memory_growth, _rss_run(0.8 * C.RSS_GROWTH_MB))
    assert sig["rss_growth_mb"] < C.RSS_GROWTH_MB
    assert sig["rss_growth_r2"] >= C.RSS_R2
    assert cls.primary == HEALTHY


def test_memory_growth_per_step_when_read_every_kth_step():
    """RSS read on every 4th step only (norm_every=4): the slope is per step, not per reading."""
    n, slope = 400, 1.5 * C.RSS_GROWTH_MB / 360
    rss = (500.0 + slope * np.arange(n)) * syn.MB
    rss[np.arange(n) % 4 != 0] = np.nan
    sig, _ = fires(C.memory_growth, syn.make_run(syn.healthy_steps(n, rss=rss)), "memory_issue",
                   {"rss_growth_mb", "rss_slope_mb_per_step", "rss_growth_r2"})
    assert sig["rss_slope_mb_per_step"] == pytest.approx(slope, rel=1e-6)
    assert sig["rss_growth_r2"] == pytest.approx(1.0, abs=1e-6)


def test_memory_growth_from_a_short_run_read_every_16th_step():
    """capture(norm_every=16) on 200 steps: 13 readings still make a trend."""
    n = 200
    rss = (500.0 + 1.5 * C.RSS_GROWTH_MB * np.arange(n) / n) * syn.MB
    rss[np.arange(n) % 16 != 0] = np.nan
    sig, _ = fires(C.memory_growth, syn.make_run(syn.healthy_steps(n, rss=rss)), "memory_issue",
                   {"rss_growth_mb", "rss_slope_mb_per_step", "rss_growth_r2"})
    assert sig["rss_slope_mb_per_step"] == pytest.approx(1.5 * C.RSS_GROWTH_MB / n, rel=1e-6)


def test_memory_growth_judged_alike_read_every_step_or_thinned():
    """Memory that rises for a while, then stays flat (a cache filling up), is not a leak.

    Read every step, or every step for 32 steps and every 16th after (automatic norm_every):
    the dense start must not weigh more than the steps it stands for.
    """
    n = 480
    i = np.arange(n)
    dense = (500.0 + 1.5 * C.RSS_GROWTH_MB * np.minimum(i, 0.4 * n) / (0.4 * n)) * syn.MB
    thin = np.where((i < 32) | (i % 16 == 0), dense, np.nan)
    got = {}
    for name, rss in (("dense", dense), ("thin", thin)):
        sig, cls = quiet(C.memory_growth, syn.make_run(syn.healthy_steps(n, rss=rss)))
        assert sig["rss_growth_mb"] >= C.RSS_GROWTH_MB  # it did grow, but not steadily
        got[name] = sig
    assert got["thin"]["rss_growth_r2"] == pytest.approx(got["dense"]["rss_growth_r2"], abs=0.05)
    assert got["thin"]["rss_slope_mb_per_step"] == pytest.approx(
        got["dense"]["rss_slope_mb_per_step"], rel=0.1)


def _epochs_run(rss_mb: np.ndarray, epoch_len: int, every: int = 1):
    """A healthy run whose RSS is ``rss_mb``, ``epoch_len`` steps an epoch, read every k-th step."""
    n = len(rss_mb)
    i = np.arange(n)
    rss = np.where(i % every == 0, rss_mb, np.nan) * syn.MB
    return syn.make_run(syn.healthy_steps(n, rss=rss, ep=i // epoch_len))


def test_memory_that_levels_off_after_the_first_epoch_is_not_a_leak():
    """A cache filling through epoch 0, flat in epoch 1 where a step budget ends the run: the
    rise covers most of the run (a linear fit says steady), but the last epoch no longer grows."""
    n, first = 300, 220
    i = np.arange(n)
    rss = 500.0 + 2 * C.RSS_GROWTH_MB * np.minimum(i, first) / first
    for every in (1, 6):
        sig, cls = quiet(C.memory_growth, _epochs_run(rss, first, every))
        assert sig["rss_growth_mb"] >= C.RSS_GROWTH_MB and sig["rss_growth_r2"] >= C.RSS_R2
        assert abs(sig["rss_last_epoch_mb_per_step"]) < 0.4 * C.RSS_STILL_GROWING * \
            sig["rss_slope_mb_per_step"]
        assert cls.primary == HEALTHY


@pytest.mark.parametrize("shape", ["steady", "staircase"])
def test_memory_still_growing_in_the_last_epoch_is_a_leak(shape):
    """A leak grows in every epoch: step by step, or in one jump at each epoch boundary (a
    history of graphs appended per epoch), which the last epoch's slope must still see."""
    n, epoch_len = 400, 100
    i = np.arange(n)
    grow = 2 * C.RSS_GROWTH_MB
    rss = 500.0 + (grow * i / n if shape == "steady" else grow / 4 * (i // epoch_len))
    sig, _ = fires(C.memory_growth, _epochs_run(rss, epoch_len, every=4), "memory_issue",
                   {"rss_growth_mb", "rss_growth_r2", "rss_last_epoch_mb_per_step"})
    assert sig["rss_last_epoch_mb_per_step"] >= C.RSS_STILL_GROWING * \
        sig["rss_slope_mb_per_step"]


def test_memory_last_epoch_is_the_final_run_of_epoch_numbers():
    """Epoch numbers that restart (one count per trial: 0 1 2, then 0 1): the last epoch is the
    final block, not the block with the highest number."""
    n = 300
    i = np.arange(n)
    rss = (500.0 + 2 * C.RSS_GROWTH_MB * np.minimum(i, 225) / 225) * syn.MB  # flat at the end
    ep = np.where(i < 150, i // 50, (i - 150) // 75)
    sig, _ = quiet(C.memory_growth, syn.make_run(syn.healthy_steps(n, rss=rss, ep=ep)))
    assert sig["rss_growth_r2"] >= C.RSS_R2
    assert sig["rss_last_epoch_mb_per_step"] < 0.1 * sig["rss_slope_mb_per_step"]


def test_memory_growth_in_one_epoch_has_no_last_epoch_rate():
    sig, _ = fires(C.memory_growth, _rss_run(1.2 * C.RSS_GROWTH_MB), "memory_issue",
                   {"rss_growth_mb"})
    assert "rss_last_epoch_mb_per_step" not in sig


def test_memory_growth_quiet_when_growth_is_not_steady():
    sig, cls = quiet(C.memory_growth,
                     _rss_run(1.5 * C.RSS_GROWTH_MB, noise_mb=3 * C.RSS_GROWTH_MB))
    assert sig["rss_growth_mb"] >= C.RSS_GROWTH_MB
    assert sig["rss_growth_r2"] < C.RSS_R2
    assert cls.primary == HEALTHY


# -- overfitting -----------------------------------------------------------------------------


def _overfit_run(rise: float, train_ratio: float = 0.5, epochs: int = 10, best: int = 4,
                 scale: float = 1.0):
    """Val loss: min at epoch ``best``, then ``rise`` above it at the end. Train loss: falls
    until ``best``, then moves linearly to ``train_ratio`` x its value there (times ``scale``)."""
    per_epoch = 10
    ep = np.repeat(np.arange(epochs), per_epoch)
    at_best = 0.7 ** best
    after = at_best * (1 + (train_ratio - 1) * (ep - best) / (epochs - 1 - best))
    level = scale * np.where(ep <= best, 0.7 ** ep, after)
    v_min = 0.5
    val = list(np.linspace(1.0, v_min, best + 1))
    val += list(v_min * (1 + rise * np.arange(1, epochs - best) / (epochs - best - 1)))
    return syn.make_run(syn.steps_events(level, ep=ep), syn.metric("val_loss", val))


@pytest.mark.parametrize("train_ratio", [0.5, "just below"])
def test_overfitting_fires_when_val_rises_while_train_does_not(train_ratio):
    if train_ratio == "just below":
        train_ratio = 0.99 * C.TRAIN_NOT_RISING
    sig, _ = fires(C.overfitting, _overfit_run(1.5 * C.VAL_RISE, train_ratio), "overfitting",
                   {"val_loss_min", "val_loss_final", "val_loss_rise",
                    "train_loss_at_val_min", "train_loss_final"})
    assert sig["val_loss_min_index"] == 4
    assert sig["val_loss_rise"] == pytest.approx(1.5 * C.VAL_RISE)
    assert sig["train_loss_final"] == pytest.approx(train_ratio * sig["train_loss_at_val_min"])


def test_overfitting_quiet_when_the_rare_class_was_never_predicted_on_validation():
    """A val loss rising while the validation recall never left 0 (Keras, class weights the
    wrong way round): the model never predicted the rare class, a wrong solution."""
    run = _overfit_run(1.5 * C.VAL_RISE, 0.5)
    events = [e for e in run.events if e["t"] not in ("start", "end")]
    for recall, fires_too in (([0.0] * 10, False), ([0.0, 0.2, 0.4] + [0.5] * 7, True)):
        with_recall = syn.make_run(events, syn.metric("val_recall", recall))
        sig = compute(with_recall)
        assert (C.overfitting(sig) is not None) is fires_too, sig.get("val_f1_max")
    cls = classify_and_check(compute(syn.make_run(events, syn.metric("val_recall", [0.0] * 10))))
    assert cls.primary == "convergence_to_wrong_solution"
    # the rare class learned on the training rows, never on validation: that is overfitting
    memorised = syn.make_run(events, syn.metric("val_recall", [0.0] * 10),
                             syn.metric("recall", [0.5] + [0.98] * 9))
    assert C.overfitting(compute(memorised)) is not None


def test_overfitting_quiet_below_val_rise():
    sig, cls = quiet(C.overfitting, _overfit_run(0.5 * C.VAL_RISE))
    assert sig["val_loss_rise"] == pytest.approx(0.5 * C.VAL_RISE)
    assert cls.primary == HEALTHY


def test_overfitting_quiet_when_train_loss_rises_too():
    sig, cls = quiet(C.overfitting, _overfit_run(1.5 * C.VAL_RISE, 1.2 * C.TRAIN_NOT_RISING))
    assert sig["val_loss_rise"] >= C.VAL_RISE
    assert sig["train_loss_final"] > C.TRAIN_NOT_RISING * sig["train_loss_at_val_min"]
    assert cls.primary != "overfitting"


@pytest.mark.parametrize("train_scale", [4.0, 200.0])
def test_overfitting_quiet_when_validation_stays_below_training(train_scale):
    """A validation rise below a training loss that barely falls is no generalisation gap
    (an unstable regression whose training loss is far above validation's; a noisy bump)."""
    sig, cls = quiet(C.overfitting, _overfit_run(1.5 * C.VAL_RISE, 0.9, scale=train_scale))
    assert sig["val_loss_rise"] >= C.VAL_RISE and sig["gap_final"] < 0
    assert sig["train_loss_final"] < sig["train_loss_at_val_min"]  # not rising: the gap decides
    assert cls.primary != "overfitting"


def _with_targets(run: Run, counts) -> Run:
    return syn.make_run(*run.events, syn.targets_counts(counts))


def test_overfitting_quiet_when_the_rise_is_small_against_what_was_learned():
    """From a minimum near zero a large relative rise is a few hundredths of the loss: a
    classifier growing confident on a few rows (ten classes: the prior's loss is ln 10)."""
    run = _with_targets(_overfit_run(1.5 * C.VAL_RISE, scale=4.5), [10] * 10)
    sig, cls = quiet(C.overfitting, run)
    gained = sig["constant_predictor_loss"] - sig["val_loss_min"]
    assert sig["val_loss_rise"] >= C.VAL_RISE
    assert sig["val_loss_final"] - sig["val_loss_min"] < C.VAL_RISE_SHARE * gained
    assert 0 < sig["gap_final"] < C.VAL_RISE_SHARE * gained
    assert cls.primary != "overfitting"
    # the same small rise with the training set fitted far better than validation: a gap
    sig, _ = fires(C.overfitting, _with_targets(_overfit_run(1.5 * C.VAL_RISE), [10] * 10),
                   "overfitting", {"val_loss_rise", "gap_final"})
    assert sig["gap_final"] >= C.VAL_RISE_SHARE * gained
    # ... unless the validation accuracy held its best: a gap with no generalisation lost
    gap = _with_targets(_overfit_run(1.5 * C.VAL_RISE), [10] * 10)
    for accs, overfits in (([0.5, 0.95, 0.97, 0.965], False), ([0.5, 0.95, 0.97, 0.94], True)):
        with_acc = syn.make_run(*[e for e in gap.events if e["t"] not in ("start", "end")],
                                syn.metric("val_acc", accs))
        assert (C.overfitting(compute(with_acc)) is not None) is overfits, accs
    # the same rise against a prior whose loss is close to the minimum gives back most of it
    sig, _ = fires(C.overfitting, _with_targets(_overfit_run(1.5 * C.VAL_RISE), [60, 40]),
                   "overfitting", {"val_loss_rise"})
    assert sig["val_loss_final"] - sig["val_loss_min"] >= \
        C.VAL_RISE_SHARE * (sig["constant_predictor_loss"] - sig["val_loss_min"])


def test_overfitting_quiet_when_val_minimum_is_last():
    run = syn.make_run(syn.healthy_steps(100, ep=np.repeat(np.arange(10), 10)),
                       syn.metric("val_loss", np.linspace(1.0, 0.4, 10)))
    sig, cls = quiet(C.overfitting, run)
    assert sig["val_loss_min_index"] == sig["val_points"] - 1
    assert cls.primary == HEALTHY


# -- below_zero ------------------------------------------------------------------------------
def _falling_through_zero(n: int = 120) -> np.ndarray:
    """An NLL of probabilities: from about -0.1 down towards -1 (the loss 'falls' steadily)."""
    return -0.1 - 0.8 * (1 - np.exp(-np.arange(n) / 30.0))


@pytest.mark.parametrize("loss", ["nll_loss", "cross_entropy", "mse_loss"])
def test_below_zero_fires_for_a_loss_that_cannot_be_negative(loss):
    targets = syn.targets_counts([300, 300, 300]) if loss != "mse_loss" else \
        syn.targets_moments(0.0, 1.0)
    targets["loss"] = loss
    sig, cls = fires(C.below_zero, syn.make_run(syn.steps_events(_falling_through_zero()),
                                                targets),
                     "convergence_to_wrong_solution", {"loss_below_zero"})
    assert sig["loss_below_zero"] < 0 and sig["loss_kind"] == loss
    assert sig["loss_relative_drop"] > 1  # what a "falling" negative loss reads as otherwise


@pytest.mark.parametrize("loss", ["cosine_embedding_loss", None])
def test_below_zero_quiet_for_a_loss_that_may_be_negative_or_unknown(loss):
    targets = syn.targets_counts([300, 300, 300])
    targets["loss"] = loss
    sig, cls = quiet(C.below_zero, syn.make_run(syn.steps_events(_falling_through_zero()),
                                                targets))
    assert "loss_below_zero" not in sig and cls.primary != "convergence_to_wrong_solution"


def test_below_zero_quiet_for_a_nonnegative_loss_near_zero():
    targets = syn.targets_counts([300, 300, 300])
    sig, _ = quiet(C.below_zero, syn.make_run(syn.steps_events(syn.decay(120)), targets))
    assert sig["loss_min"] >= 0


# -- one_value_targets -----------------------------------------------------------------------
def _collapsing(n: int = 120) -> np.ndarray:
    """A loss that falls to ~0 within a few steps (a bias learned), then stays there."""
    return 2.3 * np.exp(-np.arange(n) / 3.0)


@pytest.mark.parametrize("targets", [syn.targets_counts([640, 0, 0, 0]),
                                     syn.targets_moments(3.0, 0.0)])
def test_one_value_targets_fires_when_the_constant_is_learned(targets):
    """One class in every label, or one value in every regression target: the constant
    predictor is perfect, the loss collapses to it, whatever a metric on other data says."""
    run = syn.make_run(syn.steps_events(_collapsing()), targets,
                       syn.metric("val_acc", [0.25, 0.25, 0.25]))
    fires(C.one_value_targets, run, "convergence_to_wrong_solution",
          {"constant_predictor_loss", "loss_first", "loss_final"})


def test_one_value_targets_quiet_for_a_loss_that_needs_the_inputs():
    """A contrastive loss whose positive is always column 0 (MoCo): one class, but the loss
    stays far from 0 because the logits come from the inputs."""
    loss = 4.0 - 1.5 * (1 - np.exp(-np.arange(120) / 30.0))
    quiet(C.one_value_targets, syn.make_run(syn.steps_events(loss),
                                            syn.targets_counts([640, 0, 0])))


def test_one_value_targets_quiet_with_two_classes():
    quiet(C.one_value_targets, syn.make_run(syn.steps_events(_collapsing()),
                                            syn.targets_counts([600, 40])))


# -- wrong_solution --------------------------------------------------------------------------


@pytest.mark.parametrize("name,signal", [("val_f1", "val_f1_final"), ("f1", "train_f1_final")])
def test_wrong_solution_f1_fires_when_loss_falls_but_f1_stays_zero(name, signal):
    run = syn.make_run(syn.healthy_steps(100), syn.metric(name, [0.5 * C.TRIVIAL_F1] * 5))
    sig, _ = fires(C.wrong_solution, run, "convergence_to_wrong_solution",
                   {"loss_relative_drop", signal})
    assert sig["loss_relative_drop"] >= C.LOSS_FALLS


def test_wrong_solution_f1_quiet_above_trivial_f1():
    run = syn.make_run(syn.healthy_steps(100), syn.metric("val_f1", [1.5 * C.TRIVIAL_F1] * 5))
    _, cls = quiet(C.wrong_solution, run)
    assert cls.primary == HEALTHY


def test_wrong_solution_f1_quiet_when_f1_once_was_clearly_above_zero():
    f1 = [0.0, 2.5 * C.TRIVIAL_F1, 0.5 * C.TRIVIAL_F1]
    sig, _ = quiet(C.wrong_solution, syn.make_run(syn.healthy_steps(100),
                                                  syn.metric("val_f1", f1)))
    assert sig["val_f1_final"] < C.TRIVIAL_F1
    assert sig["val_f1_max"] >= 2 * C.TRIVIAL_F1


@pytest.mark.parametrize("name", ["val_auc", "val_roc_auc", "AUROC"])
def test_an_auc_at_half_is_a_trivial_class_balanced_score(name):
    """An area under the ROC curve scores 0.5 for a constant predictor: read as 2*AUC-1 it is
    trivial (a sigmoid-free softmax over one unit scores AUC 0.5 exactly), 0.9 is not."""
    run = syn.make_run(syn.healthy_steps(100), syn.metric(name, [0.5] * 5))
    fires(C.wrong_solution, run, "convergence_to_wrong_solution", {"loss_relative_drop"})
    sig, _ = quiet(C.wrong_solution, syn.make_run(syn.healthy_steps(100),
                                                  syn.metric(name, [0.9] * 5)))
    assert sig[f"{'val' if 'val' in name else 'train'}_f1_final"] == pytest.approx(0.8)


@pytest.mark.parametrize("name", ["val_pr_auc", "auc_pr"])
def test_a_precision_recall_area_is_not_read_as_a_roc_area(name):
    """A PR-AUC's chance level is the positive rate: 0.3 -> 0.42 is learning, not 'stays ~0'."""
    run = syn.make_run(syn.healthy_steps(100), syn.metric(name, [0.30, 0.36, 0.42]))
    sig, cls = quiet(C.wrong_solution, run)
    assert sig[f"{'val' if 'val' in name else 'train'}_f1_final"] == pytest.approx(0.42)


def _f1_zero_with_drop(drop: float):
    loss = syn.two_level(100, 1.0, 1.0 - drop)
    return syn.make_run(syn.steps_events(loss), syn.metric("val_f1", [0.0] * 5))


def test_wrong_solution_f1_needs_a_falling_loss():
    above = _f1_zero_with_drop(1.5 * C.LOSS_FALLS)
    fires(C.wrong_solution, above, "convergence_to_wrong_solution", {"loss_relative_drop"})
    below = _f1_zero_with_drop((C.PLATEAU_DROP + C.LOSS_FALLS) / 2)
    sig, cls = quiet(C.wrong_solution, below)
    assert C.PLATEAU_DROP <= sig["loss_relative_drop"] < C.LOSS_FALLS
    assert cls.primary == HEALTHY


MAJORITY_COUNTS = [60, 40]  # majority rate 0.6: room on both sides for any margin


def _acc_run(acc_final: float, loss=None):
    loss = syn.decay(100) if loss is None else loss
    return syn.make_run(syn.steps_events(loss), syn.targets_counts(MAJORITY_COUNTS),
                        syn.metric("val_acc", [0.45, 0.5, acc_final]))


def _unmoved_loss_run(level: float, acc: float):
    """A loss that reads ``level`` at every step (it does not depend on the model's output)."""
    return syn.make_run(syn.steps_events(np.full(100, level)),
                        syn.targets_counts(MAJORITY_COUNTS),
                        syn.metric("val_acc", [acc] * 5), syn.metric("acc", [acc] * 5))


def test_loss_without_metric_fires_on_a_loss_far_below_the_prior_at_chance_accuracy():
    """A multi-class loss over one unit reads 0 whatever the model does; accuracy is the prior's."""
    sig, cls = fires(C.loss_without_metric, _unmoved_loss_run(0.0, 0.6),
                     "convergence_to_wrong_solution",
                     {"loss_final", "constant_predictor_loss", "train_acc_final",
                      "majority_rate"})
    assert sig["loss_final"] == 0.0 and sig["constant_predictor_loss"] > 0.5


def test_loss_without_metric_outranks_gradient_growth():
    """Whatever the gradient does under such a loss, the metric shows the wrong solution."""
    steps = syn.steps_events(np.zeros(100), gn=np.geomspace(1.0, 1e5, 100))
    run = syn.make_run(steps, syn.targets_counts(MAJORITY_COUNTS),
                       syn.metric("val_acc", [0.6] * 5), syn.metric("acc", [0.6] * 5))
    sig = compute(run)
    assert C.exploding(sig) is not None
    assert C.classify(sig).primary == "convergence_to_wrong_solution"


def test_loss_without_metric_fires_on_a_loss_that_never_moved_whatever_the_accuracy():
    """One value at every step: the loss cannot have trained the model (its accuracy drifts)."""
    sig, _ = fires(C.loss_without_metric, _unmoved_loss_run(0.0, 0.6 + 3 * C.TRIVIAL_METRIC_MARGIN),
                   "convergence_to_wrong_solution", {"loss_final", "loss_max"})
    assert sig["loss_max"] == sig["loss_min"] == 0.0


@pytest.mark.parametrize("loss, acc", [(syn.decay(100, 1.0, 0.1), 0.6 + 3 * C.TRIVIAL_METRIC_MARGIN),
                                       (np.full(100, 0.4), 0.6)])
def test_loss_without_metric_quiet_when_the_metric_learned_or_the_loss_is_near_the_prior(
        loss, acc):
    """Accuracy above the prior's agrees with a falling low loss; a loss near the prior's
    (0.67) agrees with a trivial accuracy: no contradiction either way."""
    run = syn.make_run(syn.steps_events(loss), syn.targets_counts(MAJORITY_COUNTS),
                       syn.metric("val_acc", [acc] * 5), syn.metric("acc", [acc] * 5))
    sig, _ = quiet(C.loss_without_metric, run)
    assert sig["majority_rate"] == pytest.approx(0.6)


def test_wrong_solution_accuracy_at_majority_rate_fires():
    sig, _ = fires(C.wrong_solution, _acc_run(0.6 + 0.5 * C.TRIVIAL_METRIC_MARGIN),
                   "convergence_to_wrong_solution",
                   {"loss_relative_drop", "val_acc_final", "majority_rate"})
    assert sig["majority_rate"] == pytest.approx(0.6)


def test_an_accuracy_at_the_majority_rate_beside_a_real_f1_is_no_constant_prediction():
    """A weighted fraud model at 0.935 accuracy (the majority rate 0.928) whose printed F1 is
    0.66: the F1, read as a training metric when printed beside a validation accuracy, says it
    finds the rare class; the accuracy sitting near the majority rate is a coincidence."""
    run = syn.make_run(syn.steps_events(syn.decay(100)), syn.targets_counts(MAJORITY_COUNTS),
                       syn.metric("val_acc", [0.45, 0.5, 0.6 + 0.5 * C.TRIVIAL_METRIC_MARGIN]),
                       syn.metric("f1", [0.3, 0.5, 0.66]))
    sig, _ = quiet(C.wrong_solution, run)
    assert sig["train_f1_final"] == pytest.approx(0.66)


def test_wrong_solution_accuracy_below_majority_rate_fires():
    sig, _ = fires(C.wrong_solution, _acc_run(0.6 - 3 * C.TRIVIAL_METRIC_MARGIN),
                   "convergence_to_wrong_solution", {"val_acc_final", "majority_rate"})
    assert sig["val_acc_final"] < sig["majority_rate"]


def test_wrong_solution_accuracy_below_majority_under_a_weighted_loss_is_its_trade_off():
    below = 0.6 - 3 * C.TRIVIAL_METRIC_MARGIN
    weighted = syn.make_run(syn.steps_events(syn.decay(100)),
                            {**syn.targets_counts(MAJORITY_COUNTS), "weighted": True},
                            syn.metric("val_acc", [0.45, 0.5, below]))
    sig, _ = quiet(C.wrong_solution, weighted)  # weight= / class_weight: rare classes' recall
    assert sig["loss_weighted"] == 1
    at = syn.make_run(syn.steps_events(syn.decay(100)),
                      {**syn.targets_counts(MAJORITY_COUNTS), "weighted": True},
                      syn.metric("val_acc", [0.45, 0.5, 0.6]))
    fires(C.wrong_solution, at, "convergence_to_wrong_solution",
          {"val_acc_final", "majority_rate"})  # at the majority rate: weighted or not
    rare = syn.make_run(syn.steps_events(syn.decay(100)),
                        {**syn.targets_counts(MAJORITY_COUNTS), "weighted": True},
                        syn.metric("val_acc", [0.45, 0.5, 0.4]))
    fires(C.wrong_solution, rare, "convergence_to_wrong_solution",
          {"val_acc_final", "majority_rate"})  # the rare class for every row: over-weighted


def test_wrong_solution_accuracy_beyond_margin_is_quiet():
    sig, cls = quiet(C.wrong_solution, _acc_run(0.6 + 3 * C.TRIVIAL_METRIC_MARGIN))
    assert abs(sig["val_acc_final"] - sig["majority_rate"]) > C.TRIVIAL_METRIC_MARGIN
    assert cls.primary == HEALTHY


def test_wrong_solution_accuracy_with_loss_fallen_to_constant_predictor_fires():
    # fell a little, to the prior's loss: it learned the prior and nothing else
    base, _ = constant_predictor({"loss": "cross_entropy", "counts": MAJORITY_COUNTS})
    start = base / (1 - 0.5 * (C.PLATEAU_DROP + C.LOSS_FALLS))
    run = _acc_run(0.6, loss=syn.two_level(100, start, base))
    sig, cls = fires(C.wrong_solution, run, "convergence_to_wrong_solution",
                     {"loss_relative_drop", "val_acc_final", "majority_rate"})
    assert C.PLATEAU_DROP <= sig["loss_relative_drop"] < C.LOSS_FALLS
    assert "loss_not_decreasing" in cls.secondary


def test_wrong_solution_quiet_when_the_loss_never_moved_from_the_baseline():
    # nothing learned at all: a plateau (zero_grad misplaced, lr far too low), not a wrong fit
    base, _ = constant_predictor({"loss": "cross_entropy", "counts": MAJORITY_COUNTS})
    sig, cls = quiet(C.wrong_solution, _acc_run(0.6, loss=np.full(100, base)))
    assert sig["loss_relative_drop"] < C.PLATEAU_DROP
    assert cls.primary == "loss_not_decreasing"


def test_wrong_solution_accuracy_with_flat_loss_below_baseline_is_quiet():
    base, _ = constant_predictor({"loss": "cross_entropy", "counts": MAJORITY_COUNTS})
    sig, cls = quiet(C.wrong_solution, _acc_run(0.6, loss=np.full(100, 0.7 * C.BASELINE_MARGIN
                                                                  * base)))
    assert sig["loss_final"] < C.BASELINE_MARGIN * sig["constant_predictor_loss"]
    assert cls.primary == "loss_not_decreasing"


def test_flat_loss_far_below_the_constant_predictor_is_converged_not_stuck():
    base, _ = constant_predictor({"loss": "cross_entropy", "counts": MAJORITY_COUNTS})
    sig, cls = quiet(C.not_decreasing, _acc_run(0.95, loss=np.full(100, 0.3 * base)))
    assert sig["loss_relative_drop"] < C.PLATEAU_DROP
    assert C.tentative(cls)  # flat at 30%: settled, for the experiments to decide
    sig, cls = quiet(C.not_decreasing, _acc_run(0.95, loss=np.full(100, 0.1 * base)))
    assert cls.primary == "healthy"


# -- vanishing -------------------------------------------------------------------------------


def _vanishing_run(ratio: float, loss):
    mgn = [{"layers.0": ratio, "layers.1": 0.1, "layers.2": 1.0}] * len(loss)
    return syn.make_run(syn.steps_events(loss, mgn=mgn))


def test_vanishing_fires_below_ratio_when_loss_barely_moves():
    loss = syn.two_level(100, 1.0, 1.0 - 2 * C.PLATEAU_DROP)  # not a plateau, barely moving
    sig, cls = fires(C.vanishing, _vanishing_run(0.1 * C.VANISH_RATIO, loss),
                     "gradient_instability", {"first_to_last_grad_ratio", "loss_relative_drop"})
    assert sig["first_to_last_grad_ratio"] == pytest.approx(0.1 * C.VANISH_RATIO)
    assert (sig["first_layer"], sig["last_layer"]) == ("layers.0", "layers.2")
    assert cls.secondary == ()


def test_a_flat_loss_is_the_category_and_vanishing_gradients_its_secondary():
    """The symptom the user sees (a flat loss) decides; the mechanism measured inside ranks
    second, so Isolate still runs the gradient probes for it."""
    flat = syn.two_level(100, 1.0, 1.0 - 0.2 * C.PLATEAU_DROP)
    cls = classify_and_check(compute(_vanishing_run(0.1 * C.VANISH_RATIO, flat)))
    assert (cls.primary, cls.secondary) == ("loss_not_decreasing", ("gradient_instability",))


def test_vanishing_quiet_above_ratio():
    loss = syn.two_level(100, 1.0, 1.0 - 2 * C.PLATEAU_DROP)
    sig, cls = quiet(C.vanishing, _vanishing_run(10 * C.VANISH_RATIO, loss))
    assert sig["first_to_last_grad_ratio"] >= C.VANISH_RATIO
    assert cls.primary == HEALTHY


def test_vanishing_quiet_when_loss_falls_well():
    sig, cls = quiet(C.vanishing, _vanishing_run(0.1 * C.VANISH_RATIO, syn.decay(100)))
    assert sig["first_to_last_grad_ratio"] < C.VANISH_RATIO
    assert cls.primary == HEALTHY


# -- not_decreasing --------------------------------------------------------------------------


def test_not_decreasing_fires_below_plateau_drop():
    run = syn.make_run(syn.steps_events(syn.two_level(100, 1.0, 1.0 - 0.5 * C.PLATEAU_DROP)))
    sig, _ = fires(C.not_decreasing, run, "loss_not_decreasing",
                   {"loss_initial", "loss_final", "loss_relative_drop"})
    assert sig["loss_relative_drop"] == pytest.approx(0.5 * C.PLATEAU_DROP)


def test_not_decreasing_quiet_above_plateau_drop():
    run = syn.make_run(syn.steps_events(syn.two_level(100, 1.0, 1.0 - 2 * C.PLATEAU_DROP)))
    sig, cls = quiet(C.not_decreasing, run)
    assert sig["loss_relative_drop"] == pytest.approx(2 * C.PLATEAU_DROP)
    assert cls.primary == HEALTHY


def test_not_decreasing_needs_min_steps():
    fires(C.not_decreasing, syn.make_run(syn.steps_events(np.ones(C.MIN_STEPS))),
          "loss_not_decreasing", {"loss_relative_drop"})
    sig, cls = quiet(C.not_decreasing, syn.make_run(syn.steps_events(np.ones(C.MIN_STEPS - 1))))
    assert cls.primary == HEALTHY
    assert any("too short" in e.detail for e in cls.evidence)


@pytest.mark.parametrize("ratio, verdict", [
    (0.5 * C.UPDATE_RATIO_LOW, "too small"), (2 * C.UPDATE_RATIO_LOW, "usual range"),
    (0.5 * C.UPDATE_RATIO_HIGH, "usual range"), (2 * C.UPDATE_RATIO_HIGH, "overshoot")])
def test_not_decreasing_cites_how_large_the_updates_are(ratio, verdict):
    """The update/weight ratio (every 50th step) backs a plateau: steps too small, or too large."""
    n = 200
    ur = np.full(n, np.nan)
    ur[::50] = ratio * np.array([0.5, 1.0, 1.0, 3.0])  # a median of ``ratio``
    run = syn.make_run(syn.steps_events(syn.two_level(n, 1.0, 1.0 - 0.5 * C.PLATEAU_DROP), ur=ur))
    sig, cls = fires(C.not_decreasing, run, "loss_not_decreasing",
                     {"loss_relative_drop", "update_ratio_median"})
    assert sig["update_ratio_median"] == pytest.approx(ratio) and sig["update_ratio_points"] == 4
    [ev] = [e for e in cls.evidence if e.signal == "update_ratio_median"]
    assert verdict in ev.detail and "4 readings" in ev.detail


def test_not_decreasing_without_update_ratios_cites_none():
    run = syn.make_run(syn.steps_events(syn.two_level(100, 1.0, 1.0)))
    sig, cls = fires(C.not_decreasing, run, "loss_not_decreasing", {"loss_relative_drop"})
    assert "update_ratio_median" not in sig
    assert "update_ratio_median" not in {e.signal for e in cls.evidence}


def _baseline_run(final_over_base: float):
    counts = [50, 50]
    base, _ = constant_predictor({"loss": "cross_entropy", "counts": counts})
    loss = syn.two_level(100, 2.0, base * final_over_base)
    return syn.make_run(syn.steps_events(loss), syn.targets_counts(counts))


def test_not_decreasing_fires_when_loss_stalls_at_constant_predictor():
    sig, _ = fires(C.not_decreasing, _baseline_run(1.0), "loss_not_decreasing",
                   {"loss_final", "constant_predictor_loss"})
    assert sig["constant_predictor_loss"] == pytest.approx(math.log(2))
    assert sig["loss_relative_drop"] >= C.PLATEAU_DROP  # the loss fell, but only to the baseline


def test_not_decreasing_quiet_when_loss_beats_constant_predictor():
    sig, cls = quiet(C.not_decreasing, _baseline_run(0.9 * C.BASELINE_MARGIN))
    assert sig["loss_final"] < C.BASELINE_MARGIN * sig["constant_predictor_loss"]
    # flat at 0.86x the baseline: only the tentative plateau, which an experiment must back
    assert cls.primary == "loss_not_decreasing" and C.tentative(cls)
    assert C.without_cause(cls).primary == HEALTHY


# -- plateau (tentative) ---------------------------------------------------------------------


def _settled(share: float, tail_fall: float = 0.0, n: int = 200) -> Run:
    """Falls from ln 2 to ``share`` x ln 2 in the first half, then falls ``tail_fall`` more."""
    base = math.log(2)
    first = np.linspace(base, share * base / (1 - tail_fall), n // 2)
    second = np.linspace(share * base / (1 - tail_fall), share * base, n - n // 2)
    return syn.make_run(syn.steps_events(np.concatenate([first, second])),
                        syn.targets_counts([50, 50]))


def test_plateau_fires_tentatively_when_the_loss_settles_well_above_zero():
    sig, cls = fires(C.plateau, _settled(0.6), "loss_not_decreasing",
                     {"loss_floor_share", "loss_tail_drop"})
    assert C.tentative(cls)
    revised = C.without_cause(cls)
    assert revised.primary == HEALTHY
    assert [e.signal for e in revised.evidence].count("loss_floor_share") == 1


def test_plateau_fires_on_a_slow_fall_and_is_quiet_while_learning_fast():
    sig, _ = fires(C.plateau, _settled(0.6, tail_fall=0.5 * C.TAIL_DROP), "loss_not_decreasing",
                   {"loss_floor_share", "loss_tail_drop"})
    assert 0 < sig["loss_tail_drop"] < C.TAIL_DROP
    sig, _ = quiet(C.plateau, _settled(0.6, tail_fall=1.5 * C.TAIL_DROP))
    assert sig["loss_tail_drop"] >= C.TAIL_DROP


def test_a_short_run_still_falling_is_a_tentative_plateau():
    """Few optimizer steps (a batch holding the data): still learning fast, but it stopped."""
    short = C.FEW_STEPS // 4
    sig, cls = fires(C.plateau, _settled(0.8, tail_fall=1.5 * C.TAIL_DROP, n=short),
                     "loss_not_decreasing", {"loss_floor_share", "steps"})
    assert sig["steps"] < C.FEW_STEPS and C.tentative(cls)
    # the same curve over many steps is a run still learning: not a plateau
    quiet(C.plateau, _settled(0.8, tail_fall=1.5 * C.TAIL_DROP, n=4 * C.FEW_STEPS))
    quiet(C.plateau, _settled(0.5 * C.FLOOR_SHARE, n=short))  # a short run that learned


def _held(share: float, updated: float, tail_fall: float = 0.0) -> Run:
    """A settled loss in a run whose steps updated ``updated`` of the model's parameters."""
    run = _settled(share, tail_fall)
    trained = {"t": "trained", "params": 1000, "updated": int(1000 * updated)}
    return Run([*run.events[:-1], trained, run.events[-1]])


def test_a_loss_held_up_by_weights_that_never_train_is_a_tentative_plateau():
    """Most parameters never updated (frozen, left out of the optimizer): a loss well below the
    usual floor is suspect too, and so is one still falling, for an experiment to decide."""
    low = 0.5 * C.SETTLED_FLOOR
    assert C.HELD_FLOOR < low
    for tail in (0.0, 1.5 * C.TAIL_DROP):
        sig, cls = fires(C.plateau, _held(low, 0.1, tail), "loss_not_decreasing",
                         {"loss_floor_share", "untrained_share"})
        assert sig["untrained_share"] == pytest.approx(0.9) and C.tentative(cls)
        assert "loss_tail_drop" not in {e.signal for e in cls.evidence}
        assert C.without_cause(cls).primary == HEALTHY
    quiet(C.plateau, _held(low, 1 - 0.9 * C.UNTRAINED_SHARE))  # most of the model trains
    quiet(C.plateau, _held(0.5 * C.HELD_FLOOR, 0.1))  # it learned all the same


def _stalled(share: float, collapsed: float, tail_fall: float = 0.0) -> Run:
    """A settled loss in a run whose rate sat below 1% of its peak for ``collapsed`` of it."""
    run = _settled(share, tail_fall)
    n = len(run.steps)
    low = int(n * (1 - collapsed))
    lrs = [{"t": "lr", "step": 0, "lr": 0.1}, {"t": "lr", "step": low, "lr": 1e-6}]
    return Run([*run.events[:-1], *lrs, run.events[-1]])


def test_a_warm_up_from_near_zero_is_no_collapsed_rate():
    """A rate rising from 1e-5 to 0.1 (a warm-up, or a schedule that keeps rising) starts below
    1% of its peak: that is before the peak, not a decay. Falling after it is one."""
    run = _settled(0.5 * C.FLOOR_SHARE)
    n = len(run.steps)
    rising = [{"t": "lr", "step": i, "lr": 1e-5 * 10 ** (4 * i / n)} for i in range(0, n, 10)]
    sig = compute(Run([*run.events[:-1], *rising, run.events[-1]]))
    assert sig["lr_collapsed_share"] == 0.0
    falling = [e for e in rising if e["step"] < n // 4] + [{"t": "lr", "step": n // 2, "lr": 1e-9}]
    sig = compute(Run([*run.events[:-1], *falling, run.events[-1]]))
    assert sig["lr_collapsed_share"] == pytest.approx(0.5, abs=0.02)


def test_a_loss_settled_while_the_rate_had_collapsed_is_a_tentative_plateau():
    """A schedule that all but stopped training (ExponentialLR(gamma=0.2)): a loss well below the
    usual floor is suspect, for lr_schedule's experiment to decide; a settled loss is needed."""
    low = 0.5 * C.SETTLED_FLOOR
    sig, cls = fires(C.plateau, _stalled(low, 0.9), "loss_not_decreasing",
                     {"loss_floor_share", "lr_collapsed_share"})
    assert sig["lr_collapsed_share"] >= C.LR_STALLED and C.tentative(cls)
    quiet(C.plateau, _stalled(low, 0.5 * C.LR_STALLED))  # the rate held for most of the run
    quiet(C.plateau, _stalled(low, 0.9, tail_fall=1.5 * C.TAIL_DROP))  # still falling fast
    quiet(C.plateau, _stalled(0.5 * C.HELD_FLOOR, 0.9))  # it learned all the same


def _two_stages(at_step: int | None, second: np.ndarray) -> Run:
    """A pre-training whose loss falls 0.8 -> 0.1 over 100 steps, then ``second``; an optimizer
    built at step ``at_step`` (None: only the first, at step 0)."""
    first = np.linspace(0.8, 0.1, 100)
    events = syn.steps_events(np.concatenate([first, second]))
    built = [{"t": "optimizer", "cls": "Adam", "hyper": {"lr": 1e-3}, "at_step": 0}]
    if at_step is not None:
        built.append({"t": "optimizer", "cls": "Adam", "hyper": {"lr": 1e-3}, "at_step": at_step})
    return syn.make_run(built[:1], events[:at_step or 0], built[1:], events[at_step or 0:],
                        syn.targets_counts([20] * 5))


def test_the_last_training_stage_is_the_runs_symptom():
    """A fine-tune whose new head is left out of its optimizer: its loss sits at the prior
    (ln 5) after a pre-training that fell to 0.1. Read as one curve, the loss "grew" 2x and
    the run was called unstable; the second optimizer starts a stage, and its flat loss is
    the symptom. One optimizer only: the same curve is still one stage."""
    flat = np.full(100, math.log(5))
    sig, cls = fires(C.not_decreasing, _two_stages(100, flat), "loss_not_decreasing",
                     {"loss_relative_drop"})
    assert sig["stage_start"] == 100 and cls.primary == "loss_not_decreasing"
    assert "gradient_instability" not in cls.secondary
    sig = compute(_two_stages(None, flat))
    assert "stage_start" not in sig and C.classify(sig).primary == "gradient_instability"
    # a fine-tune going on from what was learned (its loss starts low): one curve
    sig = compute(_two_stages(100, np.linspace(0.1, 0.09, 100)))
    assert "stage_start" not in sig
    # optimizers re-built every epoch are the loop's pattern, not stages
    rebuilt = _two_stages(100, flat)
    again = {"t": "optimizer", "cls": "Adam", "hyper": {"lr": 1e-3}, "at_step": 150}
    assert "stage_start" not in compute(Run([*rebuilt.events[:-1], again, rebuilt.events[-1]]))


def test_plateau_quiet_below_the_floor_share():
    sig, cls = quiet(C.plateau, _settled(0.5 * C.SETTLED_FLOOR))
    assert cls.primary == HEALTHY and not C.tentative(cls)


def test_a_long_run_settled_below_the_usual_floor_is_a_tentative_plateau():
    """Hidden layers without activation, or a weight decay pulling the weights to zero, leave
    a loss settled at 25-40% of the constant predictor's (the linear model's optimum on two
    moons): it looked healthy. A settled long run down to SETTLED_FLOOR is suspect, for the
    experiments to decide; one still falling fast is not, nor a short run that got there."""
    share = 0.5 * (C.SETTLED_FLOOR + C.FLOOR_SHARE)
    sig, cls = fires(C.plateau, _settled(share), "loss_not_decreasing",
                     {"loss_floor_share", "loss_tail_drop"})
    assert C.SETTLED_FLOOR <= sig["loss_floor_share"] < C.FLOOR_SHARE and C.tentative(cls)
    sig, _ = quiet(C.plateau, _settled(share, tail_fall=2 * C.SETTLED_TAIL))  # slowly learning
    assert C.SETTLED_TAIL <= sig["loss_tail_drop"] < C.TAIL_DROP
    quiet(C.plateau, _settled(share, n=C.FEW_STEPS // 4))
    fires(C.plateau, _settled(0.5 * (1 + C.FLOOR_SHARE), tail_fall=2 * C.SETTLED_TAIL),
          "loss_not_decreasing", {"loss_floor_share"})  # (above the usual floor: as before)


def test_a_plateau_with_the_strong_rule_is_not_tentative():
    # the loss never moved at all: not_decreasing's own evidence, not an experiment's question
    run = syn.make_run(syn.steps_events(np.full(200, 0.6 * math.log(2))),
                       syn.targets_counts([50, 50]))
    cls = classify_and_check(compute(run))
    assert cls.primary == "loss_not_decreasing" and not C.tentative(cls)


def _cuda_run(growth_mb: float, rss_flat: bool = True):
    n = 100
    i = np.arange(n)
    cuda = (2000.0 + growth_mb * (i - n // 10) / (n - 1 - n // 10)) * syn.MB
    return syn.make_run(syn.healthy_steps(n, cuda=cuda, rss=np.full(n, 500.0 * syn.MB)))


def test_memory_growth_fires_on_gpu_memory_while_process_memory_is_flat():
    sig, _ = fires(C.memory_growth, _cuda_run(1.2 * C.RSS_GROWTH_MB), "memory_issue",
                   {"cuda_growth_mb", "cuda_slope_mb_per_step", "cuda_growth_r2"})
    assert sig["rss_growth_mb"] == 0 and sig["cuda_growth_mb"] == pytest.approx(
        1.2 * C.RSS_GROWTH_MB, rel=1e-3)


def test_memory_growth_quiet_on_flat_gpu_memory():
    sig, cls = quiet(C.memory_growth, _cuda_run(0.5 * C.RSS_GROWTH_MB))
    assert sig["cuda_growth_mb"] < C.RSS_GROWTH_MB and cls.primary == HEALTHY


# -- broadcast_loss, read by gradients ---------------------------------------------------------


@pytest.mark.parametrize("corr,slope,fires_", [(1.0, 2.0, True), (1.0, 1.0, True),
                                               (0.9, 2.0, False), (1.0, 0.25, False)])
def test_a_loss_that_pairs_no_row_is_a_wrong_solution(corr, slope, fires_):
    """A hand-written loss: the one-column output's gradient read at 5 steps, each time affine
    in the prediction alone with a squared error's slope (2 / B: every prediction pulled to
    the targets' mean): a wrong solution, whatever the curve. Paired (the gradient follows
    each row's target), or affine with another slope (a sigmoid loss against one label over a
    narrow range of outputs): no."""
    reads = [{"t": "output_grads", "step": s, "rows": 32, "rank_corr": corr, "corr": corr,
              "slope": slope / 32} for s in (2, 5, 11, 23, 47)]
    run = syn.make_run(syn.healthy_steps(80), reads)
    if fires_:
        sig, _ = fires(C.broadcast_loss, run, "convergence_to_wrong_solution", {"loss_unpaired"})
        assert sig["loss_unpaired"] == 1.0
    else:
        sig, _ = quiet(C.broadcast_loss, run)
        assert sig["loss_unpaired"] == 0.0


# -- retraced --------------------------------------------------------------------------------


def _traced_run(traces: int, steps: int = 80, rss_mb_per_step: float = 0.0):
    rss = syn.MB * (300 + rss_mb_per_step * np.arange(steps))
    return syn.make_run(syn.healthy_steps(steps, rss=rss),
                        {"t": "traces", "count": traces, "steps": steps, "file": "train.py",
                         "line": 30})


def test_retraced_fires_when_the_compiled_step_is_traced_on_many_steps():
    sig, _ = fires(C.retraced, _traced_run(80), "performance_issue",
                   {"step_traces", "step_traced_share"})
    assert sig["step_traced_share"] == 1.0


@pytest.mark.parametrize("traces,steps", [(C.RETRACED_MIN - 1, 20), (2, 80),
                                          (int(C.RETRACED_SHARE * 400) - 1, 400)])
def test_retraced_quiet_below_its_count_or_its_share(traces, steps):
    sig, cls = quiet(C.retraced, _traced_run(traces, steps))
    assert cls.primary == HEALTHY


def test_classify_prefers_a_named_category_that_fired_and_keeps_the_others():
    """Two categories fired (a step traced every step keeps a graph each: memory grows too):
    the table's order makes memory primary; ``prefer`` (Isolate's confirmed cause) makes the
    time primary, citing its own evidence, with memory secondary; a category that did not fire
    cannot be preferred."""
    sig = compute(_traced_run(200, 200, rss_mb_per_step=2.0))
    plain = classify_and_check(sig)
    assert (plain.primary, plain.secondary) == ("memory_issue", ("performance_issue",))
    chosen = C.classify(sig, prefer="performance_issue")
    _check_evidence(sig, chosen.evidence)
    assert (chosen.primary, chosen.secondary) == ("performance_issue", ("memory_issue",))
    assert {e.signal for e in chosen.evidence} == {"step_traces", "step_traced_share"}
    assert C.classify(sig, prefer="overfitting") == plain


# -- gpu_idle --------------------------------------------------------------------------------


def _gpu_run(util: float, step_ms: float):
    n = 60
    utils = np.full(n, np.nan)
    utils[::10] = util
    return syn.make_run(syn.healthy_steps(n, dt=np.full(n, step_ms / 1000), dw=np.zeros(n),
                                          gpu_util=utils, cuda=np.full(n, syn.MB)))


def test_gpu_idle_fires_when_long_steps_leave_the_gpu_waiting():
    sig, _ = fires(C.gpu_idle, _gpu_run(C.GPU_IDLE_UTIL / 3, 2 * C.GPU_IDLE_STEP_MS),
                   "performance_issue", {"gpu_util_median", "step_ms", "gpu_util_samples"})
    assert sig["gpu_util_median"] == pytest.approx(C.GPU_IDLE_UTIL / 3)
    assert sig["gpu_util_samples"] == 6


def test_gpu_idle_quiet_when_busy_or_steps_are_short():
    sig, cls = quiet(C.gpu_idle, _gpu_run(2 * C.GPU_IDLE_UTIL, 2 * C.GPU_IDLE_STEP_MS))
    assert cls.primary == HEALTHY
    sig, cls = quiet(C.gpu_idle, _gpu_run(C.GPU_IDLE_UTIL / 3, C.GPU_IDLE_STEP_MS / 2))
    assert sig["gpu_util_median"] < C.GPU_IDLE_UTIL and cls.primary == HEALTHY


def test_no_gpu_no_gpu_signals():
    sig, _ = quiet(C.gpu_idle, _timed_run(0.1, 1.0))
    assert "gpu_util_median" not in sig and "cuda_growth_mb" not in sig


# -- slow_data -------------------------------------------------------------------------------


def _timed_run(frac: float, dw_ms: float):
    n = 50
    dw = np.full(n, dw_ms / 1000.0)
    return syn.make_run(syn.healthy_steps(n, dt=dw / frac, dw=dw))


def test_slow_data_fires_above_both_thresholds():
    frac = (C.DATA_WAIT_FRACTION + 1) / 2
    sig, _ = fires(C.slow_data, _timed_run(frac, 10 * C.DATA_WAIT_MS), "performance_issue",
                   {"data_wait_fraction", "data_wait_ms", "step_ms"})
    assert sig["data_wait_fraction"] == pytest.approx(frac)
    assert sig["data_wait_ms"] == pytest.approx(10 * C.DATA_WAIT_MS)


def test_slow_data_quiet_below_fraction():
    frac = C.DATA_WAIT_FRACTION / 2
    sig, cls = quiet(C.slow_data, _timed_run(frac, 10 * C.DATA_WAIT_MS))
    assert sig["data_wait_fraction"] == pytest.approx(frac)
    assert cls.primary == HEALTHY


def test_slow_data_quiet_below_wait_ms():
    frac = (C.DATA_WAIT_FRACTION + 1) / 2
    sig, cls = quiet(C.slow_data, _timed_run(frac, 0.5 * C.DATA_WAIT_MS))
    assert sig["data_wait_fraction"] >= C.DATA_WAIT_FRACTION
    assert sig["data_wait_ms"] == pytest.approx(0.5 * C.DATA_WAIT_MS)
    assert cls.primary == HEALTHY


# -- the whole table -------------------------------------------------------------------------


def test_hybrid_nonfinite_and_oom_keeps_both():
    loss = syn.decay(30)
    loss[25:] = math.nan
    run = syn.make_run(syn.steps_events(loss), syn.nonfinite(25, "loss", "head"),
                       syn.error("oom", step=30))
    cls = classify_and_check(compute(run))
    assert cls.primary == "gradient_instability"
    assert cls.secondary == ("memory_issue",)
    cited = {e.signal for e in cls.evidence}
    assert "first_nonfinite_step" in cited
    assert "error" not in cited  # evidence backs the primary only


def test_secondary_category_listed_once_when_two_rules_find_it():
    rss = (500 + 3 * C.RSS_GROWTH_MB * np.arange(100) / 99) * syn.MB
    run = syn.make_run(syn.healthy_steps(100, rss=rss), syn.nonfinite(90),
                       syn.error("oom", step=100))
    sig = compute(run)
    assert C.oom(sig) is not None and C.memory_growth(sig) is not None
    cls = classify_and_check(sig)
    assert cls.primary == "gradient_instability"
    assert cls.secondary == ("memory_issue",)


def test_same_category_rules_merge_evidence_not_secondaries():
    gn = np.ones(100)
    gn[60] = 10 * C.GRAD_GROWTH
    run = syn.make_run(syn.steps_events(np.linspace(1.0, 0.8, 100), gn=gn),
                       syn.nonfinite(61, "grad", "layers.1"))
    cls = classify_and_check(compute(run))
    assert cls.primary == "gradient_instability"
    assert cls.secondary == ()
    cited = [e.signal for e in cls.evidence]
    assert {"first_nonfinite_step", "grad_norm_growth"} <= set(cited)
    assert len(cited) == len(set(cited))


def test_clean_record_is_healthy():
    n, epochs = 100, 10
    ep = np.repeat(np.arange(epochs), n // epochs)
    run = syn.make_run(
        syn.healthy_steps(n, ep=ep, dt=np.full(n, 0.05), dw=np.full(n, 0.001),
                          rss=np.full(n, 800 * syn.MB),
                          mgn=[{"layers.0": 0.5, "layers.1": 0.7, "layers.2": 1.0}] * n),
        syn.metric("val_loss", np.linspace(1.0, 0.4, epochs)),
        syn.metric("val_acc", np.linspace(0.5, 0.9, epochs)),
        syn.targets_counts(MAJORITY_COUNTS),
    )
    sig = compute(run)
    for rule in C.RULES:
        assert rule(sig) is None, rule.__name__
    cls = classify_and_check(sig)
    assert cls.primary == HEALTHY
    assert cls.secondary == ()
    cited = {e.signal for e in cls.evidence}
    assert {"steps", "loss_relative_drop", "val_loss_rise", "data_wait_fraction"} <= cited


def test_empty_record_is_healthy_but_too_short():
    cls = classify_and_check(compute(syn.make_run()))
    assert cls.primary == HEALTHY
    assert any("too short" in e.detail for e in cls.evidence)


# -- constant predictor ----------------------------------------------------------------------


@pytest.mark.parametrize("loss", ["cross_entropy", "nll_loss"])
def test_constant_predictor_class_counts(loss):
    base, majority = constant_predictor({"loss": loss, "n": 100, "counts": [30, 10, 60]})
    p = np.array([0.3, 0.1, 0.6])
    assert base == pytest.approx(float(-(p * np.log(p)).sum()))
    assert majority == pytest.approx(0.6)


def test_constant_predictor_ignores_empty_classes():
    base, majority = constant_predictor({"loss": "cross_entropy", "counts": [0, 5, 5, 0]})
    assert base == pytest.approx(math.log(2))
    assert majority == pytest.approx(0.5)


@pytest.mark.parametrize("loss", ["binary_cross_entropy", "binary_cross_entropy_with_logits"])
def test_constant_predictor_bce(loss):
    base, majority = constant_predictor({"loss": loss, "n": 50, "mean": 0.2, "var": 0.16})
    assert base == pytest.approx(-(0.2 * math.log(0.2) + 0.8 * math.log(0.8)))
    assert majority == pytest.approx(0.8)


@pytest.mark.parametrize("mean", [0.0, 1.0])
def test_constant_predictor_bce_degenerate_targets(mean):
    # one class only: predicting it always is perfect, and is the majority rate
    assert constant_predictor({"loss": "binary_cross_entropy", "mean": mean, "var": 0.0}) == \
        (0.0, 1.0)


@pytest.mark.parametrize("loss", ["l1_loss", "smooth_l1_loss", "huber_loss"])
@pytest.mark.parametrize("sd", [0.05, 0.7, 4.0])
def test_constant_predictor_robust_losses_match_sampled_normal_targets(loss, sd):
    y = np.random.default_rng(0).normal(2.0, sd, 400_000)
    r = y - y.mean()
    sampled = np.abs(r).mean() if loss == "l1_loss" else \
        np.where(np.abs(r) < 1, 0.5 * r * r, np.abs(r) - 0.5).mean()
    base, majority = constant_predictor({"loss": loss, "mean": 2.0, "var": sd * sd})
    assert base == pytest.approx(sampled, rel=0.01) and majority is None


def test_constant_predictor_mse_is_target_variance():
    assert constant_predictor({"loss": "mse_loss", "n": 10, "mean": 3.0, "var": 2.5}) == \
        (pytest.approx(2.5), None)


@pytest.mark.parametrize("targets", [None, {}, {"loss": "kl_div", "mean": 1.0, "var": 1.0},
                                     {"loss": "cross_entropy", "mean": 0.3, "var": 0.2}])
def test_constant_predictor_unknown(targets):
    assert constant_predictor(targets) == (None, None)


def test_signals_use_the_last_targets_event():
    run = syn.make_run(syn.healthy_steps(20), syn.targets_counts([90, 10]),
                       syn.targets_counts([50, 50]))
    sig = compute(run)
    assert sig["constant_predictor_loss"] == pytest.approx(math.log(2))
    assert sig["majority_rate"] == pytest.approx(0.5)


def test_signals_mse_targets():
    run = syn.make_run(syn.healthy_steps(20), syn.targets_moments(0.0, 4.0))
    sig = compute(run)
    assert sig["constant_predictor_loss"] == pytest.approx(4.0)
    assert sig["majority_rate"] is None


# -- metric roles the rules depend on --------------------------------------------------------


@pytest.mark.parametrize("name,role", [
    ("loss", ("train", "loss")), ("train_loss", ("train", "loss")),
    ("val_loss", ("val", "loss")), ("Loss/validation", ("val", "loss")),
    ("eval_loss", ("val", "loss")), ("valloss", ("val", "loss")),
    ("acc", ("train", "acc")), ("val_accuracy", ("val", "acc")), ("test/top1", ("val", "acc")),
    ("f1", ("train", "f1")), ("val_macro_f1", ("val", "f1")),
    ("lr", None), ("epoch_time", None),
])
def test_metric_role(name, role):
    assert metric_role(name) == role


def test_wrong_solution_a_useful_f1_outranks_accuracy_below_the_majority_rate():
    """Class weights trade accuracy for minority recall: F1 says the model is not trivial."""
    run = syn.make_run(syn.steps_events(syn.decay(100)), syn.targets_counts(MAJORITY_COUNTS),
                       syn.metric("val_acc", [0.45, 0.5, 0.6 - 3 * C.TRIVIAL_METRIC_MARGIN]),
                       syn.metric("val_f1", [0.1, 0.3, 0.55]))
    sig, cls = quiet(C.wrong_solution, run)
    assert sig["val_acc_final"] < sig["majority_rate"] and cls.primary == HEALTHY


# -- exploding: a blow-up within the first steps ---------------------------------------------


def _early_blowup(peak: float, lasting: bool = True) -> Run:
    """Starts at 1.0, is driven to ``peak`` within the first steps, then settles back."""
    loss = syn.decay(100, 1.0, 0.1)
    loss[3:14 if lasting else 4] = peak  # after the 3 readings of the untrained model
    return syn.make_run(syn.steps_events(loss), syn.targets_counts([50, 50]))


def test_exploding_fires_on_a_lasting_blowup_in_the_first_steps():
    sig, _ = fires(C.exploding, _early_blowup(3 * C.SPIKE_RATIO), "gradient_instability",
                   {"loss_first", "loss_max"})
    assert sig["loss_peak_ratio"] == pytest.approx(3 * C.SPIKE_RATIO / sig["loss_first"])


def test_exploding_quiet_below_the_peak_ratio():
    sig, _ = quiet(C.exploding, _early_blowup(0.8 * C.SPIKE_RATIO))
    assert sig["loss_peak_ratio"] < C.SPIKE_RATIO


def test_exploding_quiet_on_one_transient_step_at_the_start():
    sig, _ = quiet(C.exploding, _early_blowup(3 * C.SPIKE_RATIO, lasting=False))
    assert sig["loss_peak_ratio"] >= C.SPIKE_RATIO and sig["loss_initial"] < 2 * sig["loss_first"]


# -- generalisation_gap ----------------------------------------------------------------------


def _gap_run(train_final: float, val_acc: float | None = None, val_loss=None,
             train_acc: float | None = None, counts=(50, 50)) -> Run:
    loss = syn.decay(100, 0.7, train_final)
    events = [syn.steps_events(loss, ep=np.repeat(np.arange(10), 10)), syn.targets_counts(counts)]
    if val_acc is not None:
        events.append(syn.metric("val_acc", np.linspace(0.6, val_acc, 10)))
    if val_loss is not None:  # a final value reached in a straight line, or the whole curve
        events.append(syn.metric("val_loss", np.linspace(0.69, val_loss, 10)
                                 if np.isscalar(val_loss) else val_loss))
    if train_acc is not None:
        events.append(syn.metric("acc", np.linspace(0.6, train_acc, 10)))
    return syn.make_run(*events)


def test_gap_fires_when_a_near_zero_training_loss_meets_a_poor_validation_accuracy():
    # a mean cross-entropy of 0.001 allows at most 0.14% training errors
    sig, _ = fires(C.generalisation_gap, _gap_run(0.001, val_acc=0.70), "overfitting",
                   {"train_acc_bound", "val_acc_final", "acc_gap"})
    assert sig["train_acc_bound"] == pytest.approx(1 - sig["loss_final"] / math.log(2))


def test_gap_quiet_when_the_bound_leaves_room_for_the_validation_accuracy():
    # a training loss of 0.2 allows 29% errors: a validation accuracy of 0.8 is no gap
    sig, cls = quiet(C.generalisation_gap, _gap_run(0.2, val_acc=0.80))
    assert sig["acc_gap"] < C.ACC_GAP and cls.primary == HEALTHY


def test_gap_reads_a_printed_training_accuracy_over_the_bound():
    sig, _ = fires(C.generalisation_gap, _gap_run(0.3, val_acc=0.75, train_acc=0.99),
                   "overfitting", {"train_acc_final", "val_acc_final", "acc_gap"})
    assert "train_acc_bound" not in sig
    quiet(C.generalisation_gap, _gap_run(0.3, val_acc=0.90, train_acc=0.99))


def test_gap_defers_to_a_validation_loss_curve():
    # a poor validation accuracy, but a validation loss that does not rise: the curve decides
    sig, cls = quiet(C.generalisation_gap, _gap_run(0.001, val_acc=0.70, val_loss=0.5))
    assert sig["acc_gap"] >= C.ACC_GAP and sig["val_points"] >= 3
    assert cls.primary != "overfitting"


def test_gap_fires_on_a_validation_loss_that_stopped_improving_far_above_the_training_loss():
    # a small training set memorised: validation flat at 0.95 (2% over its minimum, no rise by
    # the rise rule's measure) while training reaches 0.2 and 99% against 70%
    flat = [1.3, 1.1, 1.0, 0.95, 0.93, 0.93, 0.94, 0.94, 0.95, 0.95]
    run = _gap_run(0.2, val_acc=0.70, train_acc=0.99, val_loss=flat)
    sig, _ = fires(C.generalisation_gap, run, "overfitting",
                   {"train_acc_final", "val_acc_final", "acc_gap"})
    assert sig["val_loss_rise"] < C.VAL_RISE and C.overfitting(sig) is None
    # the same gap with a validation loss below the training loss is no gap
    below = [0.5, 0.3, 0.2, 0.15, 0.14, 0.14, 0.145, 0.15, 0.15, 0.15]
    sig, _ = quiet(C.generalisation_gap, _gap_run(0.2, val_acc=0.70, train_acc=0.99,
                                                  val_loss=below))
    assert sig["acc_gap"] >= C.ACC_GAP and sig["gap_final"] < 0
    # and a validation loss still falling at the end is still the judge
    quiet(C.generalisation_gap, _gap_run(0.2, val_acc=0.70, train_acc=0.99,
                                         val_loss=np.linspace(1.3, 0.9, 10)))


def test_gap_quiet_when_nothing_was_learned():
    run = syn.make_run(syn.steps_events(np.full(100, 0.69)), syn.targets_counts([50, 50]),
                       syn.metric("val_acc", np.full(10, 0.3)), syn.metric("acc", np.full(10, 0.9)))
    quiet(C.generalisation_gap, run)


# -- not_decreasing: runs too short for a curve ----------------------------------------------


def test_not_decreasing_fires_on_a_short_run_that_never_beat_the_constant_predictor():
    run = syn.make_run(syn.steps_events([2.30, 2.29, 2.27, 2.25]),
                       syn.targets_counts([10] * 10))  # baseline ln 10 = 2.303
    fires(C.not_decreasing, run, "loss_not_decreasing", {"steps", "constant_predictor_loss"})


def test_not_decreasing_quiet_on_a_short_run_below_the_constant_predictor():
    run = syn.make_run(syn.steps_events([2.30, 1.5, 0.9, 0.5]), syn.targets_counts([10] * 10))
    quiet(C.not_decreasing, run)


def test_exploding_fires_when_the_untrained_loss_is_far_above_the_constant_predictor():
    loss = syn.decay(100, 40.0, 2.0)  # targets of variance 1: an untrained MSE of 40
    run = syn.make_run(syn.steps_events(loss, gn=np.full(100, 500.0)),
                       syn.targets_moments(0.0, 1.0))
    sig, _ = fires(C.exploding, run, "gradient_instability",
                   {"loss_first", "loss_uninformed", "grad_norm_initial"})
    assert sig["loss_first"] >= C.START_RATIO * sig["loss_uninformed"]


def test_exploding_quiet_when_the_untrained_loss_is_near_the_constant_predictor():
    run = syn.make_run(syn.steps_events(syn.decay(100, 3.0, 0.2)), syn.targets_moments(0.0, 1.0))
    sig, cls = quiet(C.exploding, run)
    assert sig["loss_first"] < C.START_RATIO * sig["loss_uninformed"]
    assert cls.primary == HEALTHY


@pytest.mark.parametrize("targets", [
    syn.targets_moments(0.01, 0.0099, loss="binary_cross_entropy_with_logits"),  # 1% positives
    syn.targets_moments(40.0, 144.0),  # MSE on targets far from zero (ages)
    {**syn.targets_counts([50, 50]), "reduction": "sum"},  # summed over the batch
])
def test_exploding_quiet_on_healthy_starts_far_above_the_constant_predictor(targets):
    # an untrained model starts near uniform scores / a zero output, not near the prior
    start = {"binary_cross_entropy_with_logits": 0.7, "mse_loss": 1700.0}.get(targets["loss"],
                                                                             44.0)
    run = syn.make_run(syn.steps_events(syn.decay(100, start, 0.05 * start)), targets)
    sig, cls = quiet(C.exploding, run)
    assert cls.primary != "gradient_instability"


def test_validation_at_chance_with_the_training_set_fitted_is_a_gap_not_a_wrong_solution():
    # train loss ~0 (training accuracy >= 0.99 by the bound), validation at the majority rate
    sig, cls = quiet(C.wrong_solution, _gap_run(0.002, val_acc=0.5, counts=(50, 50)))
    assert sig["train_acc_bound"] > 0.99 and cls.primary == "overfitting"


def test_one_class_training_labels_fitted_perfectly_are_a_wrong_solution():
    # the training set has one class: fitting it is trivial (the majority rate is 1)
    run = _gap_run(0.001, val_acc=0.59, counts=(100, 0))
    sig, cls = fires(C.wrong_solution, run, "convergence_to_wrong_solution",
                     {"val_acc_final", "majority_rate"})
    assert sig["majority_rate"] == 1.0


def test_a_tentative_plateau_never_joins_another_rules_verdict():
    # slow data and a loss at 0.6x the baseline: the data wait is the verdict, alone
    loss = np.concatenate([np.linspace(math.log(2), 0.6 * math.log(2), 100),
                           np.full(100, 0.6 * math.log(2))])
    run = syn.make_run(syn.steps_events(loss, dt=np.full(200, 0.1), dw=np.full(200, 0.08)),
                       syn.targets_counts([50, 50]))
    sig = compute(run)
    assert C.plateau(sig) is not None
    cls = classify_and_check(sig)
    assert cls.primary == "performance_issue" and "loss_not_decreasing" not in cls.secondary


def test_gradient_accumulation_leaves_the_gap_signals_out():
    # (loss / k).backward() k times per step: the recorded loss is on another scale
    run = _gap_run(0.05, val_acc=0.6, val_loss=0.69)
    run.events.insert(1, {"t": "accumulation", "step": 0, "backwards": 8})
    sig = compute(run)
    assert "train_acc_bound" not in sig
    assert C.generalisation_gap(sig) is None


# -- gradients never reset -------------------------------------------------------------------


@pytest.mark.parametrize("not_reset,want", [(95, "gradient_instability"), (40, HEALTHY)])
def test_gradients_measured_never_reset_are_instability_even_while_the_loss_falls(not_reset,
                                                                                  want):
    run = syn.make_run(syn.healthy_steps(100),
                       {"t": "grad_reset", "checked": 100, "not_reset": not_reset})
    cls = classify_and_check(compute(run))
    assert cls.primary == want
    if want != HEALTHY:
        assert cls.evidence[0].signal == "grad_not_reset_share"


def test_too_few_reset_checks_say_nothing():
    run = syn.make_run(syn.healthy_steps(100), {"t": "grad_reset", "checked": 3, "not_reset": 3})
    assert "grad_not_reset_share" not in compute(run)


# -- the loop's own work per step ------------------------------------------------------------


def _timed(n, dt, dw, bz):
    events = syn.healthy_steps(n, dt=[dt] * n, dw=[dw] * n)
    for e in events:
        e["bz"] = bz
    return syn.make_run(events)


@pytest.mark.parametrize("dt,bz,want", [
    (0.030, 0.004, "performance_issue"),  # 26 ms a step outside forward/backward/step
    (0.006, 0.001, HEALTHY),              # most of the step, but only 5 ms: a trainer's upkeep
    (0.300, 0.200, HEALTHY),              # 100 ms, but a third of a long step
])
def test_loop_overhead_needs_a_large_share_and_real_milliseconds(dt, bz, want):
    sig = compute(_timed(60, dt, 0.0, bz))
    cls = classify_and_check(sig)
    assert cls.primary == want
    if want != HEALTHY:
        assert [e.signal for e in cls.evidence][:2] == ["step_overhead_share", "step_overhead_ms"]


@pytest.mark.parametrize("steps,want", [(60, "performance_issue"), (14, HEALTHY)])
def test_a_slow_loop_or_loader_must_cost_real_seconds_over_the_run(steps, want):
    """26 ms a step of the loop's own work (or of waiting for data) over 60 steps is 1.4 s
    worth saving; over the dozen steps of a full-batch run it is 0.3 s, and on a loaded
    machine it is noise."""
    for dw, bz, signal in ((0.0, 0.004, "step_overhead_share"),
                           (0.025, 0.0, "data_wait_fraction")):
        sig = compute(_timed(steps, 0.030, dw, bz))
        cls = classify_and_check(sig)
        assert cls.primary == want, (sig.get("step_overhead_s"), sig.get("data_wait_s"))
        if want != HEALTHY:
            assert cls.evidence[0].signal == signal


def test_loop_overhead_does_not_count_data_wait():
    sig = compute(_timed(60, 0.030, 0.025, 0.004))  # the time is the loader's
    assert sig["step_overhead_ms"] < 2
    assert classify_and_check(sig).primary == "performance_issue"  # slow_data, not overhead
    assert classify_and_check(sig).evidence[0].signal == "data_wait_fraction"


# -- autograd graphs kept alive ------------------------------------------------------------------


@pytest.mark.parametrize("alive,want", [(40, "memory_issue"), (2, HEALTHY)])
def test_graphs_kept_alive_are_a_memory_issue_before_memory_has_grown(alive, want):
    run = syn.make_run(syn.healthy_steps(60),
                       {"t": "graphs_kept", "checked": 40, "alive": alive, "lag": 3})
    cls = classify_and_check(compute(run))
    assert cls.primary == want
    if want != HEALTHY:
        assert cls.evidence[0].signal == "graphs_kept_share"


def test_one_kept_prediction_a_step_counts_though_every_step_has_two_forwards():
    run = syn.make_run(syn.healthy_steps(60),
                       {"t": "graphs_kept", "checked": 40, "alive": 0, "outputs_checked": 80,
                        "outputs_alive": 40, "lag": 3})
    cls = classify_and_check(compute(run))
    assert cls.primary == "memory_issue" and compute(run)["graphs_kept_share"] == 1.0


# -- broadcast_loss --------------------------------------------------------------------------


def test_broadcast_loss_outranks_the_curve():
    """A loss over B x B pairs converges to the mean: wrong solution, however the curve looks."""
    run = syn.make_run(syn.steps_events(np.linspace(1.0, 0.5, 200)), syn.targets_counts([50, 50]),
                       {"t": "loss_broadcast", "loss": "mse_loss", "input": [32, 1],
                        "target": [32], "shape": [32, 32], "factor": 32.0})
    fires(C.broadcast_loss, run, "convergence_to_wrong_solution", {"loss_broadcast_factor"})
    quiet(C.broadcast_loss, syn.make_run(syn.steps_events(np.linspace(1.0, 0.5, 200))))


def test_broadcast_loss_outranks_a_loss_spike():
    """The spikes of a B x B loss are another objective's: the primary is the wrong solution,
    the spike stays a secondary."""
    loss = np.full(200, 0.7)
    loss[120] = 12.0
    run = syn.make_run(syn.steps_events(loss),
                       {"t": "loss_broadcast", "loss": "mse_loss", "input": [64, 1],
                        "target": [64], "shape": [64, 64], "factor": 64.0})
    sig = compute(run)
    assert C.exploding(sig) is not None
    cls = C.classify(sig)
    assert cls.primary == "convergence_to_wrong_solution"
    assert "gradient_instability" in cls.secondary


def test_bounded_output_needs_unreachable_targets():
    steps = syn.steps_events(np.linspace(1.0, 0.5, 200))
    seen = {"t": "loss_input", "name": "mse_loss", "kind": "logits", "min": 0.0, "max": 3.0,
            "zero_share": 0.4}
    run = syn.make_run(steps, seen, {"t": "targets", "loss": "mse_loss", "n": 6400,
                                     "mean": 0.0, "var": 1.0, "negative": 0.5})
    fires(C.bounded_output, run, "convergence_to_wrong_solution", {"output_range_unreachable"})
    positive = syn.make_run(steps, seen, {"t": "targets", "loss": "mse_loss", "n": 6400,
                                          "mean": 5.0, "var": 1.0, "negative": 0.0})
    quiet(C.bounded_output, positive)
    signed = syn.make_run(steps, {**seen, "min": -0.5}, {"t": "targets", "loss": "mse_loss",
                                                        "n": 6400, "mean": 0.0, "var": 1.0,
                                                        "negative": 0.5})
    quiet(C.bounded_output, signed)  # outputs below 0: no floor


def test_a_sigmoid_bound_counts_only_when_the_outputs_saturate_against_it():
    steps = syn.steps_events(np.linspace(1.0, 0.5, 200))
    targets = {"t": "targets", "loss": "mse_loss", "n": 6400, "mean": 2.0, "var": 1.0,
               "negative": 0.0, "above_one": 0.8, "below_minus_one": 0.0,
               "input_min": 0.1, "input_max": 0.999, "input_zero_share": 0.0,
               "input_pressed": {"1": 0.6, "-1": 0.0, "0": 0.0}}
    sig, _ = fires(C.bounded_output, syn.make_run(steps, targets),
                   "convergence_to_wrong_solution", {"output_range_unreachable"})
    assert sig["output_range"].startswith("[0, 1]")
    loose = {**targets, "input_pressed": {"1": 0.01}}  # a linear output that stays below 1
    quiet(C.bounded_output, syn.make_run(steps, loose))
    # a linear output collapsed to one small value (after a blow-up): no range, no sigmoid
    collapsed = {**targets, "mean": 0.0, "negative": 0.5, "above_one": 0.2, "input_min": 0.0128,
                 "input_max": 0.0128, "input_pressed": {"1": 0.0, "-1": 0.0, "0": 1.0}}
    quiet(C.bounded_output, syn.make_run(steps, collapsed))
    saturated = {**targets, "input_min": 0.99995, "input_max": 0.99999}  # every row at 1
    fires(C.bounded_output, syn.make_run(steps, saturated), "convergence_to_wrong_solution",
          {"output_range_unreachable"})


# -- across ranks (the signals come from model_debugger.ranks; records in tests/test_ranks.py) -----

@pytest.mark.parametrize("sig, fires_", [
    ({"rank_hang": 1.0, "rank_hang_missing": [1], "rank_hang_waiting": [0],
      "rank_hang_seconds": 3.0}, True),
    ({"rank_hang": 0.0}, False),
])
def test_rank_hang_is_a_performance_issue_naming_the_missing_rank(sig, fires_):
    out = C.rank_hang(sig)
    assert (out is not None) is fires_
    if fires_:
        cat, ev = out
        assert cat == "performance_issue"
        assert {e.signal: e.value for e in ev}["rank_hang_missing"] == "1"
        assert C.classify({"steps": 10, **sig}).primary == "performance_issue"


@pytest.mark.parametrize("sig, fires_", [
    ({"rank_desync": 2e-3, "rank_desync_step": 10, "rank_desync_ranks": [1]}, True),
    ({"rank_desync": 5e-6, "rank_desync_step": 10}, False),  # float noise of equal replicas
    ({"rank_desync": 0.0, "rank_updates_apart": 1.0, "rank_updates": "rank 0: 60, rank 1: 0"},
     True),  # a rank that never steps
    ({"rank_desync": 0.0, "rank_updates_apart": 0.02}, False),  # 49 against 48: uneven data
])
def test_rank_desync_is_a_wrong_solution(sig, fires_):
    out = C.rank_desync(sig)
    assert (out is not None) is fires_
    if fires_:
        assert out[0] == "convergence_to_wrong_solution"


@pytest.mark.parametrize("share, ms, fires_", [(0.5, 10.0, True), (0.2, 10.0, False),
                                               (0.5, 1.0, False)])
def test_rank_straggler_needs_both_its_share_and_its_milliseconds(share, ms, fires_):
    sig = {"rank_straggler": 1, "rank_straggler_share": share, "rank_straggler_ms": ms}
    out = C.rank_straggler(sig)
    assert (out is not None) is fires_
    if fires_:
        assert out[0] == "performance_issue"


def test_the_loss_of_one_row_per_step_is_judged_on_means_of_enough_rows():
    """A batch of one records one example's loss: a hard example is no blow-up."""
    rng = np.random.default_rng(0)
    level = syn.decay(3000, 1.0, 0.2)
    noisy = level * rng.exponential(size=3000) ** 2  # per-example losses: heavy-tailed
    one_row = syn.make_run(syn.steps_events(noisy), syn.targets_moments(0.0, 1.0, n=3000))
    sig = compute(one_row)
    assert sig["loss_window"] == 32 and sig["loss_spike"] < 2 * sig["loss_initial"]
    assert C.classify(sig).primary == HEALTHY
    # the same readings from batches of 64 rows are real spikes: no window
    batches = syn.make_run(syn.steps_events(noisy), syn.targets_moments(0.0, 1.0, n=64 * 3000))
    sig = compute(batches)
    assert "loss_window" not in sig
    assert C.classify(sig).primary == "gradient_instability"


def test_a_weighted_loss_has_no_constant_predictor_baseline():
    """Keras class_weight={1: 30} puts the loss on another scale than the prior's entropy: a
    healthy weighted run ends above the unweighted constant predictor's loss without being
    stuck. The baseline is dropped (as for a summed loss); the majority rate stands."""
    targets = {**syn.targets_counts([97, 3]), "weighted": True}
    run = syn.make_run(syn.steps_events(syn.decay(100, 1.2, 0.5)), targets)
    sig, cls = quiet(C.not_decreasing, run)
    assert sig.get("constant_predictor_loss") is None
    assert sig["majority_rate"] == pytest.approx(0.97)
    assert cls.primary == HEALTHY
    unweighted = compute(syn.make_run(syn.steps_events(syn.decay(100, 1.2, 0.5)),
                                      syn.targets_counts([97, 3])))
    assert C.classify(unweighted).primary == "loss_not_decreasing"  # what it read before


def _custom_loss_regression(val_mae: list[float]) -> list:
    """A Keras ``train_step`` computing its own loss: no ``targets`` event (the loss is not
    known), the targets' values kept (``target_values``: MAD 0.116), a falling loss and the
    run's ``mae`` / ``val_mae`` metrics."""
    kept = {"t": "target_values", "n": 2000, "mean": 0.5, "var": 0.0204, "median": 0.49,
            "mad": 0.116}
    return [kept, syn.steps_events(syn.decay(100, 0.1, 0.02)),
            syn.metric("mae", [0.2, 0.13, 0.118], "keras"),
            syn.metric("val_mae", val_mae, "keras")]


def test_a_regression_error_at_the_constant_predictions_is_a_wrong_solution():
    """(B,) - (B, 1) in a hand-written MSE: the loss falls to the targets' variance and the
    validation MAE ends at the median's (0.119 vs 0.116). With no known loss there was no
    baseline at all, and the run read healthy."""
    sig, cls = fires(C.wrong_solution, syn.make_run(*_custom_loss_regression([0.2, 0.13, 0.119])),
                     "convergence_to_wrong_solution",
                     {"val_error_final", "val_error_baseline", "error_share"})
    assert sig["val_error_name"] == "val_mae" and sig["error_share"] > 1.0


def test_a_regression_error_well_below_the_constant_predictions_is_quiet():
    sig, cls = quiet(C.wrong_solution, syn.make_run(*_custom_loss_regression([0.2, 0.08, 0.04])))
    assert sig["error_share"] < 0.5 and cls.primary == HEALTHY


@pytest.mark.parametrize("name,role", [
    ("val_mae", ("val", "mae")), ("mean_absolute_error", ("train", "mae")),
    ("val_root_mean_squared_error", ("val", "rmse")), ("mse", ("train", "mse")),
    ("mean_absolute_percentage_error", None), ("val_mean_squared_logarithmic_error", None),
    ("mae_scaled", None)])
def test_regression_error_metrics_are_named_exactly(name, role):
    """A percentage or logarithmic error has another constant-prediction value: no role."""
    assert metric_role(name) == role


def test_recall_speaks_for_the_rare_class_before_precision_and_auc():
    """Keras metrics=[Recall, Precision, AUC]: a recall of 0 (the rare class never predicted)
    is the class-balanced score read, not the AUC's ranking nor a precision of a few rows."""
    run = syn.make_run(syn.healthy_steps(100), syn.metric("val_auc", [0.8] * 5),
                       syn.metric("val_precision", [0.6] * 5),
                       syn.metric("val_recall", [0.0] * 5))
    sig, _ = fires(C.wrong_solution, run, "convergence_to_wrong_solution",
                   {"loss_relative_drop", "val_f1_final"})
    assert sig["val_f1_name"] == "val_recall"
    both = syn.make_run(syn.healthy_steps(100), syn.metric("val_recall", [0.0] * 5),
                        syn.metric("val_f1", [0.7] * 5))
    sig, _ = quiet(C.wrong_solution, both)  # F1 weighs both errors: it is read first
    assert sig["val_f1_name"] == "val_f1"


@pytest.mark.parametrize("name", ["val_r2", "R2", "val_r_squared", "r2_score"])
def test_an_r2_that_stays_near_zero_while_the_loss_falls_is_a_wrong_solution(name):
    """A hand-written loss the capture does not know (no constant predictor): a reported R² is
    its own baseline, 1 - R² the share of the targets' variance left unexplained."""
    from model_debugger.records import metric_role

    assert metric_role(name)[1] == "r2"
    run = syn.make_run(syn.healthy_steps(100), syn.metric(name, [0.01, 0.02, 0.03]))
    sig, _ = fires(C.wrong_solution, run, "convergence_to_wrong_solution",
                   {"loss_relative_drop", "error_share"})
    assert sig["error_share"] == pytest.approx(0.97)
    learned = syn.make_run(syn.healthy_steps(100), syn.metric(name, [0.3, 0.8, 0.95]))
    quiet(C.wrong_solution, learned)


@pytest.mark.parametrize("losses, primary", [
    ([1.85, 21.9, 218.7, 250.0, 270.0, 291.0], "gradient_instability"),
    ([1.85, 0.9, 0.5, 0.3, 0.2, 0.15], HEALTHY),
])
def test_the_loss_of_each_epoch_stands_in_when_no_step_s_loss_was_read(losses, primary):
    """A Keras ``train_step`` that returns only its metrics: every step's loss is unknown, the
    training loss of each epoch is all there is, and the curve is judged on it (a loss that
    rose 150x was ``healthy`` when the rules saw no loss at all)."""
    n = 60
    run = syn.make_run(syn.steps_events(n=n, gn=np.ones(n), ep=[i // 10 for i in range(n)]),
                       syn.metric("loss", losses, source="keras"),
                       syn.targets_counts([100] * 10))
    sig = compute(run)
    assert sig["loss_source"] == "epochs" and sig["loss_points"] == len(losses)
    assert C.classify(sig).primary == primary
    plain = syn.make_run(syn.steps_events(n=n, gn=np.ones(n)), syn.targets_counts([100] * 10))
    assert "loss_source" not in compute(plain)


def test_the_epoch_loss_curve_is_the_total_never_a_part_of_it():
    """A VAE's train_step reports ``loss`` (falling), ``reconstruction_loss`` and ``kl_loss``
    (rising, as it should): the curve is ``loss``. Only parts of a loss: no curve at all."""
    n = 60
    steps = syn.steps_events(n=n, gn=np.ones(n), ep=[i // 10 for i in range(n)])
    parts = [syn.metric("kl_loss", [0.1, 2.0, 5.0, 8.0, 11.0, 14.0], source="keras"),
             syn.metric("reconstruction_loss", [550, 300, 220, 190, 170, 150], source="keras")]
    sig = compute(syn.make_run(steps, *parts,
                               syn.metric("loss", [550, 302, 225, 198, 181, 164], source="keras")))
    assert sig["loss_source"] == "epochs" and sig["loss_final"] < sig["loss_initial"]
    assert C.classify(sig).primary != "gradient_instability"
    assert "loss_source" not in compute(syn.make_run(steps, *parts))


def test_a_stalled_head_is_judged_against_its_own_prior():
    """Two heads: the summed loss falls, one head's best validation loss stays at its label
    prior's loss (ln 3) -> ``loss_not_decreasing`` naming it; learning heads do not fire."""
    n = 60
    heads = [{"t": "head_targets", "head": "segment", "index": 1, "loss": "cross_entropy",
              "n": 300, "counts": [100, 100, 100]},
             {"t": "head_targets", "head": "price", "index": 0, "loss": "mse_loss", "n": 300,
              "mean": 0.0, "var": 1.0}]

    falling = [0.9, 0.5, 0.3, 0.2, 0.15, 0.1]

    def run(segment_train, segment_val):
        return syn.make_run(syn.steps_events(syn.decay(n), gn=np.ones(n),
                                             ep=[i // 10 for i in range(n)]), *heads,
                            syn.metric("segment_loss", segment_train, source="keras"),
                            syn.metric("val_segment_loss", segment_val, source="keras"),
                            syn.metric("price_loss", falling, source="keras"),
                            syn.metric("val_price_loss", falling, source="keras"))
    flat = [1.11, 1.105, 1.10, 1.102, 1.108, 1.112]
    sig = compute(run([1.1, 1.1, 1.09, 1.08, 1.07, 1.065], flat))
    assert sig["head_floor_name"] == "segment"
    assert sig["head_constant_loss"] == pytest.approx(math.log(3))
    assert C.classify(sig).primary == "loss_not_decreasing"
    sig = compute(run(falling, [1.0, 0.7, 0.5, 0.4, 0.35, 0.3]))
    assert sig["head_floor_share"] < 0.5 and C.classify(sig).primary == HEALTHY
    # a validation set shifted from the training one: its loss alone is no verdict
    sig = compute(run(falling, flat))
    assert sig["head_floor_share"] < 0.5


def test_the_uninformed_loss_of_a_weighted_loss_is_on_the_weighted_scale():
    """A positive weight multiplies each positive's term: an untrained model's loss is
    ``ln 2 (w p + 1 - p)``, not ``ln 2`` (``pos_weight=25`` on balanced labels starts near 9,
    which is no blow-up); a class-weighted cross-entropy is a weighted mean (``ln C``); any
    other weighting has no known scale."""
    from model_debugger.signals import uninformed_loss

    bce = {"loss": "binary_cross_entropy_with_logits", "n": 100, "mean": 0.5, "var": 0.25}
    assert uninformed_loss(bce) == pytest.approx(math.log(2))
    weighted = {**bce, "weighted": True, "weights": "pos_weight", "pos_weight": 25.0}
    assert uninformed_loss(weighted) == pytest.approx(math.log(2) * 13.0)
    assert uninformed_loss({**bce, "weighted": True, "weights": "element"}) is None
    assert uninformed_loss({**bce, "weighted": True}) is None  # (Keras sample_weight)
    keras = {**bce, "weighted": True, "weights": "class_weight", "class_weight": [1.0, 25.0]}
    assert uninformed_loss(keras) == pytest.approx(math.log(2) * 13.0)
    ce = {"loss": "cross_entropy", "n": 100, "counts": [50, 30, 20], "weighted": True,
          "weights": "class"}
    assert uninformed_loss(ce) == pytest.approx(math.log(3))


def test_a_validation_accuracy_trivial_at_every_look_beside_a_fitted_training_set_is_both():
    """Training fitted (99%), validation at the majority rate at every evaluation: nothing
    learned carries over. The gap rule fires first (overfitting stays primary), and the wrong
    solution is measured too, so a confirmed cause (validation labels numbered otherwise) can
    make it primary. A validation accuracy that was above trivial once is the gap alone."""
    never = _gap_run(0.001, train_acc=0.99, counts=(22, 20, 20, 19, 19))
    never.events.append(syn.metric("val_acc", [0.19, 0.2, 0.18, 0.21, 0.19]))
    never = syn.make_run(*never.events)
    sig, cls = fires(C.trivial_validation, never, "convergence_to_wrong_solution",
                     {"val_acc_max", "majority_rate", "acc_gap"}, primary=False)
    assert sig["val_acc_max"] <= sig["majority_rate"] + C.TRIVIAL_METRIC_MARGIN
    assert cls.primary == "overfitting" and "convergence_to_wrong_solution" in cls.secondary
    once = syn.make_run(*[e for e in never.events if e.get("name") != "val_acc"],
                        syn.metric("val_acc", [0.19, 0.45, 0.18, 0.21, 0.19]))
    quiet(C.trivial_validation, once)
    skewed = _gap_run(0.001, train_acc=0.99, counts=(90, 10))  # a balanced validation split
    balanced = syn.make_run(*skewed.events, syn.metric("val_acc", [0.7, 0.75, 0.72]))
    sig, _ = quiet(C.trivial_validation, balanced)  # 0.75: not guessing, whatever 0.9 says
    assert sig["val_acc_max"] < sig["majority_rate"] and sig["class_count"] == 2
