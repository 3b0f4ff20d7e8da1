"""Classification: a rule table over signals. Each rule cites the numbers it used.

Rules are tried in table order; the first that fires is the primary category and later ones
(of other categories) are ranked secondaries, so a hybrid (NaN and OOM) keeps both. A rule takes
the signal dict and returns ``(category, evidence)`` when it fires, else None.
"""

from __future__ import annotations

from collections.abc import Callable

from .records import HEALTHY, Classification, Evidence

# thresholds (named so tests can probe both sides): declared once in the leaf module
from .thresholds import (  # noqa: F401 - re-exported for tests
    ACC_GAP,
    BASELINE_MARGIN,
    DATA_WAIT_FRACTION,
    DATA_WAIT_MS,
    DESYNC_REL,
    DIVERGE_RATIO,
    FEW_STEPS,
    FLOOR_SHARE,
    GPU_IDLE_STEP_MS,
    GPU_IDLE_UTIL,
    GRAD_GROWTH,
    GRAPHS_KEPT,
    GROWTH_WITH_LEARNING,
    HELD_FLOOR,
    LOSS_FALLS,
    LR_STALLED,
    MIN_STEPS,
    NOT_RESET,
    ONE_VALUE_LOSS,
    OVERHEAD_MS,
    OVERHEAD_SHARE,
    PEAK_RATIO,
    PLATEAU_DROP,
    RETRACED_MIN,
    RETRACED_SHARE,
    RSS_GROWTH_MB,
    RSS_R2,
    RSS_STILL_GROWING,
    SETTLED_FLOOR,
    SETTLED_TAIL,
    SLOW_TOTAL_S,
    SPIKE_RATIO,
    START_RATIO,
    STRAGGLER_MS,
    STRAGGLER_SHARE,
    TAIL_DROP,
    TRAIN_NOT_RISING,
    TRIVIAL_ERROR_SHARE,
    TRIVIAL_F1,
    TRIVIAL_METRIC_MARGIN,
    UNBOUNDED_LOSS,
    UNBOUNDED_RATIO,
    UNREACHABLE_SHARE,
    UNTRAINED_SHARE,
    UPDATE_RATIO_HIGH,
    UPDATE_RATIO_LOW,
    UPDATES_APART,
    VAL_RISE,
    VAL_RISE_SHARE,
    VANISH_RATIO,
    WORSE_RATIO,
)


def _ev(sig: dict, key: str, detail: str) -> Evidence:
    value = sig[key]
    return Evidence(key, float(f"{value:.6g}") if isinstance(value, float) else value, detail)


def nonfinite(sig: dict):
    """``gradient_instability`` when a value went non-finite: the step and module where first.

    And whether the weights were already non-finite (an earlier update put them there).
    """
    if "first_nonfinite_step" not in sig:
        return None
    where = sig.get("nonfinite_module")
    ev = [_ev(sig, "first_nonfinite_step", f"first non-finite {sig['nonfinite_what']}")]
    if where:
        ev.append(_ev(sig, "nonfinite_module", "first module where it appears"))
    if sig.get("nonfinite_rank_tie"):
        ev.append(Evidence("nonfinite_rank_tie", sig["nonfinite_rank_tie"], "ranks where it "
                           "appeared at the same step and place: every rank's doing, not one "
                           "rank's data"))
    elif sig.get("nonfinite_rank") is not None and sig.get("ranks", 1) > 1:
        ev.append(_ev(sig, "nonfinite_rank", f"the rank where it appeared first, of "
                      f"{sig['ranks']} (the all-reduce then spread it to "
                      f"{sig.get('nonfinite_ranks', '?')} ranks)"))
    if "last_finite_grad_step" in sig:
        ev.append(_ev(sig, "last_finite_grad_step", "the weights were already non-finite: an "
                      "update after this step, the last whose gradients were measured finite, "
                      "put them there"))
    return "gradient_instability", ev


def oom(sig: dict):
    """``memory_issue`` when an out-of-memory error ended the run."""
    if sig.get("error_kind") != "oom":
        return None
    return "memory_issue", [_ev(sig, "error", "out of memory ended the run")]


def _ranks(value) -> str:
    return ", ".join(str(v) for v in value) if isinstance(value, list) else str(value)


def rank_hang(sig: dict):
    """``performance_issue`` when ranks ended waiting in a collective another never reached.

    The job stops making progress: every rank but the missing one waits until the collective
    times out (or the job is stopped).
    """
    if not sig.get("rank_hang"):
        return None
    ev = [Evidence("rank_hang_missing", _ranks(sig["rank_hang_missing"]),
                   "ranks that never reached the collective the others waited in"),
          Evidence("rank_hang_waiting", _ranks(sig["rank_hang_waiting"]),
                   "ranks that ended waiting in it")]
    if sig.get("rank_hang_seconds") is not None:
        ev.append(_ev(sig, "rank_hang_seconds", "seconds a rank had waited when its wait was "
                      "recorded (it waited on until the timeout or the stop)"))
    return "performance_issue", ev


def rank_desync(sig: dict):
    """``convergence_to_wrong_solution`` when replicas that should be equal drift apart.

    Data-parallel ranks apply the same averaged gradient to the same weights: their parameters
    stay equal (DDP keeps them bit-equal). Checksums that differ mean each rank trains its own
    model, and the one saved is one of several.
    """
    if sig.get("rank_updates"):  # a rank that steps less often trains another model
        return "convergence_to_wrong_solution", [
            _ev(sig, "rank_updates_apart", f"1 - fewest / most optimizer steps over the ranks "
                f"(>= {UPDATES_APART:g}: the replicas cannot stay equal)"),
            Evidence("rank_updates", sig["rank_updates"], "optimizer steps per rank")]
    if sig.get("rank_desync", 0.0) <= DESYNC_REL or "rank_desync_step" not in sig:
        return None
    return "convergence_to_wrong_solution", [
        _ev(sig, "rank_desync", f"largest relative spread of the replicas' parameter "
            f"checksums (> {DESYNC_REL:g}: the ranks hold different models)"),
        _ev(sig, "rank_desync_step", "first step whose checksums differ"),
        Evidence("rank_desync_ranks", _ranks(sig.get("rank_desync_ranks", [])),
                 "ranks whose checksum differs from rank 0's")]


