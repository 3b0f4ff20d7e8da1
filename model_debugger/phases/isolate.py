"""Isolate: probes turn the recorded category into a root cause, written once.

The probes run where the live objects are: in the script's child right after its run, or in the
kernel on a cell's kept objects (:func:`probe_run` is the one function both call). Isolate always
probes under the classification the session recorded (never a re-classification of whichever run
it probes), and records the findings; probes asked for by id join the current round's findings
instead of replacing them.
"""

from __future__ import annotations

from .._validate import check_budget, check_probe_ids
from ..artifacts.base import Captured, ProbeRequest
from ..records import Finding, Run
from ..session import DebugSession
from .versions import current_version


def probe_run(run: Run, keeper, sources: dict, request: ProbeRequest):
    """Run the probes of ``request`` on one captured run.

    The probes use the live objects of ``keeper``, or the record alone when it is None.

    Returns
    -------
    ProbeReport
        Ranked findings, probe timings and the measurements probes share (seed noise, the
        learning-rate sweep).
    """
    from ..probing import build_context, probe

    ctx = build_context(run, keeper, sources, request.budget,
                        classification=request.classification)
    return probe(ctx, list(request.ids) if request.ids is not None else None)


def isolate(session: DebugSession, artifact, ids: list[str] | None = None,
            budget: float = 30.0, stdout=None, progress=None, probed: Captured | None = None,
            seed: int | None = None, intervene_seconds: float | None = 0.0) -> list[Finding]:
    """Probe the current code under the recorded classification; record the findings.

    Parameters
    ----------
    session : DebugSession
        With a classification (the Isolate gate).
    artifact : Artifact
        The session's artifact.
    ids : list of str, optional
        Probes to run by id: their findings are added to the current ones (same ids
        replaced). None runs the probes of the recorded categories: a new round.
    budget : float
        Seconds for all probes.
    probed : Captured, optional
        A run already probed where its objects lived (Reproduce's first run, when it showed
        the recorded classification): its findings are used as they are.
    seed : int, optional
        Seed of a re-run (default: the session's seed).
    intervene_seconds : float or None
        When > 0, each finding that names an intervention is tested by re-running the artifact
        with it and without it (:func:`model_debugger.phases.confirm.confirm`), within this
        many seconds: confirmed only when the defining signal moves beyond the seed noise.
        None is the front ends' default: :data:`~model_debugger.phases.confirm.DEFAULT_SECONDS`
        for a single-process run, off for a multi-rank job (each re-run starts every rank).

    Returns
    -------
    list of Finding
        The findings now recorded.
    """
    budget, ids = check_budget(budget, "budget"), check_probe_ids(ids, "ids")
    if intervene_seconds is not None:
        intervene_seconds = check_budget(intervene_seconds, "intervene_seconds")
    with session.lock("isolate"):
        session.require("isolate")
        state = session.state
        if intervene_seconds is None:
            from .confirm import DEFAULT_SECONDS

            ranks = (state.signals or {}).get("ranks") or 1
            launched = (getattr(artifact, "launch", None) or {}).get("nproc_per_node") or 1
            intervene_seconds = 0.0 if max(ranks, launched) > 1 else DEFAULT_SECONDS
        request = ProbeRequest(budget, tuple(ids) if ids is not None else None,
                               state.classification)
        version = current_version(session)
        live = True
        if probed is not None:
            report = probed.report
        else:
            with artifact.holding():
                kept = artifact.reusable(version)
                if kept is not None:
                    live = kept.keeper is not None
                    report = probe_run(kept.run, kept.keeper, kept.sources, request)
                else:
                    record = session.store.isolate_record(state.isolations + 1)
                    if seed is None and state.artifact is not None:
                        seed = state.artifact.seed
                    kept = artifact.run(version, seed, record, probes=request, stdout=stdout)
                    report = kept.report
            if report is None:  # the child left no findings (killed): the record alone
                live = False
                report = probe_run(kept.run, None, kept.sources, request)
        findings = list(report.findings)
        if intervene_seconds > 0 and artifact.kind in ("script", "cell"):
            from ..probes import rank
            from .confirm import confirm

            findings = confirm(session, artifact, findings, version, state.isolations + 1,
                               intervene_seconds, stdout=stdout)
            cls = state.classification
            findings = rank(findings, [cls.primary, *cls.secondary])  # tested ones by result
        if ids is None:
            _settle_plateau(session, findings, set(report.probe_seconds), report.learnable)
            _reveal(session, findings)
            findings = _follow_cause(session, findings)
        session.record_findings(findings, added=ids is not None,
                                probe_seconds=dict(report.probe_seconds), live=live,
                                noise=report.seed_noise, lr_range=report.lr_range)
    return session.findings


