"""Verify: rerun the artifact with and without the fix, from the same initial state, across seeds.

Written once for every artifact. The comparison uses the signal that defined the category
(:mod:`model_debugger.defining`) with a noise band from the spread across seeds (and
``seed_variance`` when Isolate measured it), so a lucky seed is not taken for a cure. Verdicts:
``resolved`` (the category fires in no seed and the signal moved beyond the noise, or the problem
was present in every seed before), ``partially_resolved`` (the signal improved or some seeds are
clean, but the category remains, or the fix brought a problem the unfixed runs did not show: back
to Isolate), and ``not_resolved``. Runs of the unfixed code already captured with a seed (the
reproduction's, or an earlier Verify's) are reused, and the verification names the record each
side's numbers came from.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from .._validate import check_count, check_seconds, check_seed, check_seeds
from ..artifacts.base import Version
from ..classify import classify, tentative
from ..defining import DEFINING, LOG_SIGNALS, MIN_EFFECT, defining_signal
from ..records import HEALTHY, Run, Verification
from ..session import DebugSession
from ..signals import compute, outcome_signals
from ..store import Store
from .outcome import _result_of
from .versions import current_version, fixed_version

DEFAULT_SEEDS = 3
NOISE_K = 2.0  # the band is this many standard deviations of the per-seed values
PAIRED_MIN = 2  # seeds where the problem occurred, each cured, that resolve it without the band


def measure(run: Run) -> dict:
    """Signals, classification and the derived Verify signals of one run.

    A run that recorded no training step, or whose process died without closing its record,
    counts as crashed (never as a healthy run).
    """
    sig = compute(run)
    sig.update(outcome_signals(sig))
    cls = classify(sig)
    res = _result_of(run, cls.primary)
    crashed = res["status"] == "not_observed" or (
        res["status"] == "crashed" and sig.get("error_kind") != "oom")
    error = sig.get("error") or res["error"] or res.get("reason")
    if res["status"] == "not_observed":
        error = f"no training step observed: {res['reason']}"
    return {"signals": sig, "categories": [cls.primary, *cls.secondary], "crashed": crashed,
            "error": error, "tentative": tentative(cls)}


def _value(sig: dict, name: str) -> float:
    v = sig.get(name)
    if not isinstance(v, (int, float)) or not math.isfinite(v):
        return math.nan
    return math.log10(max(v, 1e-30)) if name in LOG_SIGNALS else float(v)


def _side(measured: list[dict], name: str, category: str) -> dict:
    vals = [_value(m["signals"], name) for m in measured]
    finite = [v for v in vals if math.isfinite(v)]
    present = sum(category in m["categories"] for m in measured)
    return {"values": [None if not math.isfinite(v) else round(v, 6) for v in vals],
            "mean": float(np.mean(finite)) if finite else None,
            "std": float(np.std(finite, ddof=1)) if len(finite) > 1 else 0.0,
            "present": f"{present}/{len(measured)}", "present_count": present,
            "categories": [m["categories"][0] for m in measured],
            "errors": [m["error"] for m in measured if m["error"]]}


def _cured_where_seen(category: str, before: list[dict], after: list[dict], name: str,
                      sign: int) -> list[int]:
    """The positions of the seeds where ``category`` occurred before, when each is cured.

    Cured: the fixed run of that seed no longer shows ``category`` and moved ``name`` the right
    way by more than its minimum effect (else ``[]``).

    Runs are paired by seed (same seed, same initial state), so a problem that reproduced in
    only some seeds is judged where it occurred: a bimodal 0-1 signal's spread across seeds
    would otherwise make a noise band wider than the signal's whole range. It takes
    :data:`PAIRED_MIN` such seeds (one seed that flipped could be chance).
    """
    seen = [i for i, m in enumerate(before) if category in m["categories"]]
    if len(seen) < PAIRED_MIN or len(after) != len(before):
        return []
    floor = MIN_EFFECT.get(name, 0.0)
    for i in seen:
        b, a = _value(before[i]["signals"], name), _value(after[i]["signals"], name)
        if category in after[i]["categories"] or not (math.isfinite(a) and math.isfinite(b)) \
                or sign * (a - b) <= floor:
            return []
    return seen


def judge(category: str, before: list[dict], after: list[dict], noise: dict | None = None,
          cited: list[str] | None = None) -> dict:
    """The verdict on ``category`` from measured before/after runs (see :func:`measure`).

    ``cited`` are the signals the classification cited; they choose the compared signal.
    """
    ref = next((m["signals"] for m in before if category in m["categories"]),
               before[0]["signals"] if before else {})
    name, sign = defining_signal(category, ref, cited) or \
        (DEFINING.get(category, (("steps", 1),))[0])
    b, a = _side(before, name, category), _side(after, name, category)
    band = max(NOISE_K * b["std"], NOISE_K * a["std"], MIN_EFFECT.get(name, 0.0))
    if noise and name == "loss_relative_drop" and b["mean"] is not None and noise.get("cv"):
        band = max(band, float(noise["cv"]) * max(1.0 - b["mean"], 0.0))
    improvement = None
    if a["mean"] is not None and b["mean"] is not None:
        improvement = sign * (a["mean"] - b["mean"])
    cured = _cured_where_seen(category, before, after, name, sign)
    improved = improvement is not None and improvement > band or bool(cured)
    n = len(after)
    crashed = sum(m["crashed"] for m in after)
    seen_before = {c for m in before for c in m["categories"]}
    # a tentative plateau (a loss settled above zero, no experiment run on it) is no new
    # problem: regularisation that keeps a memorised loss from reaching zero settles it there
    new = sorted({c for m in after for c in m["categories"]
                  if not (m.get("tentative") and c == "loss_not_decreasing")}
                 - seen_before - {HEALTHY})
    if crashed and category != "memory_issue":
        verdict = "not_resolved"
        remaining = f"the fixed code crashed in {crashed}/{n} seeds: {a['errors'][0]}"
    elif a["present_count"] == 0 and (improved or b["present_count"] == len(before)) and new:
        verdict = "partially_resolved"
        remaining = f"{category} is gone, but the fixed runs show {', '.join(new)}, which the " \
                    "unfixed runs did not"
    elif a["present_count"] == 0 and (improved or b["present_count"] == len(before)):
        verdict, remaining = "resolved", None
    elif a["present_count"] == 0:
        verdict = "not_resolved"
        remaining = (f"{category} was present in only {b['present']} seeds before and "
                     f"{name} did not move beyond the noise band ({band:.3g})")
    elif improved or a["present_count"] < b["present_count"]:
        verdict = "partially_resolved"
        remaining = f"{category} still present in {a['present']} seeds ({name} mean " \
                    f"{a['mean']:.4g} vs {b['mean']:.4g} before)" if a["mean"] is not None \
            else f"{category} still present in {a['present']} seeds"
    else:
        verdict = "not_resolved"
        remaining = f"{category} still present in {a['present']} seeds; {name} did not improve " \
                    f"beyond the noise band ({band:.3g})"
    others = Counter(c for m in after for c in m["categories"] if c not in (category, HEALTHY))
    return {"verdict": verdict, "category": category, "metric": name,
            "direction": "higher" if sign > 0 else "lower",
            "scale": "log10" if name in LOG_SIGNALS else "linear",
            "before": b, "after": a, "noise_band": round(band, 6),
            "improvement": None if improvement is None else round(improvement, 6),
            "cured_where_seen": cured, "remaining_symptom": remaining, "remaining": [c for c, _ in others.most_common()]}


def seeds_for(session: DebugSession, count: int = DEFAULT_SEEDS) -> list[int]:
    """Seeds for Verify: the reproduction's seeds first (their runs are reused)."""
    info = session.state.artifact
    base = info.seed if info is not None else None
    count = check_count(count, "seeds")
    base = check_seed(0 if base is None else base, "the session's seed", count)
    return [base + i for i in range(count)]