def rank_straggler(sig: dict):
    """``performance_issue`` when one rank's own work per step makes every other rank wait."""
    if sig.get("rank_straggler_share", 0.0) < STRAGGLER_SHARE or \
            sig.get("rank_straggler_ms", 0.0) < STRAGGLER_MS:
        return None
    return "performance_issue", [
        _ev(sig, "rank_straggler", "the rank with the most own work per step"),
        _ev(sig, "rank_straggler_ms", f"its own work above the other ranks', ms per step "
            f"(>= {STRAGGLER_MS:g})"),
        _ev(sig, "rank_straggler_share", f"that excess as a share of a step (>= "
            f"{STRAGGLER_SHARE:g}: every rank waits for it)")]


def loss_without_metric(sig: dict):
    """``convergence_to_wrong_solution``: the loss reads far below the prior's, accuracy is the prior's.

    A model whose training accuracy is no better than always predicting the majority class
    cannot have a training loss well below the constant predictor's, unless the loss measures something else (a
    multi-class loss over one output unit reads 0 whatever the model does). Whatever that
    loss curve does, the falls, spikes or gradient growth it shows describe another objective;
    the metric shows the model converged to the prior.
    """
    base, final = sig.get("constant_predictor_loss"), sig.get("loss_final")
    if not base or base <= 0 or final is None or final > 0.5 * base or \
            sig.get("majority_rate") is None or "loss_min" not in sig:
        return None
    # the training accuracy, measured, beside the training loss it contradicts (validation
    # rows may hold the classes in other shares than the majority rate of the training set);
    # or a loss that read one value at every step: it cannot have trained anything
    # (a loss printed rounded to 0.0000 by a model that learned is no such loss: its
    # accuracy is far above the prior's)
    accs = [sig[f"{s}_acc_final"] for s in ("train", "val") if f"{s}_acc_final" in sig]
    unmoved = sig.get("loss_points", 0) >= MIN_STEPS and sig.get("loss_max") == sig["loss_min"] \
        and bool(accs) and max(accs) <= sig["majority_rate"] + ACC_GAP
    if not unmoved and \
            sig.get("train_acc_final", 1.0) > sig["majority_rate"] + TRIVIAL_METRIC_MARGIN:
        return None
    if any(sig.get(f"{s}_f1_final", 0.0) >= TRIVIAL_F1 for s in ("train", "val")):
        return None  # a class-balanced score that is not trivial
    ev = [_ev(sig, "loss_final", "median of the last steps (< 0.5 x the constant predictor's)"),
          _ev(sig, "constant_predictor_loss", "loss of always predicting the label prior")]
    if unmoved:
        ev.append(_ev(sig, "loss_max", f"highest loss: the same value at all "
                      f"{sig['loss_points']} readings (it does not depend on the model)"))
    if "train_acc_final" not in sig:
        return "convergence_to_wrong_solution", ev
    trivial = sig["train_acc_final"] <= sig["majority_rate"] + TRIVIAL_METRIC_MARGIN
    return "convergence_to_wrong_solution", [
        *ev, _ev(sig, "train_acc_final", f"'{sig['train_acc_name']}' at the end"),
        _ev(sig, "majority_rate", "accuracy of always predicting the majority class" + (
            f" (the accuracy is within {TRIVIAL_METRIC_MARGIN:g} of it: the loss does not "
            "measure what the metric does)" if trivial else ""))]


def exploding(sig: dict):
    """``gradient_instability`` when the loss diverges or spikes after warm-up.

    Or when the gradient norm grows while the loss does not fall.
    """
    ev = []
    if "loss_initial" in sig and sig["loss_initial"] > 0:
        if sig["loss_final"] >= DIVERGE_RATIO * sig["loss_initial"]:
            ev += [_ev(sig, "loss_initial", "median of the first steps"),
                   _ev(sig, "loss_final", f"median of the last steps, >= {DIVERGE_RATIO}x initial")]
        elif sig.get("loss_spike", 0) >= SPIKE_RATIO * sig["loss_initial"] and \
                sig["loss_spike"] >= (sig.get("constant_predictor_loss") or 0.1):
            ev += [_ev(sig, "loss_initial", "median of the first steps"),
                   _ev(sig, "loss_spike", f"highest loss after warm-up, >= {SPIKE_RATIO}x initial")]
        elif _left_worse(sig):
            ev += [_ev(sig, "loss_initial", "median of the first steps"),
                   _ev(sig, "loss_spike", f"highest loss after warm-up, >= {PEAK_RATIO:g}x "
                       "initial"),
                   _ev(sig, "loss_final", f"median of the last steps: >= {WORSE_RATIO:g}x "
                       "initial and above the constant predictor's (the updates drove the "
                       "loss up and left it worse than knowing nothing)"),
                   _ev(sig, "constant_predictor_loss", "loss of predicting the label prior / "
                       "mean")]
    if not ev and sig.get("loss_peak_ratio", 0) >= SPIKE_RATIO and \
            sig["loss_initial"] >= 2 * sig["loss_first"] and \
            sig["loss_initial"] >= (sig.get("constant_predictor_loss") or 0.0) and \
            sig["loss_max"] >= (sig.get("constant_predictor_loss") or 0.1):
        # blown up within the first steps, and it lasted: the early median holds the blow-up
        # (one transient spike during warm-up leaves the early median alone)
        ev += [_ev(sig, "loss_first", "first loss readings, before the updates took effect"),
               _ev(sig, "loss_initial", "median of the first steps (>= 2x the first readings)"),
               _ev(sig, "loss_max", f"highest loss, >= {SPIKE_RATIO:g}x the first (the updates "
                   "drove it up)")]
    uninformed = sig.get("loss_uninformed")
    if not ev and uninformed and sig.get("loss_first", 0) >= START_RATIO * uninformed:
        # an untrained model scores about as well as one that knows nothing: outputs far too
        # large (initialisation, output scale) make errors, and so gradients, far too large
        ev += [_ev(sig, "loss_first", "first loss readings, before the updates took effect"),
               _ev(sig, "loss_uninformed", f"loss of uniform scores / a zero output (the first "
                   f"loss is >= {START_RATIO:g}x this)")]
        if "grad_norm_initial" in sig:
            ev.append(_ev(sig, "grad_norm_initial", "median global gradient norm at the start"))
    if not ev and sig.get("grad_not_reset_share", 0) >= NOT_RESET:
        # measured: the gradients were never reset, so each update follows the sum of every
        # gradient so far (intended accumulation resets once per step and is not counted)
        ev.append(_ev(sig, "grad_not_reset_share", "steps whose backward began with the last "
                      "step's gradients still there (added to, never reset)"))
        if "grad_norm_growth" in sig:
            ev.append(_ev(sig, "grad_norm_growth", "max/initial global gradient norm (the "
                          "update follows the sum of old gradients)"))
    if sig.get("grad_norm_growth", 0) >= GRAD_GROWTH and \
            sig.get("loss_relative_drop", 0) < GROWTH_WITH_LEARNING:
        ev.append(_ev(sig, "grad_norm_growth", f"max/initial global gradient norm >= {GRAD_GROWTH:g}"))
    return ("gradient_instability", ev) if ev else None


