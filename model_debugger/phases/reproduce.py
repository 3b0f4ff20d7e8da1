"""Reproduce (and Classify): run the artifact under capture, fold the runs into one verdict.

Written once for every artifact: a script's runs are child processes, a cell's run in the kernel;
both go through :meth:`~model_debugger.artifacts.base.Artifact.run`. Each run is classified; the
session records the verdict ("reproduced 2/3"), the classification of a run that showed the
problem (never of a run that observed no training step), and - with a probe budget - Isolate's
findings under that recorded classification.
"""

from __future__ import annotations

from collections import Counter

from .._validate import check_budget, check_count, check_seed
from ..artifacts.base import ProbeRequest, Version
from ..classify import classify
from ..ranks import load_job
from ..records import HEALTHY, ArtifactInfo, Reproduction, Run
from ..runner import RunInterrupted
from ..session import DebugSession
from ..signals import compute
from ..store import ARTIFACT, CELL
from .outcome import _result_of


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during Reproduce: the run was stopped, the partial session saved."""

    def __init__(self, session: DebugSession) -> None:
        super().__init__(f"interrupted; partial session saved in {session.directory}")
        self.session = session


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



def record_artifact(session: DebugSession, artifact, seed: int | None) -> None:
    """Keep the artifact's code in the session and record what it is."""
    fields, code, script = artifact.describe()
    session.store.write_code(ARTIFACT, script)
    copy = ARTIFACT
    if artifact.kind == "cell":
        session.store.write_code(CELL, code)
        copy = CELL
    known = {k: fields.pop(k) for k in ("type", "script", "args", "max_seconds", "cwd")
             if k in fields}
    session.record_artifact(ArtifactInfo.from_json({**known, "seed": seed, "copy": copy}),
                            **fields)


def reproduce(session: DebugSession, artifact, runs: int = 1, seed: int | None = None,
              probe_budget: float = 0.0, stdout=None,
              intervene_seconds: float | None = 0.0) -> Reproduction:
    """Run ``artifact`` ``runs`` times under capture; record Reproduce, Classify (and Isolate).

    Parameters
    ----------
    session : DebugSession
        A new session (its first event is the artifact).
    artifact : Artifact
        A :class:`~model_debugger.artifacts.ScriptArtifact` or
        :class:`~model_debugger.artifacts.CellArtifact`.
    runs : int
        How many runs; run ``i`` uses seed ``seed + i`` when a seed is given.
    seed : int, optional
    probe_budget : float
        When > 0, Isolate runs after Classify: on the first run's live objects when that run
        showed the recorded classification, else in a re-run of the run that showed it.
    stdout : file, optional
        Where a script's own output goes.
    intervene_seconds : float
        Passed to Isolate: seconds for confirming findings by intervention (0: off).

    Returns
    -------
    Reproduction
        The recorded verdict. A Ctrl-C saves what was recorded so far as ``interrupted``
        (classified when a training step was observed) and raises :class:`Interrupted`.
    """
    runs = check_count(runs, "runs")
    seed = check_seed(seed, "seed", runs)
    probe_budget = check_budget(probe_budget, "probe_budget")
    record_artifact(session, artifact, seed)
    version = Version("reproduced", session.store.path(session.state.current))
    with session.lock("reproduce"):
        results, tried, per_run, first = [], [], [], None
        stop = None
        for i in range(max(1, runs)):
            run_seed = None if seed is None else seed + i
            record = session.store.run_record(i)
            probes = ProbeRequest(probe_budget) if probe_budget > 0 and i == 0 and \
                artifact.kind == "script" else None
            try:
                cap = artifact.run(version, run_seed, record, probes=probes, stdout=stdout)
                child = cap.child
            except RunInterrupted as exc:
                cap, child, stop = None, exc.result, exc
            run = cap.run if cap is not None else load_job(record)
            sig = compute(run)
            cls = classify(sig)
            res = _result_of(run, cls.primary, child)
            if cap is not None and cap.error is not None and child is None:
                res.update(exit_code=1)
            res.update(record=session.store.rel(record),
                       exit_code=res.get("exit_code", child.returncode if child else 0),
                       timed_out=bool(child is not None and child.timed_out) or
                       res["stopped_at_time_limit"], complete=run.ended)
            results.append(res)
            per_run.append((cls, sig, cap))
            exit_part = f", exit code {child.returncode}" if child is not None else ""
            tried.append(f"run {i + 1}: seed={run_seed}{exit_part}, {len(run.steps)} steps"
                         f"{', time limit hit' if res['timed_out'] else ''} -> {_label(res)}")
            if first is None:
                first = cap
            if stop is not None:
                break
        verdict = _verdict(results, tried)
        session.record_reproduce(verdict)
        index = _classified(results, verdict["problem"])
        if index is not None:  # a run without a training step is not classified (never healthy)
            cls, sig, cap = per_run[index]
            session.record_classification(cls, sig)
            if cap is not None and hasattr(artifact, "keep"):
                artifact.keep(cap, version)  # its live objects, for a later Isolate
        if stop is not None:
            raise Interrupted(session) from None
        if probe_budget > 0 and index is not None:
            from .isolate import isolate

            recorded = session.state.classification
            reuse = first if first is not None and first.report is not None and \
                _same_classes(per_run[0][0], recorded) else None
            isolate(session, artifact, budget=probe_budget, stdout=stdout, probed=reuse,
                    seed=None if seed is None else seed + index,
                    intervene_seconds=intervene_seconds)
    return session.state.reproduction


def _same_classes(a, b) -> bool:
    """Whether two classifications share their primary category.

    The probes that explain it ran under the same question; secondaries may differ from run to
    run.
    """
    return a is not None and b is not None and a.primary == b.primary


def read_log(session: DebugSession, run: Run, path: str) -> Reproduction:
    """Reproduce from a minimal reproducer (a loss/metrics log): classify what it holds."""
    sig = compute(run)
    cls = classify(sig)
    res = _result_of(run, cls.primary)
    if res["status"] == "not_observed" and run.of("metric"):  # a log of metrics: judge them
        res.update(status="completed", category=cls.primary)
        res.pop("reason", None)
    session.record_reproduce(_verdict([res], [f"read {path}: {len(run.steps)} loss points"]))
    if res["category"] is not None:  # nothing to classify: the log holds no loss or metric
        session.record_classification(cls, sig)
    return session.state.reproduction
