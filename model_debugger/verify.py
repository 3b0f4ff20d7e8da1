"""Verify: rerun the artifact with and without the fix, from the same initial state, across seeds.

The comparison uses the signal that defined the category (:data:`suggest.DEFINING`) with a noise
band from the spread across seeds (and ``seed_variance`` when Isolate measured it), so a lucky seed
is not taken for a cure. Verdicts: ``resolved`` (the category fires in no seed and the signal
moved beyond the noise, or the problem was present in every seed before), ``partially_resolved``
(the signal improved or some seeds are clean, but the category remains, or the fix brought a
problem the unfixed runs did not show: back to Isolate), and
``not_resolved``.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable

import numpy as np

from ._validate import check_count, check_seconds, check_seed, check_seeds
from .classify import classify
from .records import HEALTHY, Run
from .session import DebugSession, GateError
from .signals import compute
from .suggest import DEFINING, defining_signal

DEFAULT_SEEDS = 3
NOISE_K = 2.0  # the band is this many standard deviations of the per-seed values
# smallest change that counts, per signal (ratios are compared in log10)
MIN_EFFECT = {"loss_relative_drop": 0.02, "val_loss_rise": 0.02, "gap_final": 0.02,
              "finite_fraction": 0.25, "completed": 0.5, "data_wait_fraction": 0.05,
              "rss_growth_mb": 20.0, "cuda_growth_mb": 20.0, "gpu_util_median": 10.0,
              "val_f1_final": 0.02, "train_f1_final": 0.02, "val_acc_final": 0.01,
              "train_acc_final": 0.01}
LOG_SIGNALS = ("grad_norm_growth", "first_to_last_grad_ratio")


def measure(run: Run) -> dict:
    """Signals, classification and the derived Verify signals of one run.

    A run that recorded no training step, or whose process died without closing its record,
    counts as crashed (never as a healthy run).
    """
    from .diagnose import _result_of

    sig = compute(run)
    steps = max(sig.get("steps", 0), 1)
    sig["finite_fraction"] = (min(sig["first_nonfinite_step"], steps) / steps
                              if "first_nonfinite_step" in sig else 1.0)
    sig["completed"] = 0.0 if sig.get("error_kind") == "oom" else 1.0
    cls = classify(sig)
    res = _result_of(run, cls.primary)
    crashed = res["status"] == "not_observed" or (
        res["status"] == "crashed" and sig.get("error_kind") != "oom")
    error = sig.get("error") or res["error"] or res.get("reason")
    if res["status"] == "not_observed":
        error = f"no training step observed: {res['reason']}"
    return {"signals": sig, "categories": [cls.primary, *cls.secondary], "crashed": crashed,
            "error": error}


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
    if name in LOG_SIGNALS:
        band = max(band, 0.5)  # half a decade
    if noise and name == "loss_relative_drop" and b["mean"] is not None and noise.get("cv"):
        band = max(band, float(noise["cv"]) * max(1.0 - b["mean"], 0.0))
    improvement = None
    if a["mean"] is not None and b["mean"] is not None:
        improvement = sign * (a["mean"] - b["mean"])
    improved = improvement is not None and improvement > band
    n = len(after)
    crashed = sum(m["crashed"] for m in after)
    seen_before = {c for m in before for c in m["categories"]}
    new = sorted({c for m in after for c in m["categories"]} - seen_before - {HEALTHY})
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
            "remaining_symptom": remaining, "remaining": [c for c, _ in others.most_common()]}


def seeds_for(session: DebugSession, count: int = DEFAULT_SEEDS) -> list[int]:
    """Seeds for Verify: the reproduction's seeds first (their runs are reused)."""
    art = next((e for e in session.events if e["kind"] == "artifact"), {})
    base = art.get("seed")
    count = check_count(count, "seeds")
    base = check_seed(0 if base is None else base, "the session's seed", count)
    return [base + i for i in range(count)]


def verify(session: DebugSession, runner: Callable[[str, int], Run], seeds: list[int],
           known: dict[int, Run] | None = None) -> dict:
    """Compare before/after runs over ``seeds`` and record the verdict.

    Parameters
    ----------
    session : DebugSession
        With an approved fix pending.
    runner : callable
        ``runner(which, seed) -> Run`` where ``which`` is ``"before"`` or ``"after"``; each call
        starts from the same initial state (seeds reset, live objects restored).
    seeds : list of int
    known : dict, optional
        Runs of the unfixed artifact already captured with these seeds (reused as "before").

    Returns
    -------
    dict
        The verification, as recorded in the session.
    """
    with session.lock("verify"):
        return _verify_locked(session, runner, seeds, known)