def memory_growth(sig: dict):
    """``memory_issue`` when GPU or process memory grows steadily after warm-up.

    Process memory that levels off after the first epochs is a cache filling, not a leak.
    Measured directly too: the loss tensors of past steps, each holding its autograd graph
    (every activation it saved), kept alive by the loop: memory then grows with every step,
    however short the run was.
    """
    if sig.get("graphs_kept_share", 0) >= GRAPHS_KEPT:
        ev = [_ev(sig, "graphs_kept_share", "past steps whose loss or prediction, with its "
                  "whole autograd graph, stayed alive (kept by the loop: memory grows every "
                  "step)")]
        for key, detail in (("rss_growth_mb", "process memory growth after warm-up"),
                            ("cuda_growth_mb", "GPU memory growth after warm-up")):
            if key in sig:
                ev.append(_ev(sig, key, detail))
        return "memory_issue", ev
    if sig.get("cuda_growth_mb", 0) >= RSS_GROWTH_MB and sig.get("cuda_growth_r2", 0) >= RSS_R2:
        return "memory_issue", [
            _ev(sig, "cuda_growth_mb", f"GPU memory allocated, growth after warm-up "
                f"(>= {RSS_GROWTH_MB:g} MB)"),
            _ev(sig, "cuda_slope_mb_per_step", "MB per step"),
            _ev(sig, "cuda_growth_r2", f"R^2 of a linear fit (steady growth, >= {RSS_R2})")]
    if sig.get("rss_growth_mb", 0) < RSS_GROWTH_MB or sig.get("rss_growth_r2", 0) < RSS_R2:
        return None
    late = sig.get("rss_last_epoch_mb_per_step")
    if late is not None and late < RSS_STILL_GROWING * sig["rss_slope_mb_per_step"]:
        return None  # levelled off after the first epoch(s): a cache filling, not a leak
    ev = [_ev(sig, "rss_growth_mb", f"process memory growth after warm-up (>= {RSS_GROWTH_MB:g} MB)"),
          _ev(sig, "rss_slope_mb_per_step", "MB per step"),
          _ev(sig, "rss_growth_r2", f"R^2 of a linear fit (steady growth, >= {RSS_R2})")]
    if late is not None:
        ev.append(_ev(sig, "rss_last_epoch_mb_per_step", "MB per step over the last epoch "
                      f"(still growing: >= {RSS_STILL_GROWING:g} x the run's rate)"))
    return "memory_issue", ev


