"""Signals: the numbers a run is judged by, computed once from a Run.

Every value here is a plain float/int/str (or None when the run cannot tell), so rules can cite
them as evidence verbatim.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from .records import METRIC_SOURCES, Run, as_float, ranks_at_half
from .thresholds import (
    DIVERGE_RATIO,
    MIN_STEPS,
    UNBOUNDED_LOSS,
    UNBOUNDED_RATIO,
    UNPAIRED_CORR,
    UNPAIRED_READS,
    WINDOW_ROWS,
)

# every signal compute() produces, with its meaning (names are public: rules, findings and
# Verify cite them)
SIGNALS: dict[str, str] = {
    "steps": "optimizer steps recorded",
    "epochs": "epochs recorded",
    "loss_points": "finite training-loss readings",
    "loss_source": "'epochs' when no step's loss was read and the loss signals come from the "
                   "training loss reported each epoch",
    "loss_window": "readings averaged into one when a step holds < 32 targets (the loss-level "
                   "signals below are read on those means)",
    "stage_start": "optimizer step where the run's last training stage began (its loss "
                   "curve is the one read: loss_* signals)",
    "loss_initial": "median loss over the first ~10% of readings",
    "loss_final": "median loss over the last ~10% of readings",
    "loss_min": "lowest finite loss",
    "loss_below_zero": "lowest loss of a loss that cannot be negative, when it went below 0",
    "loss_unbounded": "lowest loss, when it fell below -1e6 and 1e4x the untrained model's "
                      "|loss|: an objective without a minimum (a sign error)",
    "loss_kind": "the loss function the capture saw (its name)",
    "loss_max": "highest finite loss",
    "loss_spike": "highest finite loss after a 10% warm-up",
    "loss_relative_drop": "(loss_initial - loss_final) / |loss_initial|",
    "loss_first": "median of the first 3 loss readings (the model before its updates took effect)",
    "loss_peak_ratio": "loss_max / loss_first: how far the updates drove the loss above its start",
    "loss_blowup_step": "first optimizer step whose loss (a mean of loss_window readings) "
                        "reached DIVERGE_RATIO x loss_first: when the run blew up",
    "loss_tail_drop": "relative fall of the loss over the second half of the run",
    "loss_floor_share": "loss_final / constant_predictor_loss: where the loss settled",
    "untrained_share": "share of the model's parameters no optimizer step updated (frozen, "
                       "left out of the optimizer, or cut from the loss's graph)",
    "lr_peak": "the highest learning rate the first parameter group had",
    "lr_collapsed_share": "share of the run's steps after the rate fell below 1% of its peak",
    "held_name": "the variable of your loop whose container of tensors/arrays grows fastest",
    "held_mb_per_step": "how fast it grows, MB per step (between the first and last look)",
    "held_share": "held_mb_per_step / the process's (or GPU's) memory growth per step",
    "loss_uninformed": "loss of an untrained model that knows nothing (uniform scores, zero output)",
    "loss_start_excess": "loss_first / loss_uninformed: how far the untrained model's outputs "
                         "make it worse than knowing nothing (inputs or outputs far too large)",
    "constant_predictor_loss": "loss of the best input-independent predictor (label prior/mean)",
    "majority_rate": "share of the most frequent class in the training targets",
    "class_count": "classes the training targets count (a class-id loss)",
    "loss_weighted": "1: the training loss weights classes or samples (weight=, class_weight)",
    "first_nonfinite_step": "first step with a non-finite loss, gradient or weight",
    "nonfinite_what": "what went non-finite first (loss, gradient, weights)",
    "nonfinite_module": "the module where the first non-finite value appeared",
    "last_finite_grad_step": "last step whose measured gradients were finite (weights went bad)",
    "grad_norm_initial": "median global gradient norm over the first readings",
    "grad_norm_max": "largest finite global gradient norm",
    "grad_norm_growth": "grad_norm_max / grad_norm_initial",
    "graphs_kept_share": "share of past steps whose loss or prediction tensor, with its "
                         "autograd graph, was still alive a few steps later (kept by the loop)",
    "output_range_unreachable": "share of the training targets the model's bounded output (a "
                                "ReLU's [0, inf), a sigmoid's [0, 1], a tanh's [-1, 1]) cannot "
                                "reach",
    "output_range": "the bounded range the loss inputs stayed in (with output_range_unreachable)",
    "head_floor_share": "a multi-output model's least-trained head: its best validation loss "
                        "(else its last training loss) over the loss of predicting its label "
                        "prior / mean",
    "head_floor_name": "the head of head_floor_share",
    "head_floor_loss": "that head's loss (with head_floor_share)",
    "head_constant_loss": "the loss of predicting that head's label prior / mean",
    "output_range_head": "the output of a multi-output model whose range leaves targets out of "
                         "reach (with output_range_unreachable)",
    "loss_broadcast_factor": "terms the training loss compared / elements it was given: the "
                             "prediction and target shapes differ and broadcast (every "
                             "prediction against every target)",
    "grad_not_reset_share": "share of checked steps whose backward began with the last step's "
                            "gradients still there (never reset)",
    "update_ratio_median": "median |update| / |weights| per optimizer step",
    "update_ratio_points": "update-ratio readings",
    "first_layer": "name of the layer nearest the input with gradient norms",
    "last_layer": "name of the layer nearest the output with gradient norms",
    "first_to_last_grad_ratio": "median gradient norm of the first layer / of the last layer",
    "rss_start_mb": "process memory after warm-up, MB",
    "rss_end_mb": "process memory at the end, MB",
    "rss_growth_mb": "process memory growth after warm-up, MB",
    "rss_slope_mb_per_step": "process memory growth per step (linear fit), MB",
    "rss_growth_r2": "R^2 of that linear fit",
    "rss_last_epoch_mb_per_step": "process memory growth per step over the last epoch, MB",
    "cuda_growth_mb": "GPU memory allocated, growth after warm-up, MB",
    "cuda_slope_mb_per_step": "GPU memory growth per step (linear fit), MB",
    "cuda_growth_r2": "R^2 of that linear fit",
    "gpu_util_median": "median GPU utilisation, percent",
    "gpu_util_samples": "GPU utilisation readings",
    "error_kind": "kind of the error that ended the run (oom, ...)",
    "error": "type and message of that error (300 characters at most)",
    "data_wait_fraction": "share of step time spent waiting for data",
    "data_wait_s": "seconds spent waiting for data over the observed steps",
    "step_overhead_ms": "median time per step outside data loading, forward, backward, the "
                        "optimizer step and collectives (the loop's own work), ms",
    "step_overhead_share": "median share of a step's time that is the loop's own work",
    "step_overhead_s": "seconds of the loop's own work over the steps after the warm-up",
    "ranks": "world size of a multi-process job (from its ranks' process groups)",
    "ranks_seen": "processes of the job whose records were read",
    "rank_straggler": "the rank with the most own work per step (all but backward, the "
                      "optimizer step and collectives)",
    "rank_straggler_ms": "its own work per step above the other ranks' median, ms",
    "rank_straggler_share": "that excess as a share of the median step time (every rank waits "
                            "for it)",
    "nonfinite_rank": "the rank where the first non-finite value appeared",
    "nonfinite_rank_step": "the step it appeared at",
    "nonfinite_rank_module": "the module where it appeared on that rank",
    "nonfinite_ranks": "ranks that recorded a non-finite value",
    "nonfinite_rank_tie": "ranks where it appeared at the same step and place (no one rank's)",
    "rank_desync": "largest relative spread of the replicas' parameter checksums",
    "rank_checksums": "steps whose checksums were compared across ranks",
    "rank_updates_apart": "1 - fewest / most optimizer steps over the ranks (0: in step)",
    "rank_updates": "each rank's optimizer steps, when they are >= 10% apart",
    "rank_desync_start": "relative spread of the replicas' checksums before the first update",
    "rank_desync_step": "first step whose checksums differ",
    "rank_desync_ranks": "ranks whose checksum differs from rank 0's at that step",
    "rank_hang": "1 when ranks ended waiting in a collective that another rank never reached",
    "rank_hang_missing": "the ranks that never reached it",
    "rank_hang_waiting": "the ranks that waited in it",
    "rank_hang_seconds": "longest wait recorded, seconds",
    "data_wait_ms": "mean data wait per step, ms",
    "step_ms": "mean step time, ms",
    "loss_unpaired": "1 when, at every step its gradient was read (a loss written by hand), "
                     "each one-column prediction's gradient was an affine function of the "
                     "prediction alone (no row paired with its own target); else 0",
    "step_traces": "times a custom loop's tf.function training step was traced",
    "step_traced_share": "traces of that step per optimizer step (1: every step traced anew)",
    "val_loss_name": "name of the validation-loss metric",
    "val_points": "finite validation-loss readings",
    "val_loss_min": "lowest validation loss",
    "val_loss_min_index": "reading at which the validation loss was lowest",
    "val_loss_final": "last validation loss",
    "val_loss_rise": "(val_loss_final - val_loss_min) / |val_loss_min|",
    "restored_wrong_way": "1: the last fit's EarlyStopping restored the weights of the epoch "
                          "its mode judged best, the worst by the monitored quantity's own "
                          "direction (a loss watched with mode='max')",
    "restored_value": "the monitored quantity at the restored epoch",
    "restored_best_value": "its best value over the fit, by its own direction",
    "restored_epoch": "the epoch whose weights were restored (0-based)",
    "restored_monitor": "the quantity the EarlyStopping watched",
    "restored_best": "1: the last fit's EarlyStopping, watching the validation loss, stopped "
                     "it and restored its best epoch's weights (the rise after it is the wait)",
    "train_loss_at_val_min": "training loss (per epoch) when validation was best",
    "train_loss_final": "last training loss (per epoch)",
    "gap_at_val_min": "validation minus training loss when validation was best",
    "gap_final": "validation minus training loss at the end",
    "train_acc_bound": "lowest training accuracy the final loss allows (each error costs >= ln 2)",
    "acc_gap": "training accuracy (or its bound) minus the last validation accuracy",
    **{f"{split}_error_{what}": f"{meaning} of the {split} regression error metric (mae, mse, "
       "rmse), when the loss is one the capture does not know"
       for split in ("val", "train")
       for what, meaning in (("name", "name"), ("final", "last value"),
                             ("baseline", "a constant prediction's value (from the targets)"))},
    "error_share": "the regression error metric over a constant prediction's, squared for "
                   "MAE and RMSE (an MSE ratio: 1 - R^2 for MSE), or 1 - a reported R^2; the "
                   "validation's when there is one",
    **{f"{split}_{kind}_{what}": f"{meaning} of the {split} {word}"
       for split in ("val", "train")
       for kind, word in (("acc", "accuracy"), ("f1", "F1 score"))
       for what, meaning in (("name", "metric name"), ("final", "last value (0..1)"),
                             ("max", "best value (0..1)"), ("gain", "last minus first value"),
                             ("points", "readings"))},
}

# signals derived from compute()'s by :func:`outcome_signals` (Verify judges a run by them)
OUTCOME_SIGNALS: dict[str, str] = {
    "finite_fraction": "share of the steps before the first non-finite value (1.0: none)",
    "completed": "0.0 when the run ended out of memory, else 1.0",
}


def outcome_signals(sig: dict) -> dict:
    """:data:`OUTCOME_SIGNALS` of a run, from the signals :func:`compute` returned."""
    steps = max(sig.get("steps", 0), 1)
    return {"finite_fraction": (min(sig["first_nonfinite_step"], steps) / steps
                                if "first_nonfinite_step" in sig else 1.0),
            "completed": 0.0 if sig.get("error_kind") == "oom" else 1.0}


def _finite(a: np.ndarray) -> np.ndarray:
    return a[np.isfinite(a)]


def _noise_window(targets: dict | None, steps: int, points: int) -> int:
    """Loss readings to average so that each mean covers at least :data:`WINDOW_ROWS` targets.

    A step on one or two rows records the loss of those rows alone: its spread is the spread
    of the data, and a "spike" ten times the first readings is one hard example. 1 when the
    steps hold enough rows, or too few readings would be left to judge.
    """
    n = (targets or {}).get("n")
    if not n or not steps:
        return 1
    per_step = n / steps
    if per_step >= WINDOW_ROWS:
        return 1
    k = int(math.ceil(WINDOW_ROWS / max(per_step, 1e-9)))
    return k if points // k >= MIN_STEPS else 1


def _block_means(a: np.ndarray, k: int) -> np.ndarray:
    """Means of consecutive blocks of ``k`` readings (the last block may be shorter)."""
    return np.array([a[i:i + k].mean() for i in range(0, len(a), k)])


def _head_tail(a: np.ndarray) -> tuple[float, float]:
    """Robust start and end level of a curve: medians of its first and last ~10%."""
    k = max(1, min(20, len(a) // 10))
    return float(np.median(a[:k])), float(np.median(a[-k:]))


def constant_predictor(targets: dict | None) -> tuple[float | None, float | None]:
    """Loss of the best constant predictor and the majority-class rate, from target statistics.

    Parameters
    ----------
    targets : dict or None
        The last ``targets`` event: ``{"loss", "n", "counts"}`` or ``{"loss", "n", "mean", "var"}``.

    Returns
    -------
    tuple
        ``(baseline_loss, majority_rate)``; either is None when the loss kind gives no formula.
    """
    if not targets:
        return None, None
    if targets.get("reduction") == "sum" or targets.get("weighted"):
        # summed over the batch, or weighted per class or sample (Keras class_weight): another
        # scale than the constant predictor's, so no baseline; the majority rate stands
        return None, constant_predictor({k: v for k, v in targets.items()
                                         if k not in ("reduction", "weighted")})[1]
    loss = targets.get("loss")
    counts = targets.get("counts")
    if counts and loss in ("cross_entropy", "nll_loss"):
        p = np.asarray(counts, dtype=float)
        p = p[p > 0] / p.sum()
        return float(-(p * np.log(p)).sum()) + 0.0, float(p.max())
    mean, var = targets.get("mean"), targets.get("var")
    if mean is None:
        return None, None
    if loss in ("binary_cross_entropy", "binary_cross_entropy_with_logits") and 0 <= mean <= 1:
        if mean in (0.0, 1.0):  # one class only: a constant predicts it perfectly
            return 0.0, 1.0
        return float(-(mean * math.log(mean) + (1 - mean) * math.log(1 - mean))), max(mean,
                                                                                         1 - mean)
    if loss == "mse_loss":
        return float(var), None
    if loss in ("l1_loss", "smooth_l1_loss", "huber_loss") and var is not None:
        return _robust_baseline(loss, math.sqrt(max(var, 0.0))), None
    return None, None


FLOOR_ZEROS = 0.05  # exact zeros among the loss inputs, none below: a ReLU/clamp on the output
PRESSED_SHARE = 0.05  # ... or this share of them at a sigmoid's or tanh's bound: saturated
SPREAD = 1e-3  # outputs within this of each other are one value; within this of a bound, at it
# losses that compare each output with its numeric target; "custom": a Keras ``train_step``
# computing its own loss on numeric targets (``target_values``), read the same way
_REGRESSION = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "custom")
LR_COLLAPSE = 0.01  # a rate below 1% of its peak: the schedule has all but stopped training


def output_range(seen: dict | None, targets: dict | None) -> dict:
    """``output_range_unreachable``: the share of targets a bounded output cannot reach.

    The loss input over the run (the ``targets`` event's ``input_min``, ``input_max``,
    ``input_zero_share`` and ``input_pressed``; else the first batch's ``loss_input``) tells
    the output's range:

    - never below 0, with exact zeros among it: a ReLU or clamp. Under BCE-with-logits no raw
      score below 0 means no probability below 0.5: the class-0 targets are unreachable;
      under a regression loss, the negative ones;
    - within [0, 1] or [-1, 1] (a sigmoid, a tanh) with at least ``PRESSED_SHARE`` of it at a
      bound (saturated): under a regression loss, the targets beyond that bound. Outputs that
      are one value (within ``SPREAD``) away from the bounds show no range: a network collapsed
      to 0.0128 is not a sigmoid (one saturated at 0.99999 is).

    0.0 when the range reaches every target (the signal Verify compares after a fix);
    ``output_range`` names the range when one is found.
    """
    if targets and isinstance(targets.get("input_min"), float):  # over the run (PyTorch)
        seen = {"name": targets.get("loss"), "min": targets["input_min"],
                "max": targets.get("input_max"), "zero_share": targets.get("input_zero_share", 0.0),
                "pressed": targets.get("input_pressed") or {}}
    if not seen or not targets or not isinstance(seen.get("min"), (int, float)):
        return {}
    name, lo, hi = seen.get("name"), seen["min"], seen.get("max")
    pressed = seen.get("pressed") or {}
    floored = lo >= 0 and seen.get("zero_share", 0.0) >= FLOOR_ZEROS
    found: list[tuple[float, str]] = []
    if name == "binary_cross_entropy_with_logits" and floored and \
            isinstance(targets.get("mean"), float):
        found.append((1.0 - targets["mean"], "[0, inf) (a ReLU or clamp on the logits)"))
    if name in _REGRESSION and isinstance(targets.get("negative"), float):  # ("custom" too)
        neg, above = targets["negative"], targets.get("above_one", 0.0)
        below = targets.get("below_minus_one", 0.0)
        if floored:
            found.append((neg, "[0, inf) (a ReLU or clamp)"))
        top = above if pressed.get("1", 0.0) >= PRESSED_SHARE else 0.0
        if not isinstance(hi, (int, float)):
            pass
        elif hi <= 1 and lo >= 0 and _ranged(lo, hi, (0.0, 1.0)):
            found.append((top + (neg if pressed.get("0", 0.0) >= PRESSED_SHARE else 0.0),
                          "[0, 1] (a sigmoid)"))
        elif hi <= 1 and lo >= -1 and _ranged(lo, hi, (-1.0, 1.0)):
            found.append((top + (below if pressed.get("-1", 0.0) >= PRESSED_SHARE else 0.0),
                          "[-1, 1] (a tanh)"))
    if name not in _REGRESSION and name != "binary_cross_entropy_with_logits":
        return {}
    share, bound = max(found) if found else (0.0, None)
    return {"output_range_unreachable": float(share),
            **({"output_range": bound} if bound and share > 0 else {})}


_TOTAL_LOSS = ("loss", "train_loss", "training_loss")


def _total_loss_metric(run: Run) -> np.ndarray | None:
    """The training loss as a whole, per epoch: a metric named ``loss`` (or ``train_loss``).

    Not any metric with "loss" in its name: a VAE's ``kl_loss`` rises while the total falls,
    a GAN's ``d_loss`` sits still while its ``g_loss`` moves.
    """
    metrics = run.metrics()
    for name in _TOTAL_LOSS:
        if name in metrics:
            return np.array([v for _, _, v in metrics[name]], dtype=float)
    return None


def _head_floor(run: Run) -> dict:
    """``head_floor_share``: the multi-output head that learned least, against its prior.

    Each head's loss as Keras reports it over the loss of predicting that head's label prior
    or mean (:func:`constant_predictor` of its ``head_targets``, the training targets): the
    lower of its last training loss (``<head>_loss``) and its best validation loss
    (``val_<head>_loss``), so a validation set shifted from the training one (whose constant
    is then no baseline) does not count alone. At about 1 the head learned nothing, however
    well the other heads (and the summed loss) do.
    """
    metrics = run.metrics()
    best: dict = {}
    for head in {h.get("head"): h for h in run.of("head_targets")}.values():
        base = constant_predictor(head)[0]
        name = head.get("head")
        if not base or base <= 0 or not isinstance(name, str):
            continue
        train = [v for _, _, v in metrics.get(f"{name}_loss", ()) if math.isfinite(v)]
        val = [v for _, _, v in metrics.get(f"val_{name}_loss", ()) if math.isfinite(v)]
        if len(train) < 3:
            continue
        loss = min(train[-1], min(val)) if len(val) >= 3 else train[-1]
        if loss / base > best.get("head_floor_share", -math.inf):
            best = {"head_floor_share": float(loss / base), "head_floor_name": name,
                    "head_floor_loss": float(loss), "head_constant_loss": float(base)}
    return best


def _custom_range(values: dict | None, loss_final) -> dict:
    """:func:`output_range` for a loss the capture does not know (``target_values``).

    Only when that loss compares the outputs with the targets as ``fit`` got them: its final
    value is at least half the least error clipping the targets into the output's range
    forces (``clip_mse``, ``clip_mae``, the smaller). A loss that rescales its targets into
    the range (``mse(t / 1000, p)``) ends far below: nothing is out of its reach.
    """
    if not values or not isinstance(values.get("input_min"), float):
        return {}
    floors = [f for f in (values.get("clip_mse"), values.get("clip_mae"))
              if isinstance(f, (int, float))]
    if not floors or not isinstance(loss_final, (int, float)) or \
            not loss_final >= 0.5 * min(floors):
        return {}
    return output_range(None, {**values, "loss": "custom"})


def _head_range(heads: list[dict]) -> dict:
    """:func:`output_range` of the multi-output head that leaves the most targets out of reach.

    Each ``head_targets`` event is one output's targets and outputs; ``output_range_head``
    names the head when one leaves targets unreachable.
    """
    last = {h.get("head"): h for h in heads}  # each head's latest: the trained model's range
    best: dict = {}
    for head in last.values():
        got = output_range(None, head)
        if "output_range_unreachable" not in got:
            continue
        if got["output_range_unreachable"] > best.get("output_range_unreachable", 0.0):
            best = {**got, "output_range_head": head.get("head")}
        best.setdefault("output_range_unreachable", 0.0)  # (0.0: every head reaches its targets)
    return best


def _ranged(lo: float, hi: float, bounds: tuple[float, float]) -> bool:
    """Whether outputs in ``[lo, hi]`` show a range: they spread, or sit at one of its bounds.

    One value for every row, away from the bounds (a network collapsed to 0.0128), tells
    nothing about an activation; one value at a bound (0.99999: a saturated sigmoid) does.
    """
    return hi - lo >= SPREAD or any(abs(v - b) < SPREAD for v in (lo, hi) for b in bounds)


def uninformed_loss(targets: dict | None) -> float | None:
    """The loss of an untrained model that knows nothing: uniform class scores, or zero output.

    ``ln C`` (cross-entropy over C classes, class weights or not: PyTorch's weighted mean),
    ``ln 2`` (binary cross-entropy; with ``pos_weight`` w and a positive rate p,
    ``ln 2 (w p + 1 - p)``), ``mean^2 + var`` (MSE). A freshly initialised network starts near
    it; far above it, its outputs are far too large. None for other losses, for summed losses
    and for losses weighted otherwise (another scale).
    """
    if not targets or targets.get("reduction") == "sum":
        return None
    loss = targets.get("loss")
    weights = targets.get("weights", "element") if targets.get("weighted") else None
    if weights == "class_weight":  # Keras fit's: each row's loss times its class's weight
        return _class_weighted(targets)
    if weights not in (None, "class", "pos_weight"):
        return None  # rescaled per sample or element: another scale, not known here
    if loss in ("cross_entropy", "nll_loss") and targets.get("counts"):
        return math.log(max(len(targets["counts"]), 2))  # (a class-weighted mean: the same)
    if loss == "binary_cross_entropy_with_logits" and weights == "pos_weight":
        mean, pos = targets.get("mean"), targets.get("pos_weight")
        if mean is None or pos is None or not 0 <= mean <= 1:
            return None
        return math.log(2) * (pos * mean + 1.0 - mean)  # each positive's term counts pos times
    if weights is not None:
        return None
    if loss in ("binary_cross_entropy", "binary_cross_entropy_with_logits"):
        return math.log(2)
    if loss == "mse_loss" and targets.get("mean") is not None and targets.get("var") is not None:
        return float(targets["mean"]) ** 2 + float(targets["var"])
    return None


def _class_weighted(targets: dict) -> float | None:
    """The uninformed loss under Keras ``class_weight``.

    Its unweighted value times the mean weight of the rows (a sum over the batch divided by
    its size, not by the weights).
    """
    w = targets.get("class_weight") or []
    plain = uninformed_loss({k: v for k, v in targets.items()
                             if k not in ("weighted", "weights", "class_weight")})
    counts, mean = targets.get("counts"), targets.get("mean")
    if plain is None or not w:
        return None
    if counts and len(counts) <= len(w) and sum(counts):
        return plain * sum(c * w[k] for k, c in enumerate(counts)) / sum(counts)
    if mean is not None and 0 <= mean <= 1 and len(w) == 2:
        return plain * (w[1] * mean + w[0] * (1.0 - mean))
    return None


def _robust_baseline(loss: str, sd: float) -> float:
    """Expected L1 or Huber/Smooth-L1 loss (delta 1) of predicting the target mean.

    Exact for normally distributed targets of standard deviation ``sd`` (only the first two
    moments of the targets are recorded).
    """
    if sd <= 0:
        return 0.0
    if loss == "l1_loss":
        return sd * math.sqrt(2 / math.pi)
    a = 1.0 / sd  # |residual| < 1 is the quadratic part, in units of sd
    pdf = math.exp(-a * a / 2) / math.sqrt(2 * math.pi)
    inside = math.erf(a / math.sqrt(2))  # P(|u| < a)
    return 0.5 * sd * sd * (inside - 2 * a * pdf) + 2 * sd * pdf - 0.5 * (1 - inside)


STAGE_SHARE = 0.1  # each stage holds at least this share of the run's steps
FRESH_START = 0.5  # a stage starting at >= this share of the first stage's early loss starts
                   # afresh (a new head, a new task)


def last_stage(run: Run) -> int:
    """The step where the run's last training stage began, or 0 for a single stage.

    A stage begins when one optimizer is built after training began (``at_step`` of its
    ``optimizer`` event) and the loss starts afresh there (its early median at least
    :data:`FRESH_START` of the first stage's: a new head, a new task); a fine-tune that goes
    on from what was learned is one curve. Only one such optimizer, with at least
    :data:`STAGE_SHARE` of the steps (and ``4 * MIN_STEPS``) on each side: optimizers re-built
    every epoch or step are the loop's own pattern, not stages.
    """
    n = len(run.steps)
    later = {e["at_step"] for e in run.of("optimizer")
             if isinstance(e.get("at_step"), int) and e["at_step"] > 0}
    if len(later) != 1:
        return 0
    start = later.pop()
    least = max(4 * MIN_STEPS, int(STAGE_SHARE * n))
    if not least <= start <= n - least:
        return 0
    loss = run.series("loss")
    head = [v for v in (loss[:least], loss[start:start + least]) if np.isfinite(v).any()]
    if len(head) == 2 and not np.nanmedian(head[1]) >= FRESH_START * np.nanmedian(head[0]):
        return 0  # it goes on from what the first stage learned (a fine-tune that unfreezes
        # the body): one curve, read whole
    return start


def _per_epoch_train_loss(run: Run) -> np.ndarray:
    by_epoch: dict[int, list[float]] = {}
    for s in run.steps:
        v = s.get("loss")
        if isinstance(v, (int, float)):
            by_epoch.setdefault(s.get("ep", 0), []).append(float(v))
    return np.array([np.mean(by_epoch[k]) for k in sorted(by_epoch)], dtype=float)


def _fit(y: np.ndarray, x: np.ndarray | None = None) -> tuple[float, float]:
    """Least-squares slope per step and R^2 of a line through ``y`` (read at steps ``x``).

    Readings at uneven steps (every step at first, then every k-th) are weighted by the steps
    each one stands for, as if every step had been read.
    """
    if x is None:
        x = np.arange(len(y), dtype=float)
    x = np.asarray(x, dtype=float)
    gaps = np.diff(x)
    w = np.append(gaps, np.median(gaps)) if len(gaps) else np.ones(1)
    slope, intercept = np.polyfit(x, y, 1, w=np.sqrt(w))  # weights the squared residuals by w
    resid = y - (slope * x + intercept)
    mean = float((w * y).sum() / w.sum())
    ss_tot = float((w * (y - mean) ** 2).sum())
    r2 = 1.0 - float((w * resid ** 2).sum()) / ss_tot if ss_tot > 0 else 0.0
    return float(slope), r2


def _last_epoch_rate(y: np.ndarray, at: np.ndarray, ep: np.ndarray) -> float | None:
    """Growth per step of ``y`` over the last epoch, from the previous epoch's last reading.

    The last epoch is the final run of readings with the last reading's epoch number (epoch
    numbers may restart, e.g. one count per trial). None unless an earlier reading exists and
    the last epoch has at least 2 readings (RSS may be read on every 16th step only). A cache
    that fills during the first epoch is flat by then; a leak still grows, whether step by
    step or in a jump at each epoch boundary (the previous reading carries the jump).
    """
    ep = np.nan_to_num(ep[at], nan=0.0)
    if not len(at):
        return None
    other = np.flatnonzero(ep != ep[-1])
    if not len(other) or len(at) - 1 - other[-1] < 2:
        return None
    start, end = at[other[-1]], at[-1]
    return float((y[end] - y[start]) / (end - start))



def growing_container(run) -> dict | None:
    """The user's container of tensors that grew fastest across the ``held`` looks, or None.

    Growing: longer and larger at the last look than at the first, and no smaller than at the
    look before in 80% of the looks (a container emptied every epoch does not grow).

    Returns ``{"name", "file", "line", "mb_per_step", "first", "last"}`` (``first``/``last``:
    the ``held`` entries of its first and last look); None when none grew.
    """
    by: dict[tuple, list] = {}
    for event in run.of("held"):
        for c in event.get("containers", []):
            key = (c.get("name"), c.get("file"), c.get("func"))
            by.setdefault(key, []).append((event["step"], c))
    best = None
    for (name, file, _), seen in by.items():
        (s0, first), (s1, last) = seen[0], seen[-1]
        rises = [b[1]["bytes"] >= a[1]["bytes"] for a, b in zip(seen, seen[1:])]
        if s1 <= s0 or last["bytes"] <= first["bytes"] or last["len"] <= first["len"] or \
                sum(rises) < 0.8 * len(rises):
            continue  # (a buffer cleared every epoch, a batch that varies in size)
        rate = (last["bytes"] - first["bytes"]) / (s1 - s0) / 2**20
        if best is None or rate > best["mb_per_step"]:
            best = {"name": name, "file": file, "line": last.get("line"), "mb_per_step": rate,
                    "first": first, "last": last}
    return best


def _pairs_no_row(read: dict) -> bool:
    """Whether one ``output_grads`` reading is a squared error over every (prediction, target).

    ``mean((p - y) ** 2)`` of ``(B, 1)`` against ``(B,)`` gives each prediction the gradient
    ``2 (p_i - mean(y)) / B``: affine in the prediction alone, slope ``2 / B`` (``1 / B`` for
    half the squared error; ``B`` times that when summed over one axis). A sigmoid-shaped
    gradient over a narrow range of outputs (a loss against one label) is affine too, but not
    with that slope.
    """
    if min(read["rank_corr"], read["corr"]) < UNPAIRED_CORR:
        return False
    rows = max(int(read.get("rows") or 1), 1)
    return any(abs(read["slope"] / scale - k) <= 0.05 * k
               for scale in (1.0 / rows, float(rows), 1.0) for k in (1.0, 2.0))


def blowup_step(sig) -> int | None:
    """The step where a run blew up, from its signals (None: it did not).

    The earlier of its first non-finite value and its loss reaching the divergence ratio of its
    start (``loss_blowup_step``).
    """
    steps = [int(sig[k]) for k in ("first_nonfinite_step", "loss_blowup_step")
             if isinstance((sig or {}).get(k), (int, float))]
    return min(steps) if steps else None


def compute(run: Run) -> dict:
    """Compute every signal of a run.

    Returns
    -------
    dict
        Keys are signal names (declared in :data:`SIGNALS`); rules in
        :mod:`model_debugger.classify` read them.
    """
    s: dict = {"steps": len(run.steps), "epochs": run.epochs}
    loss = run.series("loss")
    stage = last_stage(run)
    if stage:  # a second training stage (a fine-tune after a pre-training): its curve is the
        s["stage_start"] = stage  # run's symptom, not the first stage's fall before it
        loss = loss[stage:]
    fl = _finite(loss)
    targets = run.of("targets")
    k = _noise_window(targets[-1] if targets else None, len(run.steps), len(fl))
    if len(fl) < 2:  # no step's loss was read (a train_step reporting only its metrics):
        epochs = _total_loss_metric(run)  # the training loss of each epoch
        if epochs is not None and len(_finite(epochs)) >= 3:
            fl, k = _finite(epochs), 1  # (an epoch's mean: no noise window)
            s["loss_source"] = "epochs"
    s["loss_points"] = int(len(fl))
    first = float(np.median(fl[:max(3, k)])) if len(fl) else None  # the untrained model
    if k > 1:  # each reading is the loss of a few rows: judge the curve on means of k
        s["loss_window"] = k
        fl = _block_means(fl, k)
    if len(fl) >= 2:
        s["loss_initial"], s["loss_final"] = _head_tail(fl)
        s["loss_min"] = float(fl.min())
        s["loss_max"] = float(fl.max())
        s["loss_spike"] = float(fl[len(fl) // 10:].max())  # after a 10% warm-up
        s["loss_relative_drop"] = (s["loss_initial"] - s["loss_final"]) / max(
            abs(s["loss_initial"]), 1e-12)
        s["loss_first"] = first  # the untrained model (3 readings at least: noise)
        if len(fl) >= 20:
            mid, _ = _head_tail(fl[len(fl) // 2:])
            s["loss_tail_drop"] = (mid - s["loss_final"]) / max(abs(mid), 1e-12)
        if s["loss_first"] > 0:
            s["loss_peak_ratio"] = float(fl.max() / s["loss_first"])
            over = np.nonzero(fl[1:] >= DIVERGE_RATIO * s["loss_first"])[0]
            if over.size and s.get("loss_source") != "epochs":
                s["loss_blowup_step"] = int((over[0] + 1) * max(k, 1)) + int(stage or 0)
    if s.get("loss_first") is not None and \
            s["loss_min"] <= -max(UNBOUNDED_LOSS, UNBOUNDED_RATIO * abs(s["loss_first"])):
        s["loss_unbounded"] = s["loss_min"]
    kind = (targets[-1] if targets else {}).get("loss")
    if kind in NONNEGATIVE_LOSSES and s.get("loss_min", 0.0) < -1e-6:
        s["loss_kind"], s["loss_below_zero"] = kind, s["loss_min"]
    s["constant_predictor_loss"], s["majority_rate"] = constant_predictor(
        targets[-1] if targets else None)
    counts = (targets[-1] if targets else {}).get("counts")
    if counts and s["majority_rate"] is not None:
        s["class_count"] = len(counts)
    if targets and targets[-1].get("weighted"):
        s["loss_weighted"] = 1
    if s["constant_predictor_loss"] and "loss_final" in s:
        s["loss_floor_share"] = s["loss_final"] / s["constant_predictor_loss"]
    trained = run.of("trained")
    if trained and trained[-1].get("params"):
        s["untrained_share"] = 1.0 - trained[-1]["updated"] / trained[-1]["params"]
    uninformed = uninformed_loss(targets[-1] if targets else None)
    if uninformed:
        s["loss_uninformed"] = uninformed
        if isinstance(s.get("loss_first"), float) and uninformed > 0:
            s["loss_start_excess"] = s["loss_first"] / uninformed
    scaled = run.first("accumulation") is not None  # the step loss may be loss / k

    bad = run.first("nonfinite")
    bad_idx = [i for i, st in enumerate(run.steps) if isinstance(st.get("loss"), str)]
    if bad is not None:
        s["first_nonfinite_step"], s["nonfinite_what"] = bad["step"], bad["what"]
        s["nonfinite_module"] = bad.get("module")
        if bad.get("in_weights"):  # an update put non-finite values in the weights
            finite = [st["i"] for st in run.steps if st.get("i", -1) < bad["step"]
                      and isinstance(st.get("gn"), (int, float)) and math.isfinite(st["gn"])]
            if finite:  # the bad update came after this step's (norms every k-th step)
                s["last_finite_grad_step"] = finite[-1]
    elif len(bad_idx):
        s["first_nonfinite_step"], s["nonfinite_what"] = bad_idx[0], "loss"

    kept = run.first("graphs_kept") or {}
    steps_checked = kept.get("checked", 0)  # one loss per step: the steps looked back on
    if steps_checked >= 10:  # past steps' losses or predictions (and their graphs) still alive,
        # per step: a loop that keeps one of two forwards' outputs keeps one graph a step
        s["graphs_kept_share"] = min(1.0, max(kept.get("alive", 0),
                                              kept.get("outputs_alive", 0)) / steps_checked)
    traced = run.of("traces")
    if traced and isinstance(traced[-1].get("count"), int) and traced[-1].get("steps"):
        s["step_traces"] = traced[-1]["count"]  # a custom loop's compiled step traced again
        s["step_traced_share"] = min(1.0, traced[-1]["count"] / traced[-1]["steps"])
    values = run.of("target_values")
    s.update(output_range(run.first("loss_input"), targets[-1] if targets else None)
             or _head_range(run.of("head_targets"))
             or _custom_range(values[-1] if values else None, s.get("loss_final")))
    s.update(_head_floor(run))
    reads = [e for e in run.of("output_grads") if all(
        isinstance(e.get(k), float) for k in ("rank_corr", "corr", "slope"))]
    if len(reads) >= UNPAIRED_READS:  # a loss written by hand (the capture reads no other)
        s["loss_unpaired"] = float(all(_pairs_no_row(e) for e in reads))
    broadcast = run.first("loss_broadcast")
    if broadcast and isinstance(broadcast.get("factor"), (int, float)):
        s["loss_broadcast_factor"] = float(broadcast["factor"])
    elif targets and "input_min" in targets[-1]:  # an elementwise loss, shapes never broadcast
        s["loss_broadcast_factor"] = 1.0
    reset = run.first("grad_reset")
    if reset and reset.get("checked", 0) >= 5:  # steps that began with last step's gradients
        s["grad_not_reset_share"] = reset["not_reset"] / reset["checked"]
    gn = _finite(run.series("gn"))
    if len(gn) >= 10:
        head, _ = _head_tail(gn)
        s["grad_norm_initial"] = head
        s["grad_norm_max"] = float(gn.max())
        s["grad_norm_growth"] = float(gn.max() / max(head, 1e-12))
    ur = _finite(run.series("ur"))
    if len(ur) >= 3:  # measured every update_every steps
        s["update_ratio_median"] = float(np.median(ur))
        s["update_ratio_points"] = int(len(ur))
    names, norms = run.module_norms()
    if len(names) >= 3 and len(norms) >= 5:
        with warnings.catch_warnings():  # a module non-finite at every step: its median NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(np.where(np.isfinite(norms), norms, np.nan), axis=0)
        if np.isfinite(med[0]) and np.isfinite(med[-1]) and med[-1] > 0:
            s["first_layer"], s["last_layer"] = names[0], names[-1]
            s["first_to_last_grad_ratio"] = float(med[0] / med[-1])

    rss = run.series("rss")
    at = np.flatnonzero(np.isfinite(rss))  # PyTorch reads it on the steps norms are measured
    at = at[at >= len(rss) // 10]  # after the warm-up: the first 10% of the steps
    if len(rss) >= 20 and len(at) >= 8:
        body = rss[at]
        slope, r2 = _fit(body / 2**20, at)
        s["rss_start_mb"], s["rss_end_mb"] = float(body[0] / 2**20), float(body[-1] / 2**20)
        s["rss_growth_mb"] = float((body[-1] - body[0]) / 2**20)
        s["rss_slope_mb_per_step"], s["rss_growth_r2"] = slope, r2
        late = _last_epoch_rate(rss / 2**20, at, run.series("ep"))
        if late is not None:
            s["rss_last_epoch_mb_per_step"] = late
    cuda = run.series("cuda")
    cuda = cuda[np.isfinite(cuda)]
    if len(cuda) >= 20 and cuda.max() > 0:
        body = cuda[len(cuda) // 10:]
        slope, r2 = _fit(body / 2**20)
        s["cuda_growth_mb"] = float((body[-1] - body[0]) / 2**20)
        s["cuda_slope_mb_per_step"], s["cuda_growth_r2"] = slope, r2
    lrs = [(e["step"], e["lr"]) for e in run.of("lr") if isinstance(e.get("lr"), (int, float))]
    if lrs and s.get("steps"):
        peak = max(lr for _, lr in lrs)
        s["lr_peak"] = peak
        at = next(i for i, lr in lrs if lr == peak)  # a decay comes after the peak (a warm-up
        low = next((i for i, lr in lrs if i > at and peak > 0 and  # rising from ~0 is none)
                    lr < LR_COLLAPSE * peak), None)
        s["lr_collapsed_share"] = 0.0 if low is None else max(0.0, 1 - low / s["steps"])
    held = growing_container(run)
    if held is not None:
        s["held_name"], s["held_mb_per_step"] = held["name"], held["mb_per_step"]
        memory = max(s.get("rss_slope_mb_per_step", 0.0), s.get("cuda_slope_mb_per_step", 0.0))
        if memory > 0:
            s["held_share"] = held["mb_per_step"] / memory
    util = _finite(run.series("gpu_util"))
    if len(util) >= 3:
        s["gpu_util_median"] = float(np.median(util))
        s["gpu_util_samples"] = int(len(util))
    err = run.error
    if err is not None:
        s["error_kind"], s["error"] = err["kind"], f"{err['type']}: {err['message']}"[:300]

    dt, dw = run.series("dt"), run.series("dw")
    ok = np.isfinite(dt) & np.isfinite(dw) & (dt > 0)
    if ok.sum() >= 5:
        s["data_wait_fraction"] = float(dw[ok].sum() / dt[ok].sum())
        s["data_wait_ms"] = float(1000 * dw[ok].mean())
        s["data_wait_s"] = float(dw[ok].sum())
        s["step_ms"] = float(1000 * dt[ok].mean())
        bz = run.series("bz")
        co = np.nan_to_num(run.series("co"))  # collectives the code called (a multi-rank job)
        own = ok & np.isfinite(bz)
        own[: len(own) // 10] = False  # after the warm-up
        if own.sum() >= 10:  # the loop's own time: neither data, forward, backward, step
            rest = np.maximum(dt[own] - dw[own] - bz[own] - co[own], 0.0)  # nor collectives
            s["step_overhead_ms"] = float(1000 * np.median(rest))
            s["step_overhead_share"] = float(np.median(rest / dt[own]))
            s["step_overhead_s"] = float(rest.sum())

    train_ep = _per_epoch_train_loss(run)
    train_metric = run.metric_by_role("train", "loss")
    if train_metric is not None and len(train_metric[1]) >= len(train_ep):
        train_ep = train_metric[1]
    val = run.metric_by_role("val", "loss")
    if val is not None and len(_finite(val[1])) >= 3:
        v = _finite(val[1])
        best = int(np.argmin(v))
        s["val_loss_name"], s["val_points"] = val[0], len(v)
        s["val_loss_min"], s["val_loss_min_index"], s["val_loss_final"] = float(v[best]), best, \
            float(v[-1])
        s["val_loss_rise"] = float((v[-1] - v[best]) / max(abs(v[best]), 1e-12))
        stopped = run.of("early_stopped")  # the last fit's: restored to the best val loss?
        if stopped and stopped[-1].get("restored") and stopped[-1].get("monitor") == val[0] \
                and stopped[-1].get("direction") in (None, "min"):
            s["restored_best"] = 1.0
        t = train_ep[np.isfinite(train_ep)] if len(train_ep) else train_ep
        if len(t) >= len(v) >= 3:
            t = t[-len(v):] if len(t) != len(v) else t
            s["train_loss_at_val_min"], s["train_loss_final"] = float(t[best]), float(t[-1])
            s["gap_at_val_min"] = float(v[best] - t[best])
            s["gap_final"] = float(v[-1] - t[-1])
    for split in ("val", "train"):
        for kind in ("acc", "f1"):
            m = run.metric_by_role(split, kind)
            if m is None or not len(_finite(m[1])):
                continue
            values = _finite(m[1])
            scale = 100.0 if values.max() > 1.0 else 1.0
            values = values / scale
            name = m[0]
            if kind == "f1" and ranks_at_half(name):  # an AUC: chance at 0.5, read as Gini
                values, name = np.clip(2.0 * values - 1.0, 0.0, 1.0), f"2*{name}-1"
            s[f"{split}_{kind}_name"] = name
            s[f"{split}_{kind}_final"] = float(values[-1])
            s[f"{split}_{kind}_max"] = float(values.max())
            s[f"{split}_{kind}_gain"] = float(values[-1] - values[0])
            s[f"{split}_{kind}_points"] = len(values)
    _accuracy_gap(s, None if scaled else targets[-1] if targets else None)
    _error_baseline(s, run)
    _restored_wrong_way(s, run)
    if run.ranks:
        from .ranks import signals as rank_signals

        s.update(rank_signals(run))
    return s


_LOWER = {"loss", "error", "mae", "mse", "rmse", "mape", "perplexity", "nll"}
_HIGHER = {"acc", "accuracy", "auc", "precision", "recall", "f1", "r2", "iou", "dice"}


def natural_direction(name: str) -> str | None:
    """``"min"`` for a loss or an error, ``"max"`` for a score, None when the name says neither.

    Read from the name's words (``val_loss``, ``val_sparse_categorical_accuracy``): a name
    with words of both kinds or of neither (``rmse_skill_score``) says nothing.
    """
    import re

    words = set(re.split(r"[^a-z0-9]+", name.lower())) - {""}
    if words & {"score", "skill"}:
        return None
    low, high = bool(words & _LOWER), bool(words & _HIGHER)
    return "min" if low and not high else "max" if high and not low else None


def _restored_wrong_way(s: dict, run: Run) -> None:
    """``restored_wrong_way`` when the weights kept were the worst epoch's, not the best's.

    An ``EarlyStopping(restore_best_weights=True)`` whose mode runs against its monitored
    quantity (``monitor="val_loss", mode="max"``) keeps the weights of the epoch with the
    highest loss: the model the run ends with is not the one its curves show.
    """
    stopped = [e for e in run.of("early_stopped") if e.get("restores")]
    if not stopped:
        return
    e = stopped[-1]
    monitor, epoch = e.get("monitor") or "", e.get("best_epoch")
    natural = natural_direction(monitor)
    # the last fit's epochs only: its metrics come after the fit before it ended
    ends = [i for i, ev in enumerate(run.events) if ev.get("t") == "early_stopped"]
    start = ends[-2] if len(ends) >= 2 else -1
    points = [ev for ev in run.events[start + 1:ends[-1]]
              if ev.get("t") == "metric" and ev.get("name") == monitor]
    rank = {src: i for i, src in enumerate(METRIC_SOURCES)}
    best_source = min((rank.get(ev.get("source"), len(rank)) for ev in points), default=0)
    values = [as_float(ev["value"]) for ev in points  # (one source: a callback's, not both
              if rank.get(ev.get("source"), len(rank)) == best_source]  # it and stdout's)
    if natural is None or e.get("direction") in (None, natural) or not isinstance(epoch, int) \
            or not 0 <= epoch < len(values) or len(values) < 2:
        return
    finite = [v for v in values if np.isfinite(v)]
    best = min(finite) if natural == "min" else max(finite)
    kept = values[epoch]
    if not np.isfinite(kept) or abs(kept - best) < 0.05 * max(abs(best), 1e-12):
        return  # (the epoch kept is as good as the best: nothing lost)
    s["restored_wrong_way"] = 1.0
    s["restored_value"], s["restored_best_value"] = float(kept), float(best)
    s["restored_epoch"], s["restored_monitor"] = int(epoch), monitor


def _error_baseline(s: dict, run: Run) -> None:
    """A regression error metric against what a constant prediction scores on the targets.

    A reported R² is read directly (``1 - R²`` is the share of the targets' variance left
    unexplained: a constant prediction's is 1). Else only when the capture kept target values
    (a loss it does not know, so no ``constant_predictor_loss``): the metric is a known
    function (MAE: the median's mean absolute deviation; MSE: the variance; RMSE: its root),
    the loss is not.
    ``{split}_error_name``, ``{split}_error_final``, ``{split}_error_baseline``, and
    ``error_share`` (the validation's when there is one).
    """
    for split in ("val", "train"):  # R² is its own baseline: 1 - R² = MSE / the variance
        m = run.metric_by_role(split, "r2")
        if m is not None and len(_finite(m[1])):
            s[f"{split}_error_name"] = m[0]
            s[f"{split}_error_final"] = float(_finite(m[1])[-1])
            s.setdefault("error_share", 1.0 - s[f"{split}_error_final"])
    kept = run.of("target_values")
    if not kept or "error_share" in s:
        return  # (an R² read: the share and the split it cites stay one reading's)
    from .records import as_float

    kept = kept[-1]
    var, mad = as_float(kept.get("var")), as_float(kept.get("mad"))
    base = {"mae": mad, "mse": var, "rmse": math.sqrt(var) if var >= 0 else math.nan}
    for split in ("train", "val"):
        for kind in ("mae", "rmse", "mse"):
            m = run.metric_by_role(split, kind)
            if m is None or not len(_finite(m[1])) or not base[kind] > 0:
                continue
            s[f"{split}_error_name"], s[f"{split}_error_final"] = m[0], float(_finite(m[1])[-1])
            s[f"{split}_error_baseline"] = float(base[kind])
            share = s[f"{split}_error_final"] / float(base[kind])
            s["error_share"] = share if kind == "mse" else share ** 2  # on the MSE's scale
            break


def _accuracy_gap(s: dict, targets: dict | None) -> None:
    """Training accuracy (or the lowest the final loss allows) against the validation accuracy.

    Under a cross-entropy loss every misclassified example costs at least ``ln 2`` (its true
    class has probability <= 1/2), so a mean loss ``L`` bounds the training error by
    ``L / ln 2``: a training loss near zero means a training accuracy near one, printed or not.
    """
    if "val_acc_final" not in s:
        return
    train = s.get("train_acc_final")
    loss = (targets or {}).get("loss")
    if train is None and loss in _CLASSIFICATION_LOSSES and s.get("loss_final", -1.0) >= 0:
        # (a negative "cross-entropy" is no cross-entropy: nll_loss fed probabilities, not
        # log-probabilities; it bounds nothing)
        train = max(0.0, 1.0 - s["loss_final"] / math.log(2))
        s["train_acc_bound"] = train
    if train is not None:
        s["acc_gap"] = float(train - s["val_acc_final"])


# losses that are never negative on valid inputs: a reading below 0 is a loss fed the wrong
# thing (nll_loss given probabilities or raw scores instead of log-probabilities)
NONNEGATIVE_LOSSES = ("cross_entropy", "nll_loss", "binary_cross_entropy",
                      "binary_cross_entropy_with_logits", "mse_loss", "l1_loss",
                      "smooth_l1_loss", "huber_loss", "kl_div", "poisson_nll_loss",
                      "sparse_categorical_crossentropy", "categorical_crossentropy",
                      "binary_crossentropy", "mean_squared_error", "mean_absolute_error")

_CLASSIFICATION_LOSSES = ("cross_entropy", "nll_loss", "binary_cross_entropy",
                          "binary_cross_entropy_with_logits")
