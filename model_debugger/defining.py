"""The defining signals: what judges each category before and after a fix, declared once.

A :class:`DefiningSignal` names one signal (declared in :data:`model_debugger.signals.SIGNALS`
or :data:`model_debugger.signals.OUTCOME_SIGNALS`), the direction that is good, the smallest
change that counts, whether it is compared in log10, and the evidence a classification cites for
it. :data:`CATEGORIES` gives each category its candidate signals, in order of preference, and the
words of the target a fix should reach. Verify compares the chosen signal across seeds; the fix
plan states :func:`expected_effect`. Everything else (:data:`DEFINING`, :data:`MIN_EFFECT`,
:data:`LOG_SIGNALS`) is derived from these two tables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .thresholds import DATA_WAIT_FRACTION, PLATEAU_DROP, START_RATIO, VAL_RISE


@dataclass(frozen=True)
class DefiningSignal:
    """One signal that judges a category.

    Attributes
    ----------
    name : str
        The signal's name.
    good : int
        ``+1`` when higher is better, ``-1`` when lower is better.
    min_effect : float
        The smallest change that counts as an effect (for a log-scale signal, in decades).
    log_scale : bool
        Compared as ``log10`` of the value (ratios spanning orders of magnitude).
    cited_as : tuple of str
        The evidence names a classification cites that this signal stands for (empty: its own
        name only), e.g. a NaN is cited as ``first_nonfinite_step`` and judged by
        ``finite_fraction``.
    shown_when : callable or None
        Without cited evidence, the signal is chosen only when ``shown_when(signals)`` holds
        (``finite_fraction`` only judges a run that went non-finite); None: always.
    """

    name: str
    good: int
    min_effect: float = 0.0
    log_scale: bool = False
    cited_as: tuple[str, ...] = ()
    shown_when: Callable[[dict], bool] | None = None

    @property
    def direction(self) -> str:
        """``"higher"`` or ``"lower"``: which way is better."""
        return "higher" if self.good > 0 else "lower"

    def stands_for(self, cited) -> bool:
        """Whether any of the ``cited`` evidence names is judged by this signal."""
        return bool(set(self.cited_as or (self.name,)) & set(cited))


@dataclass(frozen=True)
class Target:
    """How a category is judged: its candidate signals and the target, in words.

    Attributes
    ----------
    signals : tuple of DefiningSignal
        Candidates in order of preference.
    expected : str
        What a fix should do, with ``{}`` for the values the classification cited.
    """

    signals: tuple[DefiningSignal, ...]
    expected: str


_DROP = DefiningSignal("loss_relative_drop", +1, 0.02, cited_as=(
    "loss_relative_drop", "loss_final", "loss_initial", "loss_spike", "constant_predictor_loss"))

# every defining signal, by name
SIGNALS: dict[str, DefiningSignal] = {s.name: s for s in (
    _DROP,
    DefiningSignal("val_loss_rise", -1, 0.02),
    DefiningSignal("gap_final", -1, 0.02),
    DefiningSignal("finite_fraction", +1, 0.25, cited_as=("first_nonfinite_step",),
                   shown_when=lambda sig: "first_nonfinite_step" in sig),
    # a loss the updates drove far above its start (classify.exploding's early blow-up, a spike)
    DefiningSignal("loss_peak_ratio", -1, 0.3, log_scale=True, cited_as=("loss_max", "loss_spike"),
                   shown_when=lambda sig: sig.get("loss_peak_ratio", 0) >= 10),
    # an untrained model far worse than knowing nothing (classify.exploding: inputs or outputs
    # on a huge scale make the first errors, and gradients, huge)
    DefiningSignal("loss_start_excess", -1, 0.3, log_scale=True,
                   cited_as=("loss_first", "loss_uninformed"),
                   shown_when=lambda sig: sig.get("loss_start_excess", 0) >= START_RATIO),
    DefiningSignal("grad_norm_growth", -1, 0.5, log_scale=True),
    DefiningSignal("grad_not_reset_share", -1, 0.2),
    DefiningSignal("first_to_last_grad_ratio", +1, 0.5, log_scale=True),
    DefiningSignal("completed", +1, 0.5, cited_as=("error",),
                   shown_when=lambda sig: sig.get("error_kind") == "oom"),
    DefiningSignal("graphs_kept_share", -1, 0.2),
    DefiningSignal("cuda_growth_mb", -1, 20.0),
    DefiningSignal("rss_growth_mb", -1, 20.0),
    DefiningSignal("data_wait_fraction", -1, 0.05),
    DefiningSignal("step_overhead_share", -1, 0.05),
    DefiningSignal("gpu_util_median", +1, 10.0),
    DefiningSignal("step_traced_share", -1, 0.2,
                   shown_when=lambda sig: sig.get("step_traced_share", 0.0) >= 0.25),
    DefiningSignal("rank_hang", -1, 0.5, cited_as=("rank_hang_missing", "rank_hang_waiting"),
                   shown_when=lambda sig: bool(sig.get("rank_hang"))),
    DefiningSignal("rank_straggler_share", -1, 0.1, cited_as=(
        "rank_straggler", "rank_straggler_ms", "rank_straggler_share"),
        shown_when=lambda sig: sig.get("rank_straggler_share", 0.0) >= 0.25),
    DefiningSignal("rank_desync", -1, 1e-5, cited_as=("rank_desync", "rank_desync_step"),
                   shown_when=lambda sig: sig.get("rank_desync", 0.0) > 1e-5),
    DefiningSignal("rank_updates_apart", -1, 0.05, cited_as=("rank_updates_apart",
                                                              "rank_updates"),
                   shown_when=lambda sig: sig.get("rank_updates_apart", 0.0) >= 0.1),
    DefiningSignal("loss_broadcast_factor", -1, 0.5, log_scale=True,
                   shown_when=lambda sig: sig.get("loss_broadcast_factor", 1.0) >= 2),
    DefiningSignal("loss_unpaired", -1, 0.5,
                   shown_when=lambda sig: sig.get("loss_unpaired", 0.0) >= 1.0),
    DefiningSignal("output_range_unreachable", -1, 0.05,
                   shown_when=lambda sig: sig.get("output_range_unreachable", 0.0) >= 0.05),
    DefiningSignal("error_share", -1, 0.05, cited_as=("val_error_final", "train_error_final"),
                   shown_when=lambda sig: "error_share" in sig),
    DefiningSignal("val_f1_final", +1, 0.02),
    DefiningSignal("train_f1_final", +1, 0.02),
    DefiningSignal("val_acc_final", +1, 0.01),
    DefiningSignal("train_acc_final", +1, 0.01),
)}


def _of(*names: str) -> tuple[DefiningSignal, ...]:
    return tuple(SIGNALS[n] for n in names)


# category -> its candidate signals and the target a fix should reach
CATEGORIES: dict[str, Target] = {
    "loss_not_decreasing": Target(
        _of("loss_relative_drop"),
        f"the loss should fall: loss_relative_drop above {PLATEAU_DROP:g} (now {{}})"),
    "overfitting": Target(
        _of("val_loss_rise", "gap_final"),
        f"the validation loss should stop rising: val_loss_rise below {VAL_RISE:.2f} (now {{}})"),
    "gradient_instability": Target(
        _of("finite_fraction", "loss_peak_ratio", "loss_start_excess", "grad_not_reset_share",
            "grad_norm_growth", "first_to_last_grad_ratio", "loss_relative_drop"),
        "no non-finite loss or gradient, and no exploding or vanishing gradient norms (now {})"),
    "memory_issue": Target(
        _of("completed", "graphs_kept_share", "cuda_growth_mb", "rss_growth_mb"),
        "the run completes without OOM, no step's graph outlives it and memory stays flat "
        "(now {})"),
    "performance_issue": Target(
        _of("data_wait_fraction", "step_overhead_share", "gpu_util_median", "rank_hang",
            "rank_straggler_share", "step_traced_share"),
        f"data wait should no longer dominate (data_wait_fraction below {DATA_WAIT_FRACTION:g}), "
        "nor the loop's own work each step, the GPU, if any, should be kept busy, no rank "
        "should hang or straggle, and a compiled step should not be traced again (now {})"),
    "convergence_to_wrong_solution": Target(
        _of("rank_updates_apart", "rank_desync", "loss_broadcast_factor", "loss_unpaired",
            "output_range_unreachable", "error_share", "val_f1_final", "train_f1_final",
            "val_acc_final", "train_acc_final"),
        "the tracked metric should rise above the trivial level, or a regression error fall "
        "below a constant prediction's (now {})"),
}

UNKNOWN_TARGET = "the defining signal should move out of the problem range"

# derived views (the shapes Verify has used): category -> ((signal, +1/-1), ...), and per signal
DEFINING: dict[str, tuple[tuple[str, int], ...]] = {
    cat: tuple((s.name, s.good) for s in t.signals) for cat, t in CATEGORIES.items()}
MIN_EFFECT: dict[str, float] = {n: s.min_effect for n, s in SIGNALS.items()}
LOG_SIGNALS: tuple[str, ...] = tuple(n for n, s in SIGNALS.items() if s.log_scale)


def defining_signal(category: str, signals: dict,
                    cited: list[str] | None = None) -> tuple[str, int] | None:
    """The signal (and its good direction) that judges ``category``.

    Parameters
    ----------
    category : str
    signals : dict
        Signals of a run with the problem (see :func:`model_debugger.phases.verify.measure`).
    cited : list of str, optional
        The signals the classification cited: the compared signal is the first candidate that
        stands for one of them (a NaN is judged by ``finite_fraction``, a vanishing gradient by
        ``first_to_last_grad_ratio``); without them, the first candidate the run has.

    Returns
    -------
    tuple or None
        ``(name, +1 | -1)``, or None when the run has none of the category's signals.
    """
    target = CATEGORIES.get(category)
    candidates = [s for s in (target.signals if target else ()) if s.name in signals]
    if cited:
        for s in candidates:
            if s.stands_for(cited):
                return s.name, s.good
    shown = [s for s in candidates if s.shown_when is None or s.shown_when(signals)]
    chosen = (shown or candidates or [None])[0]
    return None if chosen is None else (chosen.name, chosen.good)


def expected_effect(classification: dict | None) -> str:
    """What the fix should do to the signal that defined the category, in words.

    Parameters
    ----------
    classification : dict or None
        A classification as JSON (``primary`` and ``evidence``).
    """
    if not classification:
        return UNKNOWN_TARGET
    target = CATEGORIES.get(classification["primary"])
    cited = {e["signal"]: e["value"] for e in classification.get("evidence", [])}
    now = ", ".join(f"{k}={v}" for k, v in list(cited.items())[:3]) or "unknown"
    words = target.expected if target else UNKNOWN_TARGET + " (now {})"
    return words.format(now)