def overfitting(sig: dict):
    """``overfitting`` when validation loss rises from its minimum while training loss does not.

    Where the training loss is known, the training set must also end fitted better than the
    validation set (validation loss above training loss): a validation rise that stays below a
    training loss that is not falling is a noisy or unstable run, not a generalisation gap.
    Not when a class-balanced validation score (F1, recall, ...) never left ~0: the model never
    predicted the rare class, so it had nothing to stop generalising. The rise, or the gap
    between validation and training loss (only when no validation accuracy held within 1.5
    points of its best), must also reach ``VAL_RISE_SHARE`` of what the validation loss had
    gained over the constant predictor's:
    from a minimum near zero a rise of 150% can be a few hundredths, a classifier growing
    confident on a handful of rows while its accuracy holds. Not when the last fit's
    ``EarlyStopping``, watching this validation loss, restored its best epoch
    (``restored_best``): the model the run ends with is the one from before the rise.
    """
    if sig.get("val_f1_points", 0) >= 3 and sig["val_f1_max"] < 2 * TRIVIAL_F1 and \
            sig["val_f1_final"] < TRIVIAL_F1 and sig.get("loss_relative_drop", 0) >= LOSS_FALLS \
            and sig.get("train_f1_max", 0.0) < 2 * TRIVIAL_F1:
        return None  # a class-balanced score that never left ~0 on validation nor training (the
        # rare class never predicted): nothing learned to stop generalising; wrong_solution
    if sig.get("restored_best"):
        return None  # early stopping restored the best epoch: the rise after it is its wait
    if sig.get("val_loss_rise", 0) >= VAL_RISE and sig["val_loss_min_index"] < sig["val_points"] - 1:
        if "train_loss_final" in sig and \
                sig["train_loss_final"] > TRAIN_NOT_RISING * sig["train_loss_at_val_min"]:
            return None  # both rising: divergence, not overfitting
        if sig.get("gap_final", 1.0) <= 0:
            return None  # validation still below training: no gap to speak of
        base, low = sig.get("constant_predictor_loss"), sig["val_loss_min"]
        held = "val_acc_max" in sig and \
            sig["val_acc_final"] >= sig["val_acc_max"] - TRIVIAL_METRIC_MARGIN
        if base is not None and base > low and \
                sig["val_loss_final"] - low < VAL_RISE_SHARE * (base - low) and \
                (held or sig.get("gap_final", 0.0) < VAL_RISE_SHARE * (base - low)):
            return None  # a rise small against what was learned, and a gap as small or an
            # accuracy that held its best: a well-fitted model's confidence drifting on a few
            # rows, not one that stopped generalising
        ev = [_ev(sig, "val_loss_min", f"'{sig['val_loss_name']}' best value, at point "
                  f"{sig['val_loss_min_index']}"),
              _ev(sig, "val_loss_final", "last value"),
              _ev(sig, "val_loss_rise", f"relative rise from the minimum (>= {VAL_RISE})")]
        if "train_loss_final" in sig:
            ev += [_ev(sig, "train_loss_at_val_min", "train loss when validation was best"),
                   _ev(sig, "train_loss_final", "train loss not rising meanwhile")]
        if "gap_final" in sig:
            ev.append(_ev(sig, "gap_final", "validation minus training loss at the end (> 0)"))
        return "overfitting", ev
    return None


STOPPED_FOR = 2  # a validation minimum this many readings before the end: it stopped improving


def generalisation_gap(sig: dict):
    """``overfitting`` when the training set is fitted far better than the validation set.

    Read at the end of the run (no rise from a minimum needed): a training accuracy (or the
    lowest its loss allows) well above the validation accuracy. Where a validation-loss curve
    exists it decides while it still falls (the model is still improving where it matters);
    once it stopped improving (its minimum before the end) a rise is not needed: a model that
    memorised a small training set often ends with its validation loss flat far above its
    training loss (early stopping, a falling rate), which must then be the case.
    """
    if sig.get("loss_relative_drop", 0) < LOSS_FALLS:
        return None  # nothing was learned
    if sig.get("restored_best"):
        return None  # the final accuracies are the waiting epochs', not the restored model's
    if sig.get("val_points", 0) >= 3 and (
            sig.get("val_loss_min_index", 0) >= sig["val_points"] - STOPPED_FOR or
            sig.get("gap_final", 0.0) <= 0):
        return None  # validation still improving (its best among the last readings: one
        # noisy reading is no plateau), or at or below training loss: no gap
    if sig.get("acc_gap", 0) < ACC_GAP:
        return None
    bound = "train_acc_bound" in sig
    return "overfitting", [
        _ev(sig, "train_acc_bound" if bound else "train_acc_final",
            "lowest training accuracy the final loss allows" if bound else
            f"'{sig['train_acc_name']}' at the end"),
        _ev(sig, "val_acc_final", f"'{sig['val_acc_name']}' at the end"),
        _ev(sig, "acc_gap", f"training minus validation accuracy (>= {ACC_GAP:g})")]


def broadcast_loss(sig: dict):
    """``convergence_to_wrong_solution`` when the training loss paired by broadcasting.

    ``(B, 1)`` predictions against a ``(B,)`` target: every prediction against every target.
    Whatever the curve does, such a loss is minimised by the targets' mean: the model converges
    to a constant. Ranked before the loss-growth rule: the spikes of such a loss are another
    objective's (skewed targets paired with every prediction).
    """
    if sig.get("loss_unpaired", 0.0) >= 1.0:  # a loss written by hand, read by its gradients
        return "convergence_to_wrong_solution", [
            _ev(sig, "loss_unpaired", "the gradient each prediction received was a function of "
                "that prediction alone at every step read (1: the loss never paired a "
                "prediction with its own target; its minimum is the targets' mean)")]
    factor = sig.get("loss_broadcast_factor")
    if factor is None or factor < 2:
        return None
    return "convergence_to_wrong_solution", [
        _ev(sig, "loss_broadcast_factor", "terms the loss compared per element it was given "
            "(>= 2: prediction and target shapes broadcast; its minimum is the targets' mean)")]


def bounded_output(sig: dict):
    """``convergence_to_wrong_solution`` when the output's range cannot reach some targets.

    Outputs never below 0 with exact zeros (a ReLU or clamp), or within a sigmoid's [0, 1] or a
    tanh's [-1, 1] and pressing against the bound, while targets lie beyond it: the model
    converges to the best answer its output range allows.
    """
    share = sig.get("output_range_unreachable")
    if share is None or share < UNREACHABLE_SHARE:
        return None
    return "convergence_to_wrong_solution", [
        _ev(sig, "output_range_unreachable", f"share of targets outside the output's range "
            f"{sig.get('output_range', '')} (>= {UNREACHABLE_SHARE:g}: it cannot reach them)")]


