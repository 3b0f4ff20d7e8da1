"""Rank 0's probes in a process the script spawned (called there once its capture ended).

A module of its own, cheap to import: the job's parent names :func:`probe_process` (a picklable
partial) before its script runs; what it needs is imported when it runs, in the rank.
"""

from __future__ import annotations

import json
import time


def probe_process(budget: float, probes: str | None, script: str, deadline: float | None,
                  rec) -> None:
    """Rank 0 of a job the script spawned: its probes on its live objects, after its capture.

    The findings go beside its record (``findings.json`` in the job's ranks folder), where the
    job's own probes merge them (:mod:`model_debugger._child`). Other ranks, and processes in
    no group, probe nothing. The budget ends before ``deadline`` (the run's time limit: these
    probes run inside the script's time). Never raises: a failed probe must not fail the rank.
    """
    import sys

    try:
        from .artifacts.base import ProbeRequest
        from .phases.isolate import probe_run
        from .probing import user_sources, write_findings
        from .records import Run
        from .store import Store

        info = next((e for e in reversed(rec.events) if e.get("t") == "rank"), None)
        if info is None or info.get("rank") != 0 or rec.keeper is None or not rec.path:
            return
        if deadline is not None:
            budget = min(budget, deadline - time.time() - 2.0)
        if budget < 1.0:
            return
        request = ProbeRequest(budget)
        if probes:
            with open(probes, encoding="utf-8") as fh:
                request = ProbeRequest.from_json({**json.load(fh), "budget": budget})
        run = Run.load(rec.path)
        report = probe_run(run, rec.keeper, user_sources(run, [script]), request)
        write_findings(Store.findings_beside(rec.path), report)
    except Exception:  # noqa: BLE001 - the rank's training is done; say so, do not fail it
        import traceback

        print("model_debugger: rank 0's probes failed:", file=sys.stderr)
        traceback.print_exc()