def known_runs(session: DebugSession) -> dict[int, str]:
    """Records (relative) of the current code's runs already captured, by seed.

    The reproduction's runs (seed ``seed + i``) until a fix is kept (not a multi-rank job's:
    its record is one file per rank, re-run through the launcher); then the kept fix's
    "after" runs; plus the "before" runs of fixes that were not kept.
    """
    store = session.store
    state = session.state
    paths: dict[int, str] = {}
    info = state.artifact
    ranks = (state.signals or {}).get("ranks") or 1
    if info is not None and info.seed is not None and ranks <= 1:  # (a job's ranks: re-run)
        total = (state.reproduction.runs or {}).get("total", 0) if state.reproduction else 0
        paths = {info.seed + i: Store.run_rel(i) for i in range(total)
                 if store.exists(Store.run_rel(i))}
    n = 0
    for e in session.events:
        if e["kind"] != "verify":
            continue
        n += 1
        v = e["verification"]
        kept = v["verdict"] in ("resolved", "partially_resolved")
        side = "after" if kept else "before"
        if kept:
            paths = {}
        records = (v.get("records") or {}).get(side)
        if records is None:  # a session from before records were named: the file names
            records = {str(s): Store.verify_rel(n, side, s) for s in v.get("seeds", [])}
        paths.update({int(s): rel for s, rel in records.items() if store.exists(rel)})
    return paths