def one_value_targets(sig: dict):
    """``convergence_to_wrong_solution`` when every training target is the same.

    One class in every label (or one value in every regression target) makes the constant
    predictor perfect: its loss is 0, and the model reaches it by learning its output bias,
    whatever the inputs (the loss falls to a few percent of its first value within steps). A
    loss that needs the inputs to get low (a contrastive loss whose positive is always class 0)
    does not fall that way, so it is not read as this.
    """
    base = sig.get("constant_predictor_loss")
    first, final = sig.get("loss_first"), sig.get("loss_final")
    if base is None or base > 1e-9 or first is None or final is None or first <= 0:
        return None
    if not final <= ONE_VALUE_LOSS * first:
        return None
    ev = [_ev(sig, "constant_predictor_loss", "loss of always predicting the one target value "
              "the training labels hold (0: they carry nothing to learn)"),
          _ev(sig, "loss_first", "loss of the untrained model"),
          _ev(sig, "loss_final", f"median of the last steps (<= {ONE_VALUE_LOSS:g} x the first: "
              "the constant was learned)")]
    if sig.get("majority_rate") is not None:
        ev.append(_ev(sig, "majority_rate", "share of the most frequent class in the training "
                      "targets (1: every label is one class)"))
    for split in ("val", "train"):
        if f"{split}_acc_final" in sig:
            ev.append(_ev(sig, f"{split}_acc_final", f"'{sig[f'{split}_acc_name']}' at the end"))
            break
    return "convergence_to_wrong_solution", ev


def unbounded_below(sig: dict):
    """``gradient_instability`` when the training loss fell without bound.

    Below -``UNBOUNDED_LOSS`` and ``UNBOUNDED_RATIO`` times the untrained model's loss in size:
    the objective has no minimum to converge to (a sign error: a log-likelihood maximised as
    a loss, ``-criterion(...)``), so every step drives the weights further and the values
    overflow, as a rate too high does, whatever the rate.
    """
    if "loss_unbounded" not in sig:
        return None
    return "gradient_instability", [
        _ev(sig, "loss_first", "the untrained model's loss"),
        _ev(sig, "loss_unbounded", f"lowest loss (<= -{UNBOUNDED_LOSS:g} and "
            f"{UNBOUNDED_RATIO:g}x the first in size: no minimum to reach)")]


def restored_wrong_way(sig: dict):
    """``convergence_to_wrong_solution`` when the weights the run ends with are its worst epoch's.

    An ``EarlyStopping`` restoring its "best" weights by a mode that runs against the monitored
    quantity (a loss watched with ``mode="max"``): whatever the curves show, the model left is
    the one they show at its worst.
    """
    if "restored_wrong_way" not in sig:
        return None
    return "convergence_to_wrong_solution", [
        _ev(sig, "restored_epoch", f"the epoch whose weights the run ends with "
            f"('{sig['restored_monitor']}' judged the wrong way)"),
        _ev(sig, "restored_value", f"'{sig['restored_monitor']}' at that epoch"),
        _ev(sig, "restored_best_value", "its best value in the fit")]


def below_zero(sig: dict):
    """``convergence_to_wrong_solution`` when a loss that cannot be negative went below 0.

    Cross-entropy, NLL of log-probabilities, squared or absolute errors are never negative on
    valid inputs; a reading below 0 means the loss is given something else (``nll_loss`` fed
    probabilities: its minimum is -1 instead of 0), so its falling measures another objective
    and says nothing of the one intended, whatever the curve looks like.
    """
    if "loss_below_zero" not in sig:
        return None
    return "convergence_to_wrong_solution", [
        _ev(sig, "loss_below_zero", f"lowest loss of '{sig['loss_kind']}', which cannot be "
            "negative on valid inputs (< 0)"),
        _ev(sig, "loss_final", "last loss")]


def wrong_solution(sig: dict):
    """``convergence_to_wrong_solution``: the loss falls, the metric stays trivial.

    Trivial: an F1 that stays ~0, or an accuracy at the majority rate (with a falling loss, or a
    loss at the constant predictor's).
    """
    falls = sig.get("loss_relative_drop", 0) >= LOSS_FALLS
    balanced = [s for s in ("val", "train") if sig.get(f"{s}_f1_final", 0.0) >= TRIVIAL_F1]
    for split in ("val", "train"):
        if f"{split}_f1_final" in sig and falls and sig[f"{split}_f1_max"] < 2 * TRIVIAL_F1 \
                and sig[f"{split}_f1_final"] < TRIVIAL_F1:
            return "convergence_to_wrong_solution", [
                _ev(sig, "loss_relative_drop", "the loss falls"),
                _ev(sig, f"{split}_f1_final", f"'{sig[f'{split}_f1_name']}' stays ~0")]
        if balanced:
            continue  # a class-balanced score that is not trivial outranks accuracy (of either
            # split: an F1 printed beside a validation accuracy is often read as a training one)
        if f"{split}_acc_final" in sig and sig.get("majority_rate") is not None:
            trivial = sig[f"{split}_acc_final"] <= sig["majority_rate"] + TRIVIAL_METRIC_MARGIN
            acc = sig[f"{split}_acc_final"]
            if sig.get("loss_weighted") and 1.0 - sig["majority_rate"] + TRIVIAL_METRIC_MARGIN \
                    < acc < sig["majority_rate"] - TRIVIAL_METRIC_MARGIN:
                continue  # a class-weighted loss trades plain accuracy for the rare classes'
                # recall on purpose: below the majority rate is its choice; at a rare class's
                # share it predicts that class for every row, a constant all the same
            # fell to the prior's loss (it learned the prior, nothing else); a loss that never
            # moved is a plateau (not_decreasing), whatever the accuracy
            near_baseline = sig.get("constant_predictor_loss") is not None and \
                sig.get("loss_final", 0) >= BASELINE_MARGIN * sig["constant_predictor_loss"] \
                and sig.get("loss_relative_drop", 0) >= PLATEAU_DROP
            train = sig.get("train_acc_final", sig.get("train_acc_bound"))
            if split == "val" and train is not None and sig.get("acc_gap", 0) >= ACC_GAP and \
                    train > sig["majority_rate"] + TRIVIAL_METRIC_MARGIN:
                continue  # the training set is fitted, not trivially: a generalisation gap
            if trivial and (falls or near_baseline):
                return "convergence_to_wrong_solution", [
                    _ev(sig, "loss_relative_drop", "the loss falls" if falls else
                        "the loss reaches the constant predictor's"),
                    _ev(sig, f"{split}_acc_final", f"'{sig[f'{split}_acc_name']}' at the end"),
                    _ev(sig, "majority_rate", "accuracy of always predicting the majority class")]
    split = "val" if "val_error_final" in sig else "train"
    if falls and sig.get("error_share", 0.0) >= TRIVIAL_ERROR_SHARE:
        ev = [_ev(sig, "loss_relative_drop", "the loss falls"),
              _ev(sig, f"{split}_error_final", f"'{sig[f'{split}_error_name']}' at the end")]
        if f"{split}_error_baseline" in sig:
            ev.append(_ev(sig, f"{split}_error_baseline", "the same error of a constant "
                          "prediction (the targets' median or mean): the model predicts no better"))
        return "convergence_to_wrong_solution", [*ev, _ev(
            sig, "error_share", "the model's error over the constant prediction's (1 - R² for "
            f"an R²; >= {TRIVIAL_ERROR_SHARE:g})")]
    return None