def _reveal(session: DebugSession, findings: list[Finding]) -> None:
    """Re-classify a ``healthy`` run when a probe confirmed what its signals could not show.

    A confirmed, decisive finding of a probe with :attr:`~model_debugger.probes.Probe.reveals`
    (the target copied into the inputs: the good validation score is the leak) makes the run
    that category, citing the finding's measurement; the signals stay as recorded.
    """
    from ..probes import PROBES
    from ..records import HEALTHY, Classification, Evidence

    cls = session.state.classification
    if cls is None or cls.primary != HEALTHY:
        return
    for f in findings:
        probe = PROBES.get(f.check)
        category = getattr(probe, "reveals", None)
        if f.confirmed and category and f.evidence.get("decisive"):
            signal = f"{f.check}_confirmed"
            evidence = (Evidence(signal, 1, f"{f.check}: {f.explanation}"), *cls.evidence)
            signals = {**session.state.signals, signal: 1}
            session.record_classification(Classification(category, (), evidence), signals)
            return


def _follow_cause(session: DebugSession, findings: list[Finding]) -> list[Finding]:
    """Make the confirmed cause's main symptom the primary category when both were measured.

    When two rules fired, the rule table's order chose the primary category. A confirmed,
    decisive finding whose probe names the category its cause shows first
    (:attr:`~model_debugger.probes.Probe.symptom`), among the run's secondary categories,
    decides instead: that category becomes primary, the former primary stays a secondary, and
    the probe's findings explain the new primary. Returns the findings (re-labelled when the
    classification changed).
    """
    from ..classify import classify
    from ..probes import PROBES, rank

    cls = session.state.classification
    if cls is None or not cls.secondary:
        return findings
    for f in findings:
        symptom = getattr(PROBES.get(f.check), "symptom", None)
        if f.confirmed and f.evidence.get("decisive") and symptom in cls.secondary:
            signals = dict(session.state.signals)
            now = classify(signals, prefer=symptom)
            if now.primary != symptom:  # the signals were re-read since: leave it
                return findings
            session.record_classification(now, signals)
            order = [now.primary, *now.secondary]
            moved = [Finding(g.check, g.root_cause, g.confirmed, g.explanation, g.location,
                             {**g.evidence, "category": symptom}) if g.check == f.check else g
                     for g in findings]
            return rank(moved, order)
    return findings


EXPERIMENTS = ("frozen_parameters", "dropout_rate", "lr_range", "linear_stack",
               "optimizer_settings")  # what could hold a loss up


LEARNABLE_MARGIN = 0.15  # an independent learner this far above the model: not the floor


def _settle_plateau(session: DebugSession, findings: list[Finding], ran: set[str],
                    learnable: dict | None = None) -> None:
    """Re-classify a tentative plateau ``healthy`` when the experiments found no cause.

    The loss then settled at the task's floor (:func:`~model_debugger.classify.plateau`). Only
    a confirmed finding about that category counts, and only when at least one experiment that
    could find what holds a loss up ran; otherwise the tentative verdict stays, untested. Nor
    is it the floor when an independent learner on the same rows (``learnable``, from
    ``reference_learner``) scores ``LEARNABLE_MARGIN`` above the model: the data holds what
    the model did not learn, so the plateau stays a problem, citing that measurement.
    """
    from ..classify import tentative, without_cause
    from ..records import Classification, Evidence

    cls = session.state.classification
    if not tentative(cls) or not ran & set(EXPERIMENTS):
        return
    if any(f.confirmed and f.category in (None, cls.primary) for f in findings):
        return
    gap = (learnable["score"] - learnable["model_score"]) if learnable else None
    if gap is not None and gap >= LEARNABLE_MARGIN:
        signals = {**session.state.signals, "reference_score": learnable["score"],
                   "reference_gap": round(gap, 4)}
        session.record_classification(Classification(cls.primary, cls.secondary, (
            *[e for e in cls.evidence if e.signal != "reference_score"],
            Evidence("reference_score", learnable["score"],
                     f"{learnable['metric']} of a {learnable['reference']} predictor on "
                     f"held-out rows of the same data, against the model's "
                     f"{learnable['model_score']:.3g}: the data holds what the model did not "
                     "learn (not this task's floor)"))), signals)
        return
    session.record_classification(without_cause(cls), dict(session.state.signals))
