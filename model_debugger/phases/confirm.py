"""Confirmation by intervention: undo the suspected cause in a re-run, see if the symptom moves.

A hypothesis (a probe's finding) names the change that would undo its cause
(:meth:`~model_debugger.probes.Probe.intervention`). The artifact is re-run for a bounded number
of steps with that one intervention and without it, over the same seeds, from the same initial
state; the finding is confirmed when the signal that defined its category moves beyond the seed
noise band (the judgement Verify uses), and refuted when it does not. The finding then carries the
intervention and the before/after numbers. The user's code is never modified: interventions are
patches inside the re-run (:mod:`model_debugger.interventions`).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from ..artifacts.base import Version
from ..records import Finding, Intervention
from ..session import DebugSession
from ..signals import blowup_step
from ..store import Store
from .verify import judge, measure

SEEDS = 2  # re-runs per side: the noise band needs a spread
MAX_STEPS = 200  # optimizer steps per re-run (the symptom must show within them)
DEFAULT_SECONDS = 60.0  # the front ends' default budget for every re-run together


def _budget_left(deadline: float) -> float:
    return deadline - time.monotonic()


def confirm(session: DebugSession, artifact, findings: list[Finding], version: Version,
            n: int, budget: float, seeds: list[int] | None = None,
            max_steps: int | None = MAX_STEPS, stdout=None) -> list[Finding]:
    """Test each finding that names an intervention; the findings with their verdicts.

    The hypotheses that name a specific mechanism are tested first, in rank order, then those
    that blame a lever (:func:`~model_debugger.probes.base.is_lever`: another learning rate
    "cures" most faults, so it is tried after the specific causes, whose cure it cannot beat),
    then the findings a probe's own experiment or a decisive measurement already settled (a
    re-run can only weaken those): the budget goes where it can decide something.

    Parameters
    ----------
    session : DebugSession
        The session (its classification names the category and the cited signals).
    artifact : Artifact
        What to re-run.
    findings : list of Finding
        The probes' findings, in rank order (the most likely tested first).
    version : Version
        The code to re-run (the session's current code).
    n : int
        The Isolate round: the re-runs' records go under ``isolate/<n>/``.
    budget : float
        Seconds for every re-run together; hypotheses left when it is spent stay as the probes
        judged them (marked untested), and so do those after an intervention that removed the
        symptom and brought no other problem (none of them could do better).
    seeds : list of int, optional
        Default: ``SEEDS`` seeds from the session's seed.
    max_steps : int, optional
        The step budget of each re-run.

    Returns
    -------
    list of Finding
        The same findings; each tested one is ``confirmed`` exactly when its intervention moved
        the defining signal beyond the noise band, with ``evidence["intervention"]`` holding the
        intervention, the compared signal, the before/after values and the band.
    """
    from ..probes.base import is_lever
    from ..probes.suggestions import intervention_for

    state = session.state
    base = state.artifact.seed if state.artifact is not None and state.artifact.seed is not None \
        else 0
    seeds = list(seeds) if seeds is not None else [base + i for i in range(SEEDS)]
    deadline = time.monotonic() + budget
    # seconds of the slowest re-run so far; before the first, the reproduction's own time
    per_run = [_run_seconds(state, max_steps)]
    horizon = [max_steps, False]  # steps per re-run, and whether it was widened already
    session.store.isolate_dir(n)
    cls = state.classification
    onset = blowup_step(state.signals) if cls and cls.primary == "gradient_instability" else None
    if onset is not None and max_steps and onset >= max_steps:  # the re-runs must reach the
        early = _widened(state, max_steps, len(seeds), budget, onset)  # step it blew up at:
        if early is not None:  # (shorter ones cannot show it, and the baseline is paid once;
            horizon[0] = early  # the reproduction's own length stays open, below)
            per_run[0] = _run_seconds(state, early)
    baseline: list[dict] | None = None
    done: dict[int, Finding] = {}
    cured: dict[str, str] = {}  # category -> the intervention that removed it, nothing new
    order = sorted(range(len(findings)),  # stable: rank order within each group
                   key=lambda i: (_settled(findings[i]), is_lever(findings[i])))
    for index in order:
        finding = findings[index]
        out = _Slot(done, index)
        intervention = intervention_for(finding)
        category = finding.category or (cls.primary if cls else None)
        if intervention is None or category in (None, "healthy") or _budget_left(deadline) <= 0:
            out.append(finding)
            continue
        if category in cured and not _settled(finding):  # nothing can beat a cure: the
            # other hypotheses stay as the probes judged (a settled finding is still re-run:
            # a cure by another change may be a side effect)
            out.append(replace(finding, evidence={**finding.evidence, "intervention": {
                "id": intervention.id, "params": dict(intervention.params),
                "untested": f"not re-run: {cured[category]} already removed {category}"}}))
            continue

        def runs(label: str, change: Intervention | None, which: list[int]) -> list[dict] | None:
            """The measured re-runs, or None when one ran into the budget's end (no verdict)."""
            measured = []
            for seed in which:
                rel = Store.intervention_rel(n, label, seed)
                left = _budget_left(deadline)
                t0 = time.monotonic()
                cap = artifact.run(version, seed, session.store.path(rel), intervention=change,
                                   max_steps=horizon[0], stdout=stdout,
                                   max_seconds=max(left, 1.0))
                took = time.monotonic() - t0
                per_run[0] = max(per_run[0], took)
                if took >= left:  # stopped by the budget, not by its steps: cut short
                    return None
                measured.append({**measure(cap.run), "sites": cap.run.of("intervened")})
            return measured

        needed = len(seeds) * (2 if baseline is None else 1) * per_run[0]
        if needed > _budget_left(deadline):  # the re-runs cannot finish within the budget
            out.append(_untested(finding, intervention, f"the re-runs would take about "
                                 f"{needed:.0f} s, beyond the {_budget_left(deadline):.0f} s "
                                 "left of the budget"))
            continue
        with artifact.holding():
            if baseline is None:
                baseline = runs("baseline", None, seeds)
                if baseline is None:
                    out.append(_untested(finding, intervention, "the baseline re-runs ran into "
                                         "the end of the budget"))
                    continue  # (no budget is left: the findings after it stay as judged)
            shown = [s for s, m in zip(seeds, baseline, strict=True) if category in m["categories"]]
            if not shown and not horizon[1]:  # widen the window once rather than give up: a
                # symptom that builds over more steps than the bounded re-runs (a blow-up late
                # in the run) shows in re-runs as long as the reproduction, if they fit
                left = _budget_left(deadline)
                widened = (_widened(state, horizon[0], len(seeds), left, onset)
                           if category == "gradient_instability" else None) or \
                    _widened(state, horizon[0], len(seeds), left)  # (else the whole length)
                if widened is not None:
                    short = horizon[0]
                    horizon[:] = [widened, True]
                    per_run[0] = max(per_run[0], _run_seconds(state, widened))
                    longer = runs("baseline", None, seeds)
                    if longer is None:  # the short baseline stays, at its own horizon
                        horizon[0] = short
                        out.append(_untested(finding, intervention, "the longer baseline "
                                             "re-runs ran into the end of the budget"))
                        continue
                    baseline = longer
                    shown = [s for s, m in zip(seeds, baseline, strict=True)
                             if category in m["categories"]]
            if not shown:  # the bounded re-run does not show the symptom: nothing to test
                out.append(replace(finding, evidence={**finding.evidence, "intervention": {
                    "id": intervention.id, "params": dict(intervention.params),
                    "untested": f"{category} did not show in {len(seeds)} re-runs of "
                                f"{horizon[0]} steps"}}))
                continue
            needed = len(shown) * per_run[0]
            if needed > _budget_left(deadline):  # what the baseline took says it cannot fit
                out.append(_untested(finding, intervention, f"the re-runs would take about "
                                     f"{needed:.0f} s, beyond the "
                                     f"{max(_budget_left(deadline), 0):.0f} s left of the "
                                     "budget"))
                continue
            after = runs(intervention.id, intervention, shown)
            if after is None:
                out.append(_untested(finding, intervention,
                                     "the re-runs ran into the end of the budget"))
                continue
            broke = next((m for m, b in zip(after, (m for s, m in zip(seeds, baseline,
                                                                      strict=True)
                                                    if s in shown), strict=True)
                          if m["crashed"] and not b["crashed"]), None)
            if broke is not None:  # the change broke the program: a failed run is no cure
                out.append(_untested(finding, intervention, "the re-run with the change "
                                     f"failed ({broke['error'] or 'no step recorded'})"))
                continue
        before = [m for s, m in zip(seeds, baseline, strict=True) if s in shown]
        cited = [e.signal for e in cls.evidence] if cls and cls.primary == category else None
        judged = judge(category, before, after, None, cited)
        gone = judged["after"]["present_count"] == 0
        # beyond the band; or the category itself gone from every re-run that showed it (two
        # at least): a baseline whose seeds differ widely (one NaN, one finite) has a band
        # no number can cross, yet "present in each, absent after" is the experiment's answer
        beyond = judged["improvement"] is not None and \
            judged["improvement"] > judged["noise_band"]
        moved = beyond or (gone and len(shown) >= SEEDS and judged["improvement"] is not None
                           and judged["improvement"] > 0)
        paid = _validation_worse(before, after) if category == "loss_not_decreasing" else None
        if paid is not None:  # the training loss fell further, held-out rows did worse: the
            moved = gone = beyond = False  # change fits the training set harder, no cure
        result = {"id": intervention.id, "params": dict(intervention.params),
                  "metric": judged["metric"], "direction": judged["direction"],
                  "before": judged["before"]["values"], "after": judged["after"]["values"],
                  "before_mean": judged["before"]["mean"], "after_mean": judged["after"]["mean"],
                  "noise_band": judged["noise_band"], "improvement": judged["improvement"],
                  "symptom_gone": gone, "seeds": shown, "max_steps": horizon[0],
                  "moved": moved, "verdict": judged["verdict"],
                  "after_categories": judged["after"]["categories"]}
        if paid is not None:
            result["validation_worse"] = paid
        word = "moved" if beyond else \
            f"removed {category} from every re-run that showed it, and moved" if moved else \
            "did not move"
        new = [c for c in judged["after"]["categories"] if c not in (category, "healthy")]
        sites = [e for m in after for e in m["sites"]]
        if moved and sites:  # where the change acted (an operation it guarded)
            from ..probes import PROBES

            probe = PROBES.get(finding.check)
            try:
                finding = probe().acted_at(finding, sites) if probe is not None else finding
            except Exception:  # noqa: BLE001 - a location not read keeps the probe's own
                pass
        explanation = (f"{finding.explanation} Re-running with {intervention.id}"
                       f"{_params(intervention)} {word} {judged['metric']}"
                       f"{' beyond the noise band' if beyond or not moved else ''} "
                       f"({_num(judged['before']['mean'])} -> {_num(judged['after']['mean'])}, "
                       f"band {judged['noise_band']:.3g}, seeds {shown})"
                       f"{'; the symptom is gone' if moved and gone else ''}"
                       f"{_paid_text(paid)}"
                       f"{'; but the re-runs show ' + ', '.join(sorted(set(new))) if new else ''}.")
        if moved and gone and not new:
            cured[category] = intervention.id

        settled = _settled(finding)
        if moved or not settled:
            out.append(replace(finding, confirmed=moved, explanation=explanation,
                               evidence={**finding.evidence, "intervention": result,
                                         "confirmed_by": "intervention", "undone": moved,
                                         "strength": _strength(finding, moved, gone, new)}))
        else:  # the probe's own experiment undid the cause, or measured it outright: a re-run
            # that did not move the signal (an intervention a loop can escape) weakens it only
            out.append(replace(finding, explanation=explanation, evidence={
                **finding.evidence, "intervention": result,
                "strength": 0.5 * float(finding.evidence.get("strength", 0.5))}))
    return [done[i] for i in range(len(findings))]


VAL_WORSE = 1.02  # a validation loss 2% above the unmodified re-runs': the cure cost generalisation


def _validation_worse(before: list[dict], after: list[dict]) -> dict | None:
    """The validation losses when the intervention's re-runs ended worse on them, else None.

    A change that lets a model fit its training rows harder (a higher learning rate on a
    loss settled at a noisy task's floor) moves the training loss it is judged on while the
    rows it never saw get worse: that is no cure for a loss that does not decrease.
    """
    def mean(side: list[dict]) -> float | None:
        vals = [m["signals"].get("val_loss_final") for m in side]
        vals = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
        return sum(vals) / len(vals) if vals and len(vals) == len(side) else None

    b, a = mean(before), mean(after)
    if b is None or a is None or b <= 0 or not a > VAL_WORSE * b:
        return None
    return {"before": round(b, 6), "after": round(a, 6)}


def _paid_text(paid: dict | None) -> str:
    if paid is None:
        return ""
    return (f"; but the validation loss ended worse ({_num(paid['before'])} -> "
            f"{_num(paid['after'])}): the change fits the training rows harder, it does not "
            "cure the plateau")


def _untested(finding: Finding, intervention: Intervention, why: str) -> Finding:
    """``finding`` as the probes judged it, saying why its intervention was not re-run."""
    return replace(finding, evidence={**finding.evidence, "intervention": {
        "id": intervention.id, "params": dict(intervention.params), "untested": why}})


def _widened(state, steps: int | None, seeds: int, left: float,
             onset: int | None = None) -> int | None:
    """A longer re-run horizon, when the re-runs fit ``left``.

    The reproduction's own steps, or as far as the step where its symptom began (``onset``)
    and a quarter more.

    Room for the baseline and one intervention over every seed (``2 * seeds`` runs); None when
    the re-runs already ran that long, or would not fit.
    """
    rep = state.reproduction
    if steps is None or rep is None or not rep.steps:
        return None
    want = rep.steps if onset is None else min(rep.steps, int(onset * 1.25) + 10)
    if want <= steps:
        return None
    return want if 2 * seeds * _run_seconds(state, want) <= left else None


def _run_seconds(state, max_steps: int | None) -> float:
    """A first estimate of one re-run's seconds: the reproduction's, for at most its steps."""
    rep = state.reproduction
    if rep is None:
        return 0.0
    seconds = float(rep.extra.get("seconds") or 0.0)
    steps = rep.steps
    if max_steps and steps and steps > max_steps:
        seconds *= max(max_steps / steps, 0.25)  # (start-up costs the same: not below 1/4)
    return seconds


class _Slot:
    """Where the verdict on the finding at ``index`` goes (the input order is kept)."""

    def __init__(self, done: dict, index: int) -> None:
        self.done, self.index = done, index

    def append(self, finding: Finding) -> None:
        self.done[self.index] = finding


def _settled(finding: Finding) -> bool:
    """Whether a probe's own experiment undid the cause, or measured it outright."""
    return finding.evidence.get("undone") is True or finding.evidence.get("decisive") is True


def _strength(finding: Finding, moved: bool, gone: bool, new: list[str]) -> float:
    """The strength of a finding tested by intervention (the probe ranking reads it).

    An intervention that removed the symptom and brought nothing new is the strongest evidence
    there is; one that moved the signal but left the symptom, or brought another problem, less;
    one that did not move it, none.
    """
    if not moved:
        return 0.0
    return 1.0 if gone and not new else 0.9 if gone else 0.7


def _params(intervention: Intervention) -> str:
    if not intervention.params:
        return ""
    return " (" + ", ".join(f"{k}={_num(v)}" for k, v in intervention.params.items()) + ")"


def _num(value) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else str(value)