def trivial_validation(sig: dict):
    """``convergence_to_wrong_solution``: training fitted, validation trivial at every look.

    The training accuracy (or its bound) clearly above the majority rate, 15 points above
    validation's, and the validation accuracy at guessing level (within 3 points of the lower
    of the training majority rate and one in k classes) at each of three or more evaluations:
    nothing learned carries over, as when the validation labels do not
    mean what the training labels do. After the gap's rules: alone, or secondary to
    ``overfitting``, so a confirmed cause can make it primary.
    """
    majority = sig.get("majority_rate")
    train = sig.get("train_acc_final", sig.get("train_acc_bound"))
    chance = 1.0 / sig["class_count"] if sig.get("class_count") else majority
    if majority is None or train is None or sig.get("val_acc_points", 0) < 3 or \
            sig.get("acc_gap", 0) < ACC_GAP or train <= majority + TRIVIAL_METRIC_MARGIN or \
            sig.get("val_acc_max", 1.0) > min(majority, chance) + 2 * TRIVIAL_METRIC_MARGIN:
        return None  # (validation at guessing level at every look, the lower of the training
        # majority's and one in k: a validation split may be balanced otherwise)
    return "convergence_to_wrong_solution", [
        _ev(sig, "val_acc_max", f"'{sig['val_acc_name']}' at its best"),
        _ev(sig, "majority_rate", "accuracy of always predicting the majority class"),
        _ev(sig, "acc_gap", "training accuracy above validation's")]


def vanishing(sig: dict):
    """``gradient_instability`` when first-layer gradients are far below the last layer's.

    Only while the loss barely moves. A mechanism measured inside the model, not what the user
    sees: when the loss is also flat by :func:`not_decreasing`, that symptom is the category and
    vanishing gradients the secondary one (the rule comes after it in :data:`RULES`).
    """
    if sig.get("first_to_last_grad_ratio", 1.0) >= VANISH_RATIO:
        return None
    if sig.get("loss_relative_drop", 0) >= 4 * PLATEAU_DROP:
        return None
    return "gradient_instability", [
        _ev(sig, "first_to_last_grad_ratio",
            f"median gradient norm of '{sig['first_layer']}' / '{sig['last_layer']}' < {VANISH_RATIO:g}"),
        _ev(sig, "loss_relative_drop", "the loss barely moves")]


def _left_worse(sig: dict) -> bool:
    """The loss peaked at twice its start and ended 1.25x above it, worse than the prior's.

    A plateau cannot end above where it began and above the constant predictor's: updates
    that overshoot (a momentum or rate too high) drove it up, and it never came back down.
    """
    base = sig.get("constant_predictor_loss")
    start = sig["loss_initial"]
    return bool(base) and sig["loss_final"] >= WORSE_RATIO * start and \
        sig["loss_final"] > base and sig.get("loss_spike", 0) >= PEAK_RATIO * start


def not_decreasing(sig: dict):
    """``loss_not_decreasing`` when the loss barely falls, or ends near the constant predictor's.

    Needs enough loss points; a loss that rises is divergence (:func:`exploding`), not a plateau.
    """
    base = sig.get("constant_predictor_loss")
    if sig.get("loss_points", 0) < MIN_STEPS:
        if sig.get("loss_points", 0) < 2 or not base or sig["loss_final"] < BASELINE_MARGIN * base \
                or "first_nonfinite_step" in sig or sig.get("steps", 0) >= MIN_STEPS:
            return None  # few finite readings because the values blew up: not a short run
        return "loss_not_decreasing", [  # a short run can still show it learned nothing
            _ev(sig, "steps", "optimizer steps in the whole run"),
            _ev(sig, "loss_final", "median of the last steps"),
            _ev(sig, "constant_predictor_loss", "loss of predicting the label prior / mean "
                f"(final loss >= {BASELINE_MARGIN} x this)")]
    if sig["loss_final"] >= DIVERGE_RATIO * max(sig["loss_initial"], 0) or \
            sig["loss_initial"] > 0 and _left_worse(sig):
        return None  # a rising loss is divergence (gradient_instability), not a plateau
    converged = base is not None and sig["loss_final"] < 0.5 * base
    if sig["loss_relative_drop"] < PLATEAU_DROP and not converged:
        return "loss_not_decreasing", [
            _ev(sig, "loss_initial", "median of the first steps"),
            _ev(sig, "loss_final", "median of the last steps"),
            _ev(sig, "loss_relative_drop", f"relative decrease < {PLATEAU_DROP}"),
            *_update_size(sig)]
    if base is not None and base > 0 and sig["loss_final"] >= BASELINE_MARGIN * base:
        return "loss_not_decreasing", [
            _ev(sig, "loss_final", "median of the last steps"),
            _ev(sig, "constant_predictor_loss", "loss of predicting the label prior / mean "
                f"(final loss >= {BASELINE_MARGIN} x this)"),
            *_update_size(sig)]
    return None


