"""Reproduce and classify: run an artifact (or read a log) and record the verdict in a session."""

from __future__ import annotations

import os
import signal
from collections import Counter

from ._validate import check_run_args
from .classify import classify
from .isolate import build_context, isolate, read_findings, user_sources
from .logs import load_log
from .records import HEALTHY, Run
from .redact import read_source, write_private
from .runner import RunInterrupted, run_script
from .session import DebugSession
from .signals import compute


def _last_step(run: Run) -> int | None:
    """The index of the last recorded step (None without steps)."""
    steps = run.steps
    if not steps:
        return None
    i = steps[-1].get("i")
    return i if isinstance(i, int) and not isinstance(i, bool) else len(steps) - 1


def _how_it_ended(returncode: int | None) -> str:
    """A child's end without an ``end`` event, in words: the signal or the exit code."""
    if returncode is None:
        return "the record has no end event (the process died)"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name} (no end event)"
    return f"exited with code {returncode} without closing the record (os._exit?; no end event)"


def _unobserved_reason(run: Run, status: str, err: dict | None, crash: str | None) -> str:
    """The likely reason a run recorded no training step."""
    if status == "stopped_at_time_limit":
        return ("stopped at the time limit before the first training step (a long set-up or "
                "data load?)")
    if err is not None:
        return (f"crashed during set-up, before the first training step: {err['type']}: "
                f"{err['message']}")[:500]
    if crash is not None:
        return f"crashed during set-up, before the first training step: {crash}"
    started = [e for e in run.of("process")
               if not str(e.get("target", "")).startswith("torch.utils.data")]
    if started:
        targets = sorted({str(e.get("target")) for e in started})
        return (f"training may run in processes the capture did not reach: {len(started)} "
                f"started with multiprocessing (target {', '.join(targets[:3])})")
    calls = run.first("calls") or {}
    if calls.get("backward") and not calls.get("optimizer_steps"):
        return (f"backward() ran {calls['backward']} times but no torch.optim optimizer "
                "stepped (a hand-written update is not seen as a training step)")
    return ("no training step seen: no backward() followed by optimizer.step() and no Keras "
            "fit() ran under capture (the loss a Python float? training in another process?)")


def _result_of(run: Run, category: str, child=None) -> dict:
    """One run's result: how it ended (``status``), its category, its error, what was skipped.

    ``status`` is ``completed``, ``stopped_at_time_limit``, ``crashed`` (an exception, or a
    process that ended by a signal or ``os._exit`` without closing its record: ``crash`` says
    how and after which step), ``interrupted`` (Ctrl-C) or ``not_observed`` (no training
    step was recorded: ``category`` is None and ``reason`` says why); ``child`` is the
    :class:`~model_debugger.runner.ChildResult` of a script run.
    """
    err = run.error
    stopped = (err is not None and err.get("type") == "TimeLimit") or \
        bool(child is not None and child.timed_out)
    interrupted = bool(child is not None and child.interrupted) or (
        err is not None and err.get("kind") == "interrupted" and not stopped)
    if stopped or interrupted:
        err = None  # a planned stop at --max-seconds, or the user's Ctrl-C: not a crash
    crash = None
    if err is None and not stopped and not interrupted and not run.ended and \
            (child is not None or run.events):
        crash = _how_it_ended(child.returncode if child is not None else None)
    status = ("interrupted" if interrupted else "stopped_at_time_limit" if stopped else
              "crashed" if err is not None or crash is not None else "completed")
    fix_loc = run.first("error_location")
    after = _last_step(run)
    if crash is not None:
        error = f"{crash}, after step {after}" if after is not None else crash
    else:
        error = f"{err['type']}: {err['message']}" if err else None
    out = {
        "steps": len(run.steps),
        "epochs": run.epochs,
        "stopped_at_time_limit": stopped,
        "error": error,
        "error_location": (err.get("location") or (
            {"file": fix_loc["file"], "line": fix_loc["line"]} if fix_loc else None))
        if err else None,
        "seconds": round(run.seconds, 3),
        "code": run.refs(),
        "category": category,
        "status": status,
        "bad_lines": run.bad_lines,
    }
    if status == "crashed":
        out["crash"] = {"how": crash or f"{err['type']}: {err['message']}"[:300],
                        "after_step": after,
                        "exit_code": child.returncode if child is not None else None}
    oom = (run.error or {}).get("kind") == "oom"
    if not run.steps and not oom and status != "interrupted":
        out.update(status="not_observed", category=None,
                   reason=_unobserved_reason(run, status, err, crash))
    return out


def _label(result: dict) -> str:
    """What one run showed: its category, or its status when it was not classified."""
    return result["category"] or result["status"].replace("_", " ")


def _classified(results: list[dict], problem: str | None) -> int | None:
    """The run whose classification the session records (None: no run was observed)."""
    want = problem or HEALTHY
    index = next((i for i, r in enumerate(results) if r["category"] == want), None)
    if index is None:
        index = next((i for i, r in enumerate(results) if r["category"] is not None), None)
    return index