def verify(session: DebugSession, artifact, seeds: int | list[int] | None = None,
           max_seconds: float | None = None, stdout=None, progress=None) -> Verification:
    """Compare the current code and the approved fix over seeds; record the verdict.

    Parameters
    ----------
    session : DebugSession
        With an approved fix pending (the Verify gate).
    artifact : Artifact
        The session's artifact; every run starts from the same initial state.
    seeds : int or list of int, optional
        How many seeds (from the session's seed), or which (default 3).
    max_seconds : float, optional
        A script's time limit for these runs (default: the reproduction's); with another
        limit the unfixed code is run again rather than reused.
    progress : callable, optional
        ``progress(done, total)`` after each run.
    """
    max_seconds = check_seconds(max_seconds, "max_seconds")
    if isinstance(seeds, (list, tuple)):
        chosen = check_seeds(list(seeds))
    else:
        chosen = seeds_for(session, DEFAULT_SEEDS if seeds is None else seeds)
    with session.lock("verify"):
        session.require("verify")
        state = session.state
        fix = state.pending
        n = state.verifications + 1
        session.store.verify_dir(n)
        before_v = current_version(session)
        after_v = fixed_version(session)
        info = state.artifact
        same_limit = max_seconds is None or (info is not None and max_seconds == info.max_seconds)
        known = known_runs(session) if same_limit else {}
        limit = {} if max_seconds is None else {"max_seconds": max_seconds}
        records: dict[str, dict[str, str]] = {"before": {}, "after": {}}
        total, done = 2 * len(chosen), [0]

        def one(which: str, version: Version, seed: int) -> dict:
            rel = Store.verify_rel(n, which, seed)
            if which == "before" and seed in known:
                rel = known[seed]
                run = Run.load(session.store.path(rel))
            else:
                run = artifact.run(version, seed, session.store.path(rel), stdout=stdout,
                                   **limit).run
            records[which][str(seed)] = rel
            done[0] += 1
            if progress is not None:
                progress(done[0], total)
            return measure(run)

        with artifact.holding():
            before = [one("before", before_v, s) for s in chosen]
            after = [one("after", after_v, s) for s in chosen]
        category = fix.category or state.problem or state.classification.primary
        cls = state.classification
        cited = [e.signal for e in cls.evidence] if cls and cls.primary == category else None
        noise = state.isolate_info.get("noise")
        result = judge(category, before, after, noise, cited)
        result.update(seeds=list(chosen), finding=fix.finding, records=records)
        session.record_verification(result)
    return session.state.verification