def stalled_head(sig: dict):
    """``loss_not_decreasing`` when one head of a multi-output model learned nothing.

    Its best validation loss (else its last training loss) at least ``BASELINE_MARGIN`` of its
    own constant predictor's: the summed loss falls with the other heads, this one stays at its
    prior (labels apart from their rows, a head cut from its inputs).
    """
    share = sig.get("head_floor_share")
    if share is None or share < BASELINE_MARGIN:
        return None
    return "loss_not_decreasing", [
        _ev(sig, "head_floor_share", f"the {sig.get('head_floor_name')!r} head's loss over its "
            f"constant predictor's (>= {BASELINE_MARGIN}: it learned nothing the other heads' "
            "progress hides)"),
        _ev(sig, "head_floor_loss", "that head's loss"),
        _ev(sig, "head_constant_loss", "predicting that head's label prior / mean")]


PLATEAU_SIGNAL = "loss_floor_share"  # cited only by :func:`plateau`: its mark


def plateau(sig: dict):
    """``loss_not_decreasing``, tentatively: the loss ends well above zero.

    Also for a short run (fewer than ``FEW_STEPS`` optimizer steps) whatever the shape of its
    curve: it may have stopped before it learned (``training_length`` tests that).

    A loss can settle at 40-95% of the constant predictor's (15% when a long run's second half
    fell < 10%: flat) because the task is hard (noisy labels) or because something holds it up (frozen layers, heavy dropout,
    a rate far too low, hidden layers without activation, a weight decay pulling the weights to
    zero): a model that learned part of the task and stopped there looks healthy otherwise.
    Where most weights never updated, or the learning rate sat below 1% of its peak for at
    least half the run (a schedule that all but stopped training), a loss settled anywhere
    above 5% of it is suspect too.
    Signals cannot tell which, an experiment can: this classification stands only when Isolate
    confirms a cause by experiment (:func:`tentative`, :func:`without_cause`).
    """
    share = sig.get(PLATEAU_SIGNAL)
    short = MIN_STEPS <= sig.get("steps", 0) < FEW_STEPS  # may have stopped before it learned
    held = sig.get("untrained_share", 0.0) >= UNTRAINED_SHARE  # most weights never updated
    stalled = sig.get("lr_collapsed_share", 0.0) >= LR_STALLED  # or most steps updated ~nothing
    flat = not short and sig.get("loss_tail_drop", 1.0) < SETTLED_TAIL
    floor = HELD_FLOOR if held or stalled else SETTLED_FLOOR if flat else FLOOR_SHARE
    if share is None or not floor <= share < BASELINE_MARGIN or "first_nonfinite_step" in sig \
            or not (short or held) and (sig.get("loss_points", 0) < 4 * MIN_STEPS or
                                        sig.get("loss_tail_drop", 0.0) >= TAIL_DROP):
        return None  # (a long run still learning fast has not settled)
    ev = [_ev(sig, "loss_final", "median of the last steps"),
          _ev(sig, "constant_predictor_loss", "loss of predicting the label prior / mean"),
          _ev(sig, PLATEAU_SIGNAL, f"the loss ends at >= {floor:g} x the constant "
              "predictor's (tentative: it stands only if an experiment finds what holds it up)")]
    if stalled:
        ev.append(_ev(sig, "lr_collapsed_share", "of the run's steps with the learning rate below "
                      "1% of its peak (what could hold the loss up)"))
    if held:
        ev.append(_ev(sig, "untrained_share", f"of the model's parameters no step updated "
                      f"(>= {UNTRAINED_SHARE:g}: what could hold the loss up)"))
    if short:
        ev.append(_ev(sig, "steps", f"optimizer steps in the whole run (< {FEW_STEPS}: it may "
                      "have stopped before it learned)"))
    elif "loss_tail_drop" in sig and not held:
        ev.append(_ev(sig, "loss_tail_drop", f"fall over the second half of the run (< "
                      f"{TAIL_DROP:g}: settled, or falling slowly)"))
    return "loss_not_decreasing", ev


def tentative(cls: Classification | None) -> bool:
    """Whether ``cls`` rests on :func:`plateau` alone (it needs a cause confirmed by experiment)."""
    return cls is not None and cls.primary == "loss_not_decreasing" and \
        any(e.signal == PLATEAU_SIGNAL for e in cls.evidence) and \
        not any(e.signal == "loss_relative_drop" for e in cls.evidence)


def without_cause(cls: Classification) -> Classification:
    """A tentative plateau no experiment explained: ``healthy``, saying what was tested."""
    return Classification(HEALTHY, tuple(c for c in cls.secondary if c != HEALTHY), (
        *[e for e in cls.evidence if e.signal != PLATEAU_SIGNAL],
        Evidence(PLATEAU_SIGNAL, next(e.value for e in cls.evidence if e.signal == PLATEAU_SIGNAL),
                 "the loss settled there, but no probe or re-run found anything holding it up: "
                 "taken as this task's floor")))


def _update_size(sig: dict) -> list[Evidence]:
    """How large the optimizer's steps are against the weights, as supporting evidence.

    About 1e-3 per step is the usual rule of thumb; far below it the steps are too small to
    move the loss (a learning rate too low), far above it they overshoot.
    """
    ratio = sig.get("update_ratio_median")
    if ratio is None:
        return []
    if ratio < UPDATE_RATIO_LOW:
        verdict = f"< {UPDATE_RATIO_LOW:g}: steps too small to move the weights"
    elif ratio > UPDATE_RATIO_HIGH:
        verdict = f"> {UPDATE_RATIO_HIGH:g}: steps large enough to overshoot"
    else:
        verdict = "in the usual range"
    return [_ev(sig, "update_ratio_median",
                f"median |update| / |weights| per step over {sig['update_ratio_points']} "
                f"readings (about 1e-3 is typical; {verdict})")]