def _verify_locked(session: DebugSession, runner: Callable[[str, int], Run], seeds: list[int],
                   known: dict[int, Run] | None) -> dict:
    fix = session.pending_fix
    if fix is None:
        raise GateError(f"verify refused: {session.gates()['verify']} "
                        f"(current phase: {session.phase})")
    category = fix.get("category") or session._state()["problem"] or \
        session.classification.primary
    known = _known_runs(session, seeds) if known is None else known
    before = [measure(known[s] if s in known else runner("before", s)) for s in seeds]
    after = [measure(runner("after", s)) for s in seeds]
    noise = next((e.get("noise") for e in reversed(session.events) if e["kind"] == "isolate"),
                 None)
    cls = session.classification
    cited = [e.signal for e in cls.evidence] if cls and cls.primary == category else None
    verification = judge(category, before, after, noise, cited)
    verification.update(seeds=list(seeds), finding=fix["finding"])
    session.record_verification(verification)
    return verification


def verify_script(session: DebugSession, seeds: list[int] | None = None,
                  max_seconds: float | None = None, stdout=None) -> dict:
    """Verify a pending fix of a script artifact: child runs of the old and the fixed code."""
    with session.lock("verify"):
        return _verify_script(session, seeds, max_seconds, stdout)


def _verify_script(session: DebugSession, seeds: list[int] | None, max_seconds: float | None,
                   stdout) -> dict:
    from .runner import run_script

    seeds, max_seconds = seeds and check_seeds(seeds), check_seconds(max_seconds, "max_seconds")
    fix = session.pending_fix
    if fix is None:
        raise GateError(f"verify refused: {session.gates()['verify']} "
                        f"(current phase: {session.phase})")
    art = next(e for e in session.events if e["kind"] == "artifact")
    if art.get("type") != "script":
        raise GateError("verify refused: the session was reproduced from a log; there is no "
                        "script to rerun")
    seeds = seeds or seeds_for(session)
    n = sum(1 for e in session.events if e["kind"] == "verify") + 1
    folder = os.path.join(session.directory, "verify", str(n))
    os.makedirs(folder, exist_ok=True)
    home = os.path.dirname(art["script"])
    copy = os.path.join(session.directory, fix["copy"])
    # the fixed script runs in place (its __file__ and neighbours) while it still holds the
    # approved code; the reproduced code runs from the session's copy
    code = {"before": session.artifact_copy,
            "after": fix["fixed"] if fix.get("fixed") and _same(fix["fixed"], copy) else copy}
    limit = max_seconds if max_seconds is not None else art.get("max_seconds")

    def runner(which: str, seed: int) -> Run:
        record = os.path.join(folder, f"{which}-{seed}.jsonl")
        run_script(code[which], art.get("args", []), record, seed=seed, max_seconds=limit,
                   stdout=stdout, syspath=home, cwd=art.get("cwd"))
        return Run.load(record) if os.path.exists(record) else Run([])

    known = None if limit == art.get("max_seconds") else {}  # other limits: rerun "before"
    return verify(session, runner, seeds, known)


def _same(path: str, copy: str) -> bool:
    try:
        with open(path, encoding="utf-8") as a, open(copy, encoding="utf-8") as b:
            return a.read() == b.read()
    except OSError:
        return False


def _known_runs(session: DebugSession, seeds: list[int]) -> dict[int, Run]:
    """Runs of the current artifact already captured with one of ``seeds`` (not rerun).

    The reproduction's runs (``runs/<i>``, seed ``seed + i``) until a fix is kept; then the
    kept fix's "after" runs; plus the "before" runs of fixes that were not kept.
    """
    events = session.events
    art = next(e for e in events if e["kind"] == "artifact")
    paths: dict[int, str] = {}
    if art.get("seed") is not None:
        total = (session.reproduce or {}).get("runs", {}).get("total", 0)
        paths = {art["seed"] + i: os.path.join(session.directory, "runs", str(i), "record.jsonl")
                 for i in range(total)}
    n = 0
    for e in events:
        if e["kind"] != "verify":
            continue
        n += 1
        v = e["verification"]
        folder = os.path.join(session.directory, "verify", str(n))
        kept = v["verdict"] in ("resolved", "partially_resolved")
        if kept:
            paths = {}
        for seed in v.get("seeds", []):
            path = os.path.join(folder, f"{'after' if kept else 'before'}-{seed}.jsonl")
            if os.path.exists(path):  # "before" runs that were reused were not written again
                paths[seed] = path
    return {seed: Run.load(p) for seed, p in paths.items() if seed in seeds and os.path.exists(p)}
