"""Reproduce and classify: run an artifact (or read a log) and record the verdict in a session."""

from __future__ import annotations

import os
from collections import Counter

from .classify import classify
from .isolate import build_context, isolate, read_findings, user_sources
from .logs import load_log
from .records import HEALTHY, Run
from .redact import read_source, write_private
from .runner import run_script
from .session import DebugSession
from .signals import compute


def _result_of(run: Run, category: str) -> dict:
    err = run.error
    stopped = err is not None and err.get("type") == "TimeLimit"
    if stopped:
        err = None  # a planned stop at --max-seconds, not a crash
    fix_loc = run.first("error_location")
    return {
        "steps": len(run.steps),
        "epochs": run.epochs,
        "stopped_at_time_limit": stopped,
        "error": f"{err['type']}: {err['message']}" if err else None,
        "error_location": (err.get("location") or (
            {"file": fix_loc["file"], "line": fix_loc["line"]} if fix_loc else None))
        if err else None,
        "seconds": round(run.seconds, 3),
        "code": run.refs(),
        "category": category,
    }


def _verdict(results: list[dict], tried: list[str]) -> dict:
    """Fold per-run results into one Reproduce verdict ("reproduced 2/3")."""
    problems = Counter(r["category"] for r in results if r["category"] != HEALTHY)
    if problems:
        category, count = problems.most_common(1)[0]
        ref = next(r for r in results if r["category"] == category)
        status = "reproduced"
    else:
        category, count = HEALTHY, 0
        ref = next((r for r in results if r["error"]), results[0])
        status = "crashed" if ref["error"] else "not_reproduced"
    out = {k: v for k, v in ref.items() if k != "category"}
    out.update(status=status, problem=category if count else None,
               runs={"total": len(results), "reproduced": count,
                     "categories": [r["category"] for r in results]},
               summary=f"{status.replace('_', ' ')} {count}/{len(results)}")
    if status != "reproduced":
        out["tried"] = tried
    return out


def diagnose_script(script: str, args: list[str] | None = None, runs: int = 1,
                    seed: int | None = None, max_seconds: float | None = None,
                    root: str = ".model_debugger", stdout=None,
                    probe_seconds: float = 30.0) -> DebugSession:
    """Reproduce ``script`` ``runs`` times under capture, classify, and save a session.

    Parameters
    ----------
    script : str
        The training script (run as ``__main__`` in a child process).
    args : list of str, optional
        Its command-line arguments.
    runs : int
        How many times to run it; run ``i`` uses seed ``seed + i`` when a seed is given.
    seed : int, optional
        Seed for Python, NumPy and torch in the child.
    max_seconds : float, optional
        Stop each run after this long; what was recorded so far is classified.
    root : str
        Where sessions are saved.
    stdout : file, optional
        Where the script's own output goes (default: stderr).
    probe_seconds : float
        Budget for Isolate probes, run in the first run's process on the live objects
        (0 skips Isolate).

    Returns
    -------
    DebugSession
        With Reproduce, Classify and (unless skipped) Isolate recorded.
    """
    args = list(args or [])
    script = os.path.abspath(script)
    session = DebugSession.create(root, title=os.path.basename(script))
    write_private(os.path.join(session.directory, "artifact.py"), read_source(script))
    session.append("artifact", type="script", script=script, args=args, seed=seed,
                   max_seconds=max_seconds, cwd=os.getcwd())
    results, tried, per_run = [], [], []
    for i in range(max(1, runs)):
        record = os.path.join(session.run_dir(i), "record.jsonl")
        run_seed = None if seed is None else seed + i
        child = run_script(script, args, record, seed=run_seed, max_seconds=max_seconds,
                           stdout=stdout, isolate_seconds=probe_seconds if i == 0 else 0.0)
        run = Run.load(record) if os.path.exists(record) else Run([])
        sig = compute(run)
        cls = classify(sig)
        res = _result_of(run, cls.primary)
        res.update(record=os.path.relpath(record, session.directory), exit_code=child.returncode,
                   timed_out=child.timed_out or res["stopped_at_time_limit"], complete=run.ended)
        results.append(res)
        per_run.append((cls, sig))
        tried.append(f"run {i + 1}: seed={run_seed}, exit code {child.returncode}, "
                     f"{len(run.steps)} steps{', time limit hit' if res['timed_out'] else ''}"
                     f" -> {cls.primary}")
    verdict = _verdict(results, tried)
    session.record_reproduce(verdict)
    index = next((i for i, r in enumerate(results)
                  if r["category"] == (verdict["problem"] or HEALTHY)), 0)
    cls, sig = per_run[index]
    session.record_classification(cls, sig)
    if probe_seconds > 0:
        _record_isolate(session, session.run_dir(0), [script], probe_seconds)
    return session


def isolate_session(session: DebugSession, probe_seconds: float = 30.0,
                    stdout=None) -> DebugSession:
    """Isolate again on the session's current code: one captured run, then the probes.

    After a partially resolved fix the current code is the kept fix; the new findings replace
    the old ones and the Fix gate follows them.
    """
    from .session import GateError

    art = next((e for e in session.events if e["kind"] == "artifact"), {})
    if art.get("type") != "script":
        raise GateError("isolate refused: the session has no script to run")
    session._require("isolate")
    n = sum(1 for e in session.events if e["kind"] == "isolate") + 1
    folder = os.path.join(session.directory, "isolate", str(n))
    os.makedirs(folder, exist_ok=True)
    record = os.path.join(folder, "record.jsonl")
    run_script(session.artifact_copy, art.get("args", []), record, seed=art.get("seed"),
               max_seconds=art.get("max_seconds"), stdout=stdout,
               isolate_seconds=probe_seconds, syspath=os.path.dirname(art["script"]),
               cwd=art.get("cwd"))
    _record_isolate(session, folder, [session.artifact_copy], probe_seconds)
    return session


def _record_isolate(session: DebugSession, run_dir: str, files: list[str],
                    budget: float) -> None:
    """Findings from the child's live probes, or from the record alone when it left none."""
    found = read_findings(os.path.join(run_dir, "findings.json"))
    if found is None:
        record = os.path.join(run_dir, "record.jsonl")
        run = Run.load(record) if os.path.exists(record) else Run([])
        ctx = build_context(run, None, user_sources(run, files), budget)
        findings, extras, live = isolate(ctx), ctx.extras, False
    else:
        (findings, extras), live = found, True
    session.record_findings(findings, probe_seconds=extras.get("probe_seconds", {}), live=live,
                            noise=extras.get("seed_noise"), lr_range=extras.get("lr_range"))


def diagnose_log(path: str, error: str | None = None,
                 root: str = ".model_debugger") -> DebugSession:
    """Classify from a minimal reproducer (a loss/metrics log plus optional error text)."""
    run = load_log(path, error)
    session = DebugSession.create(root, title=os.path.basename(path))
    session.append("artifact", type="log", path=os.path.abspath(path), error=error)
    sig = compute(run)
    cls = classify(sig)
    res = _result_of(run, cls.primary)
    session.record_reproduce(_verdict([res], [f"read {path}: {len(run.steps)} loss points"]))
    session.record_classification(cls, sig)
    ctx = build_context(run, None, {}, 10.0)
    session.record_findings(isolate(ctx), probe_seconds=ctx.extras.get("probe_seconds", {}),
                            live=False)
    return session