def slow_data(sig: dict):
    """``performance_issue`` when waiting for data takes a large share of each step.

    Over the whole run the wait must cost at least :data:`SLOW_TOTAL_S`, as for
    :func:`loop_overhead`: the few steps of a full-batch run can wait most of their time for a
    loader and still lose a fraction of a second, less than a loaded machine's noise.
    """
    if sig.get("data_wait_fraction", 0) < DATA_WAIT_FRACTION or \
            sig.get("data_wait_ms", 0) < DATA_WAIT_MS or \
            sig.get("data_wait_s", SLOW_TOTAL_S) < SLOW_TOTAL_S:
        return None
    return "performance_issue", [
        _ev(sig, "data_wait_fraction", f"share of step time waiting for data (>= {DATA_WAIT_FRACTION})"),
        _ev(sig, "data_wait_ms", "mean data wait per step, ms"),
        _ev(sig, "step_ms", "mean step time, ms")]


def loop_overhead(sig: dict):
    """``performance_issue`` when the loop's own work takes most of each step.

    That is the time outside data loading, forward, backward and the optimizer step: a sleep, a
    synchronous log or checkpoint, a host copy, a metric computed on the CPU, every step. Over
    the whole run it must cost at least :data:`SLOW_TOTAL_S` (a dozen steps of a few ms each is
    not worth a diagnosis, and on a loaded machine it is noise).
    """
    if sig.get("step_overhead_share", 0) < OVERHEAD_SHARE or \
            sig.get("step_overhead_ms", 0) < OVERHEAD_MS or \
            sig.get("step_overhead_s", SLOW_TOTAL_S) < SLOW_TOTAL_S:
        return None
    return "performance_issue", [
        _ev(sig, "step_overhead_share", f"median share of each step outside data loading, "
            f"forward, backward and the optimizer step (>= {OVERHEAD_SHARE:g})"),
        _ev(sig, "step_overhead_ms", f"median such time per step, ms (>= {OVERHEAD_MS:g})"),
        _ev(sig, "step_ms", "mean step time, ms")]


def retraced(sig: dict):
    """``performance_issue`` when a custom loop's compiled step was traced on many steps.

    A ``tf.function`` traces its Python body and builds a new graph for every new Python value
    it is given: each such step pays the trace (tens to hundreds of milliseconds, far more than
    the compiled step) instead of running the graph, the slowdown TensorFlow's own "triggered
    tf.function retracing" warning is about.
    """
    if sig.get("step_traces", 0) < RETRACED_MIN or \
            sig.get("step_traced_share", 0) < RETRACED_SHARE:
        return None
    return "performance_issue", [
        _ev(sig, "step_traces", f"times the compiled training step was traced (>= "
            f"{RETRACED_MIN}): each trace builds a new graph instead of running the last"),
        _ev(sig, "step_traced_share", f"traces per optimizer step (>= {RETRACED_SHARE:g})")]


def gpu_idle(sig: dict):
    """``performance_issue`` when the GPU sits mostly idle during long steps."""
    if sig.get("gpu_util_median", 100) >= GPU_IDLE_UTIL or sig.get("step_ms", 0) < GPU_IDLE_STEP_MS:
        return None
    return "performance_issue", [
        _ev(sig, "gpu_util_median", f"median GPU utilisation, percent (< {GPU_IDLE_UTIL:g}: the "
            "GPU waits on the CPU)"),
        _ev(sig, "step_ms", f"mean step time, ms (>= {GPU_IDLE_STEP_MS:g}: time worth saving)"),
        _ev(sig, "gpu_util_samples", "readings")]


RULES: tuple[Callable[[dict], tuple | None], ...] = (
    nonfinite, unbounded_below, oom, rank_hang, loss_without_metric, broadcast_loss, exploding, memory_growth,
    rank_desync, bounded_output, restored_wrong_way, below_zero, one_value_targets, overfitting, wrong_solution, generalisation_gap,
    trivial_validation,
    not_decreasing, stalled_head, vanishing, rank_straggler, slow_data, loop_overhead, retraced, gpu_idle,
    plateau,
)


def classify(sig: dict, prefer: str | None = None) -> Classification:
    """Apply the rule table to a signal dict.

    Parameters
    ----------
    sig : dict
        The run's signals (:mod:`model_debugger.signals`).
    prefer : str, optional
        A category to make primary when one of its rules fired, whatever the table's order
        (Isolate's confirmed cause names it); the other categories that fired stay secondary.

    Returns
    -------
    Classification
        ``healthy`` with the numbers that were checked when no rule fires.
    """
    fired: list[tuple[str, list[Evidence]]] = []
    for rule in RULES:
        out = rule(sig)
        if out is not None and (rule is not plateau or not fired):  # tentative: only alone
            fired.append(out)
    if not fired:
        ev = [Evidence("steps", sig.get("steps", 0), "optimizer steps observed")]
        for key in ("loss_relative_drop", "val_loss_rise", "data_wait_fraction", "error"):
            if key in sig:
                ev.append(_ev(sig, key, "checked, within normal range" if key != "error"
                              else "the run failed, but no training problem was measured"))
        if sig.get("steps", 0) < MIN_STEPS and "error" not in sig:
            ev.append(Evidence("steps", sig.get("steps", 0),
                               f"fewer than {MIN_STEPS} steps: too short to judge"))
        return Classification(HEALTHY, (), tuple(ev))
    fired.sort(key=lambda out: out[0] != prefer)  # stable: the table's order otherwise
    primary = fired[0][0]
    evidence = list(fired[0][1])
    secondary: list[str] = []
    for cat, ev in fired[1:]:
        if cat == primary:
            evidence += [e for e in ev if e not in evidence]
        elif cat not in secondary:
            secondary.append(cat)
    return Classification(primary, tuple(secondary), tuple(evidence))
