"""The probe framework: a context of what the run captured, a base class, and a registry.

A probe turns a category into a root cause. It reads the captured run (record, signals) and, when
the run was captured in-process, live objects (the model, its initial weights, sample batches).
It returns Findings; a finding is ``confirmed`` only when a measurement supports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..records import Classification, Finding, Run
from ..trainers import Trainer
from ..trainers.base import OverBudget
from .report import SHARED, ProbeReport, ProbeResult

PROBES: dict[str, type[Probe]] = {}

# the suggestion of a finding no probe or lint rule words more precisely
GENERIC_SUGGESTION = ("Change the code at the finding's location so the measured cause no "
                      "longer holds; keep it to one change.")


@dataclass
class ProbeContext:
    """Everything a probe may use. Live objects are None when only a record exists.

    Attributes
    ----------
    run : Run
        The captured record.
    signals : dict
        ``signals.compute(run)``.
    classification : Classification
        What Classify decided.
    framework : str
        ``"torch"``, ``"keras"`` or ``"none"`` (a log only).
    source_files : dict
        ``{path: source text}`` of the user's training code (script or cells), for lint.
    model : object
        The trained model (live), if any.
    initial_state : dict
        The model's state (parameter/buffer copies) captured before its first optimizer step.
    optimizer : dict
        ``{"cls": type, "name": str, "hyper": dict, "location": {...}}``.
    loss : dict
        ``{"name": "cross_entropy", "fn": callable(output, target) -> scalar, "location": ...}``.
    train_batches, val_batches : list of tuple
        Sample ``(inputs, target)`` pairs seen by the loss (``inputs`` are the model's positional
        arguments as a tuple), training (grad enabled) vs validation (no_grad).
    train_xy, val_xy : tuple of numpy arrays or None
        The same samples as arrays: ``X`` of shape (n, features) (inputs flattened) and ``y`` of
        shape (n,) or (n, outputs); for data probes that need no framework.
    feature_names : list of str or None
        Column names when known (else ``x0, x1, ...``).
    trainer : Trainer or None
        :class:`~model_debugger.trainers.Trainer` for probes that train a copy of the model.
    namespace : dict or None
        The globals of the user code that holds the model (retained tensors are looked for
        there).
    train_loader : object or None
        What the training loop iterated (a DataLoader, a Keras dataset), for the throughput
        probe.
    train_dataset : object or None
        The PyTorch training loader's dataset (kept when the loader itself is gone).
    lint : list or None
        The static lint hits of ``source_files``, computed once (see ``probes._lint``).
    deadline : float
        ``time.monotonic()`` by which the probes should be done.
    """

    run: Run
    signals: dict
    classification: Classification
    framework: str = "none"
    source_files: dict[str, str] = field(default_factory=dict)
    model: Any = None
    initial_state: dict | None = None
    optimizer: dict | None = None
    loss: dict | None = None
    train_batches: list = field(default_factory=list)
    val_batches: list = field(default_factory=list)
    train_xy: tuple | None = None
    val_xy: tuple | None = None
    feature_names: list[str] | None = None
    trainer: Trainer | None = None
    namespace: dict | None = None
    train_loader: Any = None
    train_dataset: Any = None
    lint: list | None = field(default=None, repr=False)
    deadline: float = float("inf")

    @property
    def live(self) -> bool:
        """True when live objects (model, batches) are available, not just a record."""
        return self.model is not None

    def time_left(self) -> float:
        """Seconds left before :attr:`deadline` (negative once it has passed)."""
        return self.deadline - time.monotonic()

    def ref(self, kind: str) -> dict | None:
        """A code reference from the record: ``backward``, ``step``, ``optimizer``, ``model``, ..."""
        return self.run.refs().get(kind)


class Probe:
    """Base class: subclasses set ``id``, ``categories`` and ``fix`` and implement :meth:`run`.

    A probe owns everything about its check: when it applies, what it measures and the fix it
    suggests (:meth:`suggestion`, by default the ``fix`` text), so adding a probe is one new
    module that registers its class.

    Attributes
    ----------
    id : str
        The probe id (public vocabulary).
    categories : tuple of str
        The categories it helps isolate (``"*"`` for any).
    needs_live : bool
        True when the probe needs live objects (skipped on a log-only session).
    frameworks : tuple of str
        Frameworks it supports.
    fix : str
        The suggested fix for its findings (see :meth:`suggestion`).
    data_role : {"inputs", "targets"} or None
        Which half of the training data its ``data`` findings are about: their location is
        traced back to where that half was made (:func:`~model_debugger.provenance.data_origin`).
    traces_origin : bool
        Whether its ``data`` findings are moved to where the data was made (False: its location
        is already the code at fault, e.g. a slow collate function).
    about_scale : bool
        Whether its ``data`` findings are about the data's scale: a scaling call whose result
        was thrown away before the use (``scaler.fit_transform(X)`` as a statement) is then
        where the unscaled data was made (:func:`~model_debugger.provenance.discarded_scaling`);
        a scaled copy made under another name and not used, the use line
        (:func:`~model_debugger.provenance.scaled_copy_unused`).
    suggested_by : tuple of str
        Signals that point at this probe's cause: when the classification cites one, the probe
        runs before the others (the most likely cause is tested while the budget lasts).
    cost : int
        About how many fresh copies of the model it trains (0: it reads the record, the code or
        the live objects). Within the suggested probes and within the rest, the cheaper run
        first, so one probe that trains many copies of a slow model cannot spend the budget
        before the quick ones have looked (:func:`run_probes`).
    lever : bool
        Whether its cause is a setting that can make up for many other faults (the learning
        rate: a rate raised far enough makes almost any training loss fall, shuffled labels
        memorised included). Among confirmed findings it ranks after those that name a specific
        mechanism (:func:`rank`); a probe whose findings only sometimes blame a lever marks them
        with ``evidence["lever"]`` (:func:`is_lever`).
    reveals : str or None
        For a probe that also runs on runs classified ``healthy`` (``"healthy"`` among its
        categories): the category one of its confirmed findings shows, although the recorded
        signals looked healthy (a leak inflates the very score that looked good). Isolate then
        re-classifies the run (:func:`~model_debugger.phases.isolate.isolate`).
    symptom : str or None
        The category its cause shows first, for a cause with one main symptom and side effects
        (a ``tf.function`` traced every step costs time first, and keeps a graph per trace).
        When the run measured that category too, but another rule came first, a confirmed,
        decisive finding makes it the primary category (the category follows the confirmed
        cause, not the rule table's order; :func:`~model_debugger.phases.isolate.isolate`).
    """

    id: str = ""
    categories: tuple[str, ...] = ()
    needs_live: bool = False
    frameworks: tuple[str, ...] = ("torch", "keras", "none")
    fix: str = GENERIC_SUGGESTION
    data_role: str | None = None
    suggested_by: tuple[str, ...] = ()
    traces_origin: bool = True
    about_scale: bool = False
    reveals: str | None = None
    symptom: str | None = None
    lever: bool = False
    cost: int = 0

    def applies(self, ctx: ProbeContext) -> bool:
        """Whether the probe can run on this context."""
        if ctx.framework not in self.frameworks:
            return False
        return ctx.live or not self.needs_live

    def pointed_at(self, ctx: ProbeContext, measured: dict) -> bool:
        """Whether what the probes so far measured points at this probe's cause.

        ``measured`` holds the shared quantities (:data:`~.report.SHARED`) of the probes that
        ran. A probe pointed at runs next, before the cheaper ones still waiting: the budget
        goes to the likely cause first (:func:`run_probes`).
        """
        return False

    def run(self, ctx: ProbeContext) -> list[Finding] | ProbeResult:  # pragma: no cover
        """Measure; return findings, or a :class:`ProbeResult` with a shared quantity too."""
        raise NotImplementedError

    def intervention(self, finding: Finding):
        """The change that would undo this finding's cause in a re-run, or None.

        Isolate re-runs the artifact with it (:mod:`model_debugger.phases.confirm`): the finding
        is confirmed by experiment when the category's defining signal moves beyond the seed
        noise. Returns an :class:`~model_debugger.artifacts.base.Intervention` or None (a cause
        no re-run can undo, or none written yet).
        """
        return None

    def reconsider(self, finding: Finding, others: list[Finding]) -> Finding:
        """One of this probe's findings, once every probe ran (``others``: all their findings).

        A measurement by another probe may undo what this one concluded (a fresh copy of the
        model learning at a lower rate shows the model as built passes the gradient). By
        default the finding is unchanged.
        """
        return finding

    def acted_at(self, finding: Finding, sites: list[dict]) -> Finding:
        """The finding once its intervention removed the symptom, acting at ``sites``.

        An intervention that acts where something happens (an operation whose gradient it
        guards) reports where in the re-run's record (``intervened`` events:
        ``{"file", "line", ...}``); a probe whose hypothesis could not name the line overrides
        this to locate the confirmed finding there. By default the finding is unchanged.
        """
        return finding

    def suggestion(self, finding: Finding) -> str:
        """The suggested fix for one of this probe's findings (text shown with the plan).

        Parameters
        ----------
        finding : Finding
            A finding this probe returned (its evidence may shape the text: a measured rate,
            the layers concerned).

        Returns
        -------
        str
            Never empty; the class's ``fix`` unless the probe words it from the evidence.
        """
        return self.fix or GENERIC_SUGGESTION

    def finding(self, root_cause: str, confirmed: bool, explanation: str,
                location: dict | None = None, **evidence) -> Finding:
        """Build a Finding for this probe.

        A ``data`` finding seen where the data was used (the loss call, ``fit``) is located
        where that data was made (:func:`~model_debugger.provenance.data_origin`).
        """
        if root_cause == "data" and self.traces_origin:
            from ..provenance import data_origin

            location = data_origin(location, self.data_role)
            if self.about_scale:
                from ..provenance import (
                    discarded_scaling,
                    scaled_copy_unused,
                    scaling_pipeline,
                )

                location = discarded_scaling(location) or scaled_copy_unused(location) or \
                    scaling_pipeline(location) or location
        return Finding(self.id, root_cause, confirmed, explanation, location,
                       {k: _jsonable(v) for k, v in evidence.items()})


def _jsonable(v):
    if isinstance(v, float):
        return v if v == v and abs(v) != float("inf") else str(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if hasattr(v, "item") and callable(v.item):
        try:
            return _jsonable(v.item())
        except (ValueError, RuntimeError):
            return str(v)
    return v


SETTING_KEYWORDS = {"lr": ("lr", "learning_rate"), "weight_decay": ("weight_decay",),
                    "momentum": ("momentum",), "beta1": ("betas", "beta_1"),
                    "clip": ("max_norm", "clipnorm", "global_clipnorm", "clip_value"),
                    "batch_size": ("batch_size",)}


def setting_location(location: dict | None, setting: str) -> dict | None:
    """Where the value of ``setting`` passed by the call at ``location`` was set.

    A rate or a batch size read from a config dict, ``argparse`` or a variable is located at
    the line that set it (:func:`~model_debugger.provenance.setting_origin`); a literal keeps
    its own line (the call's, or in a call written over several lines the keyword's).
    """
    from ..provenance import setting_origin

    for keyword in SETTING_KEYWORDS.get(setting, (setting,)):
        found = setting_origin(location, keyword)
        if found is not location:
            return found
    return location


BLOW_UP_SIGNALS = ("loss_final", "loss_spike", "loss_max", "grad_norm_growth", "loss_uninformed",
                   "first_nonfinite_step")


def blown_up(ctx: ProbeContext) -> list[str]:
    """The signals by which Classify saw this run blow up (empty: it did not).

    Only a ``gradient_instability`` decided by a growing loss or gradient (not by vanishing
    gradients alone). What shrinks the updates (vanishing gradients, a weight decay, a clip)
    can explain a loss that does not move, never one that grew: it is at most a consequence.
    When vanishing gradients were cited with the loss (the two rules fired together), the run
    blew up only if the loss did grow (by the divergence ratio) or became non-finite: a flat
    loss cites ``loss_final`` too.
    """
    from ..thresholds import DIVERGE_RATIO

    cls = ctx.classification
    signals = [e.signal for e in getattr(cls, "evidence", ())]
    if getattr(cls, "primary", None) != "gradient_instability":
        return []
    if "first_to_last_grad_ratio" in signals:
        sig = ctx.signals
        grew = "first_nonfinite_step" in sig or \
            sig.get("loss_relative_drop", 0.0) <= 1.0 - DIVERGE_RATIO
        if not grew:
            return []
    return [s for s in signals if s in BLOW_UP_SIGNALS]


def register(cls: type[Probe]) -> type[Probe]:
    """Class decorator adding a probe to the registry (ids never change once shipped)."""
    if not cls.id or cls.id in PROBES:
        raise ValueError(f"probe id {cls.id!r} is empty or already registered")
    PROBES[cls.id] = cls
    return cls


def probes_for(category: str) -> list[str]:
    """Probe ids worth running for a category, in registry order."""
    return [pid for pid, cls in PROBES.items()
            if category in cls.categories or "*" in cls.categories]


def is_lever(finding: Finding) -> bool:
    """Whether a finding blames a lever: its probe's :attr:`Probe.lever`, or ``evidence["lever"]``.

    A probe whose findings only sometimes blame the learning rate (``overfit_small_batch``: "another
    rate fits the samples") marks those in their evidence.
    """
    marked = finding.evidence.get("lever")
    if isinstance(marked, bool):
        return marked
    return bool(getattr(PROBES.get(finding.check), "lever", False))


def rank(findings: list[Finding], categories: list[str] = ()) -> list[Finding]:
    """``findings`` ranked: confirmed first, then the primary category, then causes undone.

    Findings for the primary category (the first of ``categories``) come before secondaries.
    Among those, a finding whose suspected cause was undone in an experiment that then removed
    the problem (``evidence["undone"]``: a copy with the setting undone learned clearly better,
    or a re-run with the intervention moved the defining signal), or that a measurement settles
    on its own (``evidence["decisive"]``: inputs identical in every row), comes before findings
    that only observed something, whatever their strength (``evidence["strength"]``, 0..1), which
    orders the rest: undoing a cause is the strongest evidence that it is one. Within each of
    those groups a lever (:func:`is_lever`: the learning rate, which moves the loss whatever
    else is wrong) comes after the findings that name a specific mechanism, whether or not
    undoing it was tried: a re-run at another rate "cures" most faults, shuffled labels
    memorised included, so it cannot outrank a specific cause that was measured, many of which
    (an optimizer rebuilt every step, a vanishing-gradient stack) have no single-change re-run.
    """
    def key(f: Finding):
        cat = f.evidence.get("category")
        pos = categories.index(cat) if cat in categories else len(categories)
        decisive = f.evidence.get("undone") is True or f.evidence.get("decisive") is True
        return (not f.confirmed, pos, f.confirmed and is_lever(f), not decisive,
                -float(f.evidence.get("strength", 0.5)))

    return sorted(findings, key=key)


def run_probes(ctx: ProbeContext, ids: list[str] | None = None,
               progress: Callable[[str, int, int], None] | None = None) -> ProbeReport:
    """Run probes (default: those for the primary and secondary categories).

    By default the probes a cited signal suggests (``Probe.suggested_by``) run first, then the
    rest; within each group the cheaper first (``Probe.cost``), then in registry order; while
    the budget lasts. Once a probe has measured a shared quantity, the probes it points at
    (``Probe.pointed_at``) move to the front of those still waiting. Explicit ``ids`` run in
    the order given.

    A probe that raises yields an unconfirmed finding naming the error; it never stops the others.

    Returns
    -------
    ProbeReport
        The ranked findings, seconds per probe that ran, and the shared quantities the probes
        measured (the last probe to measure one wins).
    """
    if ids is None:
        cats = [ctx.classification.primary, *ctx.classification.secondary]
        ids = []
        for cat in cats:
            ids += [p for p in probes_for(cat) if p not in ids]
        cited = {e.signal for e in ctx.classification.evidence}
        ids.sort(key=lambda p: (not cited & set(PROBES[p].suggested_by), PROBES[p].cost))
        reorder = True
    else:
        ids, reorder = list(ids), False
    findings: list[Finding] = []
    timings: dict[str, float] = {}
    measured: dict = {}
    order = [ctx.classification.primary, *ctx.classification.secondary]
    for n in range(len(ids)):
        pid = ids[n]
        probe = PROBES[pid]()
        new: dict = {}
        if not probe.applies(ctx):
            continue
        if ctx.time_left() <= 0:
            break
        if progress:
            progress(pid, n, len(ids))
        t0 = time.perf_counter()
        if ctx.trainer is not None:  # the budget is a hard limit on every copy's training
            ctx.trainer.deadline = ctx.deadline
        try:
            with np.errstate(all="ignore"):  # a diverged model's inf/nan arithmetic is data
                result = ProbeResult.of(probe.run(ctx))
            cat = next((c for c in order if c in probe.categories), order[0])
            if cat == "healthy" and probe.reveals:  # what the finding would show the run to be
                cat = probe.reveals
            findings += [Finding(f.check, f.root_cause, f.confirmed, f.explanation, f.location,
                                 {**f.evidence, "category": cat}) for f in result.findings]
            new = {name: getattr(result, name) for name in SHARED
                   if getattr(result, name) is not None}
            measured.update(new)
        except OverBudget:  # stopped at the budget's end: no verdict, and no probe after it
            timings[pid] = round(time.perf_counter() - t0, 3)
            break
        except Exception as exc:  # noqa: BLE001 - one broken probe must not hide the rest
            findings.append(Finding(pid, "training_loop", False,
                                    f"probe {pid} could not run: {type(exc).__name__}: {exc}",
                                    None, {"strength": 0.0, "probe_error": True}))
        finally:
            if ctx.trainer is not None:
                ctx.trainer.deadline = float("inf")
        timings[pid] = round(time.perf_counter() - t0, 3)
        if new and reorder:  # the probes this measurement points at go next
            ids[n + 1:] = sorted(ids[n + 1:], key=lambda p: not _points(PROBES[p](), ctx, measured))
    findings = [_reconsidered(f, findings) for f in findings]
    return ProbeReport(findings=tuple(rank(findings, order)), probe_seconds=timings, **measured)


def _reconsidered(finding: Finding, findings: list[Finding]) -> Finding:
    """``Probe.reconsider``, the finding unchanged when it raises (a hint never loses one)."""
    try:
        probe = PROBES.get(finding.check)
        return probe().reconsider(finding, findings) if probe is not None else finding
    except Exception:  # noqa: BLE001 - a broken second look keeps the first
        return finding


def _points(probe: Probe, ctx: ProbeContext, measured: dict) -> bool:
    """``probe.pointed_at``, False when it raises (a broken hint moves nothing)."""
    try:
        return bool(probe.pointed_at(ctx, measured))
    except Exception:  # noqa: BLE001 - the order is a hint; the probe still runs in its turn
        return False
