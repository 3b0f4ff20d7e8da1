"""How one run ended: its status, error, crash and what it showed (shared by every phase)."""

from __future__ import annotations

import signal

from ..records import PLANNED_STOPS, Run


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
    stopped = (err is not None and err.get("type") in PLANNED_STOPS) or \
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
    if run.ranks:  # a multi-process job: how many ranks, and each one's numbers
        from ..ranks import signals, table

        out["ranks"] = signals(run).get("ranks", len(run.ranks))
        out["rank_table"] = table(run)
        if run.error is not None and run.error.get("rank") is not None:
            out["error_rank"] = run.error["rank"]
    elif run.first("rank") is not None and (run.of("rank")[-1].get("world_size") or 1) > 1:
        info = run.of("rank")[-1]  # one rank of a group, captured in process (a notebook)
        out["single_rank"] = {"rank": info.get("rank"), "world_size": info.get("world_size")}
    oom = (run.error or {}).get("kind") == "oom"
    if not run.steps and not oom and status != "interrupted":
        out.update(status="not_observed", category=None,
                   reason=_unobserved_reason(run, status, err, crash))
    return out