def _verdict(results: list[dict], tried: list[str]) -> dict:
    """Fold per-run results into one Reproduce verdict ("reproduced 2/3").

    Statuses: ``reproduced`` (a category in some run), ``interrupted`` (Ctrl-C), ``crashed``
    (a run crashed and none showed a category), ``not_observed`` (no run recorded a training
    step: never ``healthy``), ``not_reproduced`` (the observed runs were healthy).
    """
    problems = Counter(r["category"] for r in results if r["category"] not in (None, HEALTHY))
    category, count = problems.most_common(1)[0] if problems else (None, 0)
    interrupted = next((r for r in results if r["status"] == "interrupted"), None)
    crashed = next((r for r in results if r["status"] == "crashed"), None)
    if interrupted is not None:
        status, ref = "interrupted", interrupted
    elif problems:
        status, ref = "reproduced", next(r for r in results if r["category"] == category)
    elif crashed is not None:
        status, ref = "crashed", crashed
    elif all(r["status"] == "not_observed" for r in results):
        status, ref = "not_observed", results[0]
    else:
        status = "not_reproduced"
        ref = next((r for r in results if r["category"] is not None), results[0])
    out = {k: v for k, v in ref.items() if k != "category"}
    out.update(status=status, problem=category if count else None,
               runs={"total": len(results), "reproduced": count,
                     "categories": [r["category"] for r in results]},
               run_statuses=[r["status"] for r in results],
               bad_lines=sum(r.get("bad_lines", 0) for r in results),
               summary=f"{status.replace('_', ' ')} {count}/{len(results)}")
    if status != "reproduced":
        out["tried"] = tried
    return out


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during ``diagnose``: the child was stopped, the partial session saved."""

    def __init__(self, session: DebugSession) -> None:
        super().__init__(f"interrupted; partial session saved in {session.directory}")
        self.session = session


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
    runs, seed, max_seconds, probe_seconds = check_run_args(script, runs, seed, max_seconds,
                                                            probe_seconds)
    args = list(args or [])
    script = os.path.abspath(script)
    session = DebugSession.create(root, title=os.path.basename(script))
    write_private(os.path.join(session.directory, "artifact.py"), read_source(script))
    session._append("artifact", type="script", script=script, args=args, seed=seed,
                   max_seconds=max_seconds, cwd=os.getcwd())
    with session.lock("reproduce"):
        _reproduce_runs(session, script, args, runs, seed, max_seconds, stdout, probe_seconds)
    return session


def _reproduce_runs(session: DebugSession, script: str, args: list[str], runs: int,
                    seed: int | None, max_seconds: float | None, stdout,
                    probe_seconds: float) -> None:
    """The runs of :func:`diagnose_script`, their verdict, classification and findings.

    A Ctrl-C stops the running child; what was recorded so far is saved as an ``interrupted``
    verdict (classified when a training step was observed) and :class:`Interrupted` is raised.
    """
    results, tried, per_run = [], [], []
    stop = None
    for i in range(max(1, runs)):
        record = os.path.join(session.run_dir(i), "record.jsonl")
        run_seed = None if seed is None else seed + i
        try:
            child = run_script(script, args, record, seed=run_seed, max_seconds=max_seconds,
                               stdout=stdout, isolate_seconds=probe_seconds if i == 0 else 0.0)
        except RunInterrupted as exc:
            child, stop = exc.result, exc
        run = Run.load(record) if os.path.exists(record) else Run([])
        sig = compute(run)
        cls = classify(sig)
        res = _result_of(run, cls.primary, child)
        res.update(record=os.path.relpath(record, session.directory), exit_code=child.returncode,
                   timed_out=child.timed_out or res["stopped_at_time_limit"], complete=run.ended)
        results.append(res)
        per_run.append((cls, sig))
        tried.append(f"run {i + 1}: seed={run_seed}, exit code {child.returncode}, "
                     f"{len(run.steps)} steps{', time limit hit' if res['timed_out'] else ''}"
                     f" -> {_label(res)}")
        if stop is not None:
            break
    verdict = _verdict(results, tried)
    session.record_reproduce(verdict)
    index = _classified(results, verdict["problem"])
    if index is not None:  # a run without a training step is not classified (never healthy)
        cls, sig = per_run[index]
        session.record_classification(cls, sig)
    if stop is not None:
        raise Interrupted(session) from None
    if probe_seconds > 0 and index is not None:
        _record_isolate(session, session.run_dir(0), [script], probe_seconds)


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
    with session.lock("isolate"):
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
    from ._repro import copy_log

    session._append("artifact", type="log", path=os.path.abspath(path), error=error,
                   copy=copy_log(path, session.directory))
    sig = compute(run)
    cls = classify(sig)
    res = _result_of(run, cls.primary)
    if res["status"] == "not_observed" and run.of("metric"):  # a log of metrics: judge them
        res.update(status="completed", category=cls.primary)
        res.pop("reason", None)
    session.record_reproduce(_verdict([res], [f"read {path}: {len(run.steps)} loss points"]))
    if res["category"] is None:  # nothing to classify: the log holds no loss or metric
        return session
    session.record_classification(cls, sig)
    ctx = build_context(run, None, {}, 10.0)
    session.record_findings(isolate(ctx), probe_seconds=ctx.extras.get("probe_seconds", {}),
                            live=False)
    return session
