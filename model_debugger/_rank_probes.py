"""A rank's probes in a process the script spawned or the launcher started, after its capture.

A module of its own, cheap to import: the job's parent names :func:`probe_process` (a picklable
partial) before its script runs; what it needs is imported when it runs, in the rank.

Probes that need live objects run on one rank: the rank the job's records name
(:func:`model_debugger.ranks.probed`: where the first non-finite value began, a straggler),
else rank 0. Each rank, once its own record has ended, waits a little for the others'
(:func:`probes_here`) and probes only when it is the named one; a rank that cannot tell (a
record missing past the wait, ranks on other nodes) leaves it to rank 0.
"""

from __future__ import annotations

import json
import os
import time

RANK_WAIT = 10.0  # seconds a rank waits for the job's other records to end before deciding


def probes_here(record: str, info: dict | None, wait: float = RANK_WAIT) -> bool:
    """Whether the rank that wrote ``record`` (its ``rank`` event ``info``) runs the probes.

    The records beside ``record`` (the job's ranks folder) are read until every rank's has
    ended, for at most ``wait`` seconds; then the rank they name probes. Past the wait, or
    when some ranks run on other nodes (their records are elsewhere), rank 0 does.
    """
    from .ranks import complete, probed, read_ranks

    rank = (info or {}).get("rank")
    if not isinstance(rank, int):
        return False
    world = (info or {}).get("world_size")
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if isinstance(world, int) and local and local.isdigit() and int(local) < world:
        return rank == 0  # several nodes: the named rank may be on another one
    folder = os.path.dirname(os.path.abspath(record))
    deadline = time.monotonic() + wait
    while True:
        ranks = read_ranks(folder)
        if complete(ranks):
            return probed(ranks) == rank
        if time.monotonic() >= deadline:
            return rank == 0
        time.sleep(0.2)


def probe_process(budget: float, probes: str | None, script: str, deadline: float | None,
                  rec) -> None:
    """One rank of a job the script spawned: its probes on its live objects, after its capture.

    Only the rank :func:`probes_here` names probes. The findings go beside its record
    (:meth:`~model_debugger.store.Store.rank_findings` in the job's ranks folder), where the
    job's own probes merge them (:mod:`model_debugger._child`). Processes in no group probe
    nothing. The budget ends before ``deadline`` (the run's time limit: these probes run
    inside the script's time). Never raises: a failed probe must not fail the rank.
    """
    import sys

    try:
        info = next((e for e in reversed(rec.events) if e.get("t") == "rank"), None)
        if info is None or rec.keeper is None or not rec.path:
            return
        wait = RANK_WAIT if deadline is None else min(RANK_WAIT, deadline - time.time() - 3.0)
        if not probes_here(rec.path, info, max(0.0, wait)):
            return
        run_probes(rec.path, rec.keeper, info["rank"], budget, probes, script, deadline)
    except Exception:  # noqa: BLE001 - the rank's training is done; say so, do not fail it
        import traceback

        print("model_debugger: a rank's probes failed:", file=sys.stderr)
        traceback.print_exc()


def run_probes(record: str, keeper, rank: int, budget: float, probes: str | None,
               script: str, deadline: float | None = None) -> None:
    """The probes on one rank's live objects (``keeper``), under its own record's verdict.

    Written to the job's ranks folder as that rank's report; nothing when under a second of
    the budget is left before ``deadline``.
    """
    from .artifacts.base import ProbeRequest
    from .phases.isolate import probe_run
    from .probing import user_sources, write_findings
    from .records import Run
    from .store import Store

    if deadline is not None:
        budget = min(budget, deadline - time.time() - 2.0)
    if budget < 1.0:
        return
    request = ProbeRequest(budget)
    if probes:
        with open(probes, encoding="utf-8") as fh:
            request = ProbeRequest.from_json({**json.load(fh), "budget": budget})
    run = Run.load(record)
    report = probe_run(run, keeper, user_sources(run, [script]), request)
    folder = os.path.dirname(os.path.abspath(record))
    write_findings(Store.rank_findings(folder, rank), report)
