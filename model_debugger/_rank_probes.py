"""A rank's probes in a process the script spawned or the launcher started, after its capture.

A module of its own, cheap to import: the job's parent names :func:`probe_process` (a picklable
partial) before its script runs; what it needs is imported when it runs, in the rank.

Probes that need live objects run on one rank: the rank the job's records name
(:func:`model_debugger.ranks.probed`: where the first non-finite value began, a straggler),
else rank 0. Rank 0, once its own record has ended, waits a little for the others' and writes
which rank probes; the others wait for that decision (:func:`probes_here`). Past the wait, or
with ranks on other nodes, rank 0 probes.
"""

from __future__ import annotations

import json
import os
import time

RANK_WAIT = 10.0  # seconds rank 0 waits for the job's other records to end before deciding
DECISION = "probed.rank"  # rank 0's decision, in the ranks folder: which rank probes


def probes_here(record: str, info: dict | None, wait: float = RANK_WAIT) -> bool:
    """Whether the rank that wrote ``record`` (its ``rank`` event ``info``) runs the probes.

    Rank 0 decides, once, for the job: it reads the records beside ``record`` (the job's
    ranks folder) until every rank's has ended, for at most ``wait`` seconds, names the rank
    they point at (itself past the wait) and writes that decision into the folder. Every
    other rank waits for the decision (at most ``3 * wait``) and probes only when named; with
    none, it does not. So exactly one rank probes whatever the order the ranks end in. When
    some ranks run on other nodes (their records are elsewhere), rank 0 probes at once.
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
    decision = os.path.join(folder, DECISION)
    if rank != 0:
        deadline = time.monotonic() + 3 * wait
        while time.monotonic() < deadline:
            named = read_decision(decision)
            if named is not None:
                return named == rank
            time.sleep(0.2)
        return False
    deadline = time.monotonic() + wait
    named = 0
    while True:
        ranks = read_ranks(folder)
        if complete(ranks):
            named = probed(ranks)
            break
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    tmp = f"{decision}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(str(int(named)))
    os.replace(tmp, decision)
    return named == 0


def read_decision(path: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


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
