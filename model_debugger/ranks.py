"""A multi-process job: its ranks' records, the per-rank table, and the signals across ranks.

A script that starts its ranks itself (``torch.multiprocessing.spawn``, a ``Process`` per rank)
or is launched through ``torch.distributed.run`` leaves one record per process beside the job's
own record (:meth:`~model_debugger.store.Store.ranks_beside`, written by
:class:`~model_debugger.capture.recorder.RankTarget` and the ``_child`` of each rank).
:func:`load_job` reads them into one :class:`~model_debugger.records.Run`: its events are those of
the representative rank (rank 0, or the rank that trained most), so every single-process signal,
rule and probe reads it unchanged, and ``run.ranks`` holds every rank's record for what only
several ranks show:

- a **straggler**: ranks train in lockstep, so one slow rank makes every step as slow on all of
  them; what differs is each rank's own work per step (data wait, forward, the loop's own code:
  everything but backward, where DDP's all-reduce waits, the optimizer step and the collectives
  the code calls). The straggler is the rank with the most; the others wait for it;
- the **first non-finite value**: the rank (and module) where it appeared first, ordered by step
  and then by where in the step (a loss before a gradient: an all-reduce spreads the gradient);
  it stands in the job's events for the representative's own (:func:`origin`);
- a **desync**: replicas that should be equal (DDP keeps them bit-equal) whose parameter
  checksums differ;
- a **hang**: ranks that ended waiting in a collective (its timeout raised, or it lasted at
  least :data:`HANG_SECONDS`) while another never reached it (it waited elsewhere, ended, or
  never wrote a record).

Every number is read from the records; nothing here imports torch.
"""

from __future__ import annotations

import os
import re
import time

import numpy as np

from .records import PLANNED_STOPS, Run, as_float
from .safe_write import read_inside
from .store import Store
from .thresholds import DESYNC_REL, STRAGGLER_MS, STRAGGLER_SHARE, UPDATES_APART

HANG_SECONDS = 30.0  # a wait this long at the end of a record, without an error, is a hang
NODE_WAIT = 30.0  # seconds a node waits for the other nodes' ranks of a job to end
MIN_RANK_STEPS = 5  # steps each rank needs before their timings are compared
WAITING = ("backward",)  # stall places that are inside a collective (besides named ones)
_STAGE = {"loss": 0, "grad": 1}  # where in a step a non-finite value was seen, in order


def _read_folder(root: str, folder: str) -> list[Run]:
    """The process records of one folder that trained or joined a group."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".jsonl"))
    except OSError:
        return []
    out = []
    for name in names:
        data = read_inside(root, os.path.join(folder, name))
        if data is None:
            continue
        run = Run.parse(data)
        infos = run.of("rank")
        run.rank = {k: v for k, v in infos[-1].items() if k not in ("t",)} if infos else None
        if run.rank is None and not run.steps:
            continue  # a helper process that neither trained nor joined a group
        out.append(run)
    return out


def _other_nodes(record: str, ranks: list[Run]) -> list[Run]:
    """The job's ranks that other nodes wrote under the same root (matched by job token)."""
    job = next(((r.rank or {}).get("job") for r in ranks if (r.rank or {}).get("job")), None)
    if job is None:
        return []
    have = {_rank(r) for r in ranks}
    out = []
    for root, folder in Store.job_ranks_elsewhere(record):
        for run in _read_folder(root, folder):
            if (run.rank or {}).get("job") == job and _rank(run) not in have:
                have.add(_rank(run))
                out.append(run)
    return out


def nodes_wait(launch: dict | None) -> float:
    """How long to wait for other nodes' ranks: :data:`NODE_WAIT` for a job on several nodes."""
    return NODE_WAIT if launch and int(launch.get("nnodes") or 1) > 1 else 0.0


def load_job(record: str, wait: float = 0.0) -> Run:
    """The record of a run, with the records of the processes it started (``run.ranks``).

    Without rank records (a single-process run) it is the record of ``record``. A process
    record is kept when it trained or joined a process group; records are read without
    following links, each untrusted like any record. When the ranks found here are fewer than
    the world size, the same run's folders of the other sessions under the same root are read
    for this job's other ranks (a job on several nodes, each writing its own session); ``wait``
    seconds are allowed for them to appear and end.
    """
    data = read_inside(os.path.dirname(os.path.abspath(record)), os.path.abspath(record))
    parent = Run.parse(data) if data is not None else Run([])
    infos = parent.of("rank")
    parent.rank = {k: v for k, v in infos[-1].items() if k != "t"} if infos else None
    folder = Store.ranks_beside(record)
    ranks = _read_folder(os.path.dirname(folder), folder)
    if not ranks:
        return parent
    mine = [parent] if parent.rank is not None or parent.steps else []  # it trained too
    deadline = time.monotonic() + wait
    local = mine + ranks
    while True:
        ranks = local + _other_nodes(record, local)
        if complete(ranks) or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
        local = mine + _read_folder(os.path.dirname(folder), folder)
    ranks.sort(key=_order)
    rep = representative(ranks, parent)
    events = _with_origin(rep, ranks)
    if torn_down(rep):  # its training and output were done: the teardown is no crash
        events.append({"t": "end", "status": "ok", "torn_down": True,
                       "steps": len(rep.steps)})
    if rep.error is None:  # another rank's crash is the job's
        failed = next((r for r in ranks if r.error is not None and
                       r.error.get("kind") not in ("interrupted",)), None)
        if failed is not None:
            at = next((i for i, e in enumerate(events) if e.get("t") == "end"), len(events))
            events.insert(at, {**failed.error, "rank": _rank(failed)})
    job = Run(events, parent.bad_lines + sum(r.bad_lines for r in ranks), rep.truncated)
    job.ranks = ranks
    job.rank = rep.rank
    return job


def _with_origin(rep: Run, ranks: list[Run]) -> list[dict]:
    """The representative's events, its first ``nonfinite`` event the job's first one.

    An all-reduce copies one rank's non-finite gradient to every rank: the representative may
    see it only as a gradient, one step after another rank's loss. The first non-finite value of
    the job (:func:`origin`) takes the place of the representative's, with its ``rank``, so the
    single-process signals and probes read where it began.
    """
    first = origin(ranks)
    events = list(rep.events)
    if first is None:
        return events
    run, event = first
    at = next((i for i, e in enumerate(events) if e.get("t") == "nonfinite"), None)
    moved = {**event, "rank": _rank(run)}
    if at is None:
        end = next((i for i, e in enumerate(events) if e.get("t") == "end"), len(events))
        events.insert(end, moved)
    else:
        events[at] = moved
    return events


def origin(ranks: list[Run]) -> tuple[Run, dict] | None:
    """The rank and ``nonfinite`` event of the job's first non-finite value (None: none).

    Ordered by step, then by where in the step (a loss before a gradient: the all-reduce
    spreads a gradient), then by rank.
    """
    seen = []
    for r in ranks:
        e = r.first("nonfinite")
        if e is not None and isinstance(e.get("step"), int):
            rank = _rank(r)
            seen.append(((e["step"], _STAGE.get(e.get("what"), 2),
                          rank if rank is not None else 1 << 30), r, e))
    if not seen:
        return None
    _, run, event = min(seen, key=lambda t: t[0])
    return run, event


def _rank(run: Run) -> int | None:
    rank = (run.rank or {}).get("rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def _order(run: Run) -> tuple:
    rank = _rank(run)
    start = run.first("start") or {}
    return (rank is None, rank if rank is not None else 0, start.get("pid") or 0)


def representative(ranks: list[Run], parent: Run | None = None) -> Run:
    """Rank 0 when it trained, else the job's own process when it trained, else the most steps."""
    zero = next((r for r in ranks if _rank(r) == 0 and r.steps), None)
    if zero is not None:
        return zero
    if parent is not None and parent.steps and any(r is parent for r in ranks):
        return parent
    return max(ranks, key=lambda r: len(r.steps))


def label(run: Run) -> str:
    """``rank 1`` (or ``pid 123`` for a process outside any group)."""
    rank = _rank(run)
    return f"rank {rank}" if rank is not None else f"pid {(run.first('start') or {}).get('pid')}"


# -- per-rank numbers ------------------------------------------------------------------------

def _median(values) -> float | None:
    a = np.array([as_float(v) for v in values], dtype=float)
    a = a[np.isfinite(a)]
    return float(np.median(a)) if len(a) else None


def _timed(run: Run) -> list[dict]:
    """The steps with a step time, the first one (start-up) left out."""
    return [s for s in run.steps[1:] if isinstance(s.get("dt"), (int, float))]


def own_work(run: Run) -> float | None:
    """Median seconds per step a rank spends on its own: all but backward, step, collectives.

    ``dt - (bz - fw) - co``: the step time less the backward and optimizer step (``bz`` is
    forward, backward and step; ``fw`` the forward) and the collectives the code called.
    """
    rows = [s for s in _timed(run) if "fw" in s]
    return _median([s["dt"] - max(0.0, (s.get("bz") or 0.0) - s["fw"]) - (s.get("co") or 0.0)
                    for s in rows])


def _sync_work(run: Run) -> float | None:
    """Median seconds per step in backward and the optimizer step (where DDP waits)."""
    rows = [s for s in _timed(run) if "fw" in s]
    return _median([max(0.0, (s.get("bz") or 0.0) - s["fw"]) for s in rows])


def torn_down(run: Run) -> bool:
    """A rank that died inside ``destroy_process_group`` after all its work, with no error.

    torch 2.13's gloo sometimes aborts a rank there (SIGABRT); its record has no ``end``
    event, but a ``group_destroyed`` after its last step.
    """
    if run.ended or run.error is not None:
        return False
    done = run.of("group_destroyed")
    return bool(done) and done[-1].get("step") == len(run.steps)


def _status(run: Run) -> str:
    err = run.error
    if err is not None:
        return "stopped" if err.get("type") in PLANNED_STOPS else err.get("kind", "error")
    if torn_down(run):
        return "ok (died in destroy_process_group)"
    return "ok" if run.ended else "killed"


def last_collective(run: Run) -> dict | None:
    """Where a rank's record ends: the last collective it called, where it last waited.

    ``where`` is the collective it was inside (``all_reduce#12``: the 12th it called) or the
    place its last stall was seen (``backward``, where DDP's all-reduce waits; ``loop``,
    ``data``, ``forward``) when that stall was at its last step; ``waiting`` says whether it
    ended waiting for the other ranks (:func:`waiting_at_end`).
    """
    end = (run.of("collectives") or [None])[-1]
    stall = (run.of("stall") or [None])[-1]
    if end is None and stall is None:
        return None
    step = len(run.steps)
    where = None
    if end is not None and end.get("waiting") and end.get("last"):
        where = f"{end['last']}#{end.get('entered')}"
    elif stall is not None and stall.get("step") == step:
        where = stall.get("where")
    return {"where": where, "last_called": (end or {}).get("last"),
            "collectives": (end or stall).get("entered", (stall or {}).get("collectives")),
            "step": step, "waiting": waiting_at_end(run)}


def table(run: Run) -> list[dict]:
    """One row per rank: steps, step time, data wait, blocked, peak memory, loss, grad norm."""
    ranks = run.ranks
    sync = [v for v in (_sync_work(r) for r in ranks) if v is not None]
    floor = min(sync) if sync else None
    rows = []
    for r in ranks:
        info = r.rank or {}
        timed = _timed(r)
        co = _median([s.get("co") or 0.0 for s in timed if "fw" in s])
        mine = _sync_work(r)
        blocked = None
        if co is not None and mine is not None and floor is not None:
            blocked = co + max(0.0, mine - floor)
        loss = [as_float(s.get("loss")) for s in r.steps]
        gn = [as_float(s.get("gn")) for s in r.steps if "gn" in s]
        rss = [s["rss"] for s in r.steps if isinstance(s.get("rss"), (int, float))]
        first = r.first("nonfinite")
        rows.append({
            "rank": _rank(r), "world_size": info.get("world_size"),
            "local_rank": info.get("local_rank"), "node_rank": info.get("node_rank"),
            "backend": info.get("backend"), "host": info.get("host"),
            "pid": (r.first("start") or {}).get("pid"), "status": _status(r),
            "steps": len(r.steps),
            "step_ms": _ms(_median([s["dt"] for s in timed])),
            "data_wait_ms": _ms(_median([s.get("dw") or 0.0 for s in timed])),
            "own_ms": _ms(own_work(r)),
            "blocked_ms": _ms(blocked),
            "peak_rss_mb": round(max(rss) / 2 ** 20, 1) if rss else None,
            "loss_final": _round(loss[-1]) if loss else None,
            "grad_norm_final": _round(gn[-1]) if gn else None,
            "first_nonfinite": None if first is None else {
                "step": first.get("step"), "what": first.get("what"),
                "module": first.get("module")},
            "last_collective": last_collective(r),
        })
    return rows


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def _round(v: float) -> float | str:
    return float(f"{v:.6g}") if np.isfinite(v) else str(v)


# -- signals ---------------------------------------------------------------------------------

def signals(run: Run) -> dict:
    """The signals only several ranks show (empty for a single-process run)."""
    ranks = run.ranks
    if not ranks:
        return {}
    worlds = [(r.rank or {}).get("world_size") for r in ranks]
    worlds = [w for w in worlds if isinstance(w, int)]
    out: dict = {"ranks": max(worlds) if worlds else len(ranks), "ranks_seen": len(ranks)}
    out.update(_straggler(ranks))
    out.update(_nonfinite_origin(ranks))
    out.update(_desync(ranks))
    out.update(_updates(ranks))
    out.update(_hang(ranks, out["ranks"]))
    return out


def _straggler(ranks: list[Run]) -> dict:
    timed = [(r, own_work(r), _median([s["dt"] for s in _timed(r)])) for r in ranks
             if len([s for s in _timed(r) if "fw" in s]) >= MIN_RANK_STEPS]
    timed = [(r, own, dt) for r, own, dt in timed if own is not None and dt]
    if len(timed) < 2:
        return {}
    slow = max(timed, key=lambda t: t[1])
    others = [own for r, own, _ in timed if r is not slow[0]]
    lag = slow[1] - float(np.median(others))
    step = float(np.median([dt for _, _, dt in timed]))
    return {"rank_straggler": _rank(slow[0]), "rank_straggler_ms": round(lag * 1000, 3),
            "rank_straggler_share": round(max(0.0, lag) / step, 4) if step > 0 else 0.0}


def is_straggler(sig: dict) -> bool:
    """Whether the straggler signals pass their thresholds (the rule and the probe agree)."""
    return sig.get("rank_straggler_share", 0.0) >= STRAGGLER_SHARE and \
        sig.get("rank_straggler_ms", 0.0) >= STRAGGLER_MS


def probed(ranks: list[Run]) -> int:
    """The rank whose live objects the probes read, decided from every rank's record.

    The rank where the job's first non-finite value began (one rank, not a tie), else the
    straggler (when it passes its thresholds), else rank 0: what went wrong on one rank is
    measured on that rank's model and batches, not on a replica that only received it.
    """
    first = _nonfinite_origin(ranks).get("nonfinite_rank")
    if isinstance(first, int):
        return first
    slow = _straggler(ranks)
    if is_straggler(slow) and isinstance(slow.get("rank_straggler"), int):
        return slow["rank_straggler"]
    return 0


def complete(ranks: list[Run]) -> bool:
    """Whether every rank of the job wrote a record that ended (or died in the teardown)."""
    worlds = [w for w in ((r.rank or {}).get("world_size") for r in ranks) if isinstance(w, int)]
    world = max(worlds, default=len(ranks))
    return len({_rank(r) for r in ranks}) >= world and \
        all(r.ended or r.error or torn_down(r) for r in ranks)


def read_ranks(folder: str) -> list[Run]:
    """The process records in one ranks folder (see :func:`load_job`)."""
    return _read_folder(os.path.dirname(folder), folder)


def _nonfinite_origin(ranks: list[Run]) -> dict:
    first = origin(ranks)
    if first is None:
        return {}
    run, e = first
    key = (e["step"], _STAGE.get(e.get("what"), 2))
    tied = [r for r in ranks if (r.first("nonfinite") or {}).get("step") == key[0] and
            _STAGE.get(r.first("nonfinite").get("what"), 2) == key[1]]
    out = {"nonfinite_rank_step": e["step"],
           "nonfinite_ranks": sum(r.first("nonfinite") is not None for r in ranks)}
    if len(tied) > 1:  # at the same step, in the same place, on several ranks: no one rank's
        out["nonfinite_rank_tie"] = ", ".join(str(_rank(r)) for r in tied)
        return out
    out["nonfinite_rank"] = _rank(run)
    if e.get("module"):
        out["nonfinite_rank_module"] = str(e["module"])
    return out


def _desync(ranks: list[Run]) -> dict:
    """Checksums compared at each step, among ranks that hold the same number of values.

    Ranks holding different parameter sets (pipeline stages) are no replicas of each other:
    only the ranks with the most common count are compared.
    """
    sizes = [s.get("pn") for r in ranks for s in r.steps if "pcs" in s]
    common_size = max(set(sizes), key=sizes.count) if sizes else None
    by_step: dict[int, dict] = {}
    for r in ranks:
        for s in r.steps:
            v = as_float(s.get("pcs"))
            if "pcs" in s and np.isfinite(v) and s.get("pn") == common_size:
                by_step.setdefault(s.get("i"), {})[_rank(r)] = v
    common = sorted(i for i, vals in by_step.items() if len(vals) >= 2 and isinstance(i, int))
    if not common:
        return {}
    spreads = []
    first = None
    for i in common:
        vals = np.array(list(by_step[i].values()))
        spread = float((vals.max() - vals.min()) / max(float(np.median(np.abs(vals))), 1e-12))
        spreads.append(spread)
        if first is None and spread > DESYNC_REL:
            first = i
    out = {"rank_desync": max(spreads), "rank_checksums": len(common)}
    start = [as_float(e.get("pcs")) for r in ranks for e in r.of("checksum0")[:1]
             if e.get("pn") == common_size]
    start = np.array([v for v in start if np.isfinite(v)])
    if len(start) >= 2:  # before the first update
        out["rank_desync_start"] = float((start.max() - start.min()) / max(
            float(np.median(np.abs(start))), 1e-12))
    if first is not None:
        vals = by_step[first]
        ref = vals.get(0, np.median(list(vals.values())))
        out["rank_desync_step"] = first
        out["rank_desync_ranks"] = sorted(
            k for k, v in vals.items() if k is not None and
            abs(v - ref) > DESYNC_REL * max(abs(ref), 1e-12))
    return out


def batches(run: Run) -> int | None:
    """Batches per epoch of the rank's training DataLoader (None: not a sized DataLoader)."""
    ref = next((e for e in run.of("ref") if e.get("kind") == "loader"), None)
    n = (ref or {}).get("batches")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def _fewest(values: dict) -> list[int]:
    """The ranks with the smallest value, when the values differ (else [])."""
    known = {k: v for k, v in values.items() if v is not None and k is not None}
    if len(set(known.values())) < 2:
        return []
    low = min(known.values())
    return sorted(k for k, v in known.items() if v == low)


def _mismatched(waiting: list[Run]) -> list[int]:
    """Of ranks that all ended waiting: those in another collective than the rest (or []).

    The ranks that made fewer steps, else those with fewer batches per epoch (they left the
    loop first), else those whose place differs from most ranks'.
    """
    astray = _fewest({_rank(r): len(r.steps) for r in waiting}) or \
        _fewest({_rank(r): batches(r) for r in waiting})
    if astray:
        return astray
    places = {_rank(r): str((last_collective(r) or {}).get("where")) for r in waiting}
    counts = {p: list(places.values()).count(p) for p in places.values()}
    if len(counts) < 2:
        return []  # all in the same place: waiting on something outside the job
    common = max(counts, key=counts.get)
    if list(counts.values()).count(counts[common]) > 1:
        return []  # no majority place: which rank went astray cannot be told
    return sorted(k for k, p in places.items() if p != common and k is not None)


def waited_at_end(run: Run) -> float | None:
    """Seconds a rank had been waiting for the others when its record ended (None: it was not).

    Waiting is being inside a collective, or inside ``backward`` (DDP's all-reduce) at the
    step its record ends on; the seconds are the longest its ``stall`` events or its
    ``collectives`` event saw.
    """
    end = (run.of("collectives") or [None])[-1]
    stall = (run.of("stall") or [None])[-1]
    step = len(run.steps)
    inside = bool(end and end.get("waiting"))
    waited = [as_float((end or {}).get("since_step"))] if inside else []
    if stall is not None and stall.get("step") == step:
        where = str(stall.get("where"))
        if "#" in where or where in WAITING:
            inside = True
            waited += [as_float(stall.get("seconds")),
                       as_float((end or {}).get("since_step"))]
    if not inside:
        return None
    waited = [v for v in waited if np.isfinite(v)]
    return max(waited) if waited else 0.0


def _updates(ranks: list[Run]) -> dict:
    """How far apart the ranks' optimizer step counts are: ``1 - fewest / most``.

    Data-parallel ranks step together; a rank that steps less often (or never: an update behind
    a rank condition) trains another model. Recorded when two ranks counted their steps.
    """
    counts = {_rank(r): (r.first("calls") or {}).get("optimizer_steps") for r in ranks}
    counts = {k: v for k, v in counts.items() if isinstance(v, int) and k is not None}
    if len(counts) < 2 or max(counts.values()) == 0:
        return {}
    out = {"rank_updates_apart": round(1 - min(counts.values()) / max(counts.values()), 4)}
    if out["rank_updates_apart"] >= UPDATES_APART:
        out["rank_updates"] = ", ".join(f"rank {k}: {v}" for k, v in sorted(counts.items()))
    return out


def waiting_at_end(run: Run) -> bool:
    """Whether a rank ended waiting for a rank that never came.

    A collective that raised (its timeout, a peer gone); a wait that ended in an error (a
    timeout raised inside DDP's backward); or a wait of at least :data:`HANG_SECONDS` when the
    record ended otherwise (stopped at the time limit, killed). A shorter wait cut short by a
    stop is a rank waiting for a slow one (an evaluation on rank 0), not a hang.
    """
    if run.of("collective_error") or comm_failed(run):
        return True
    waited = waited_at_end(run)
    if waited is None:
        return False
    err = run.error or {}
    failed = err.get("kind") == "exception" and err.get("type") not in PLANNED_STOPS
    return failed or waited >= HANG_SECONDS


# what torch.distributed raises when a collective cannot complete: a peer gone, a timeout
_COMM = re.compile(r"gloo|nccl|ProcessGroup|c10d|Connection (closed|reset)|closed by peer|"
                   r"Timed out|timed out|Broken pipe", re.IGNORECASE)


def comm_failed(run: Run) -> bool:
    """Whether the rank ended in an error of the communication itself.

    A collective (DDP's all-reduce inside ``backward``, a barrier) that could not complete: its
    peer left the job (``Connection closed by peer``) or never came (``Timed out``).
    """
    err = run.error or {}
    return err.get("kind") == "exception" and bool(_COMM.search(str(err.get("message", ""))))


def _hang(ranks: list[Run], world: int) -> dict:
    """Ranks that ended waiting for a rank that never came, and the ranks that did not come.

    The missing ranks are those not waiting (they waited elsewhere, ended, or wrote no record).
    When every rank ended waiting, they waited in different collectives (a mismatch): the
    missing ones are those that made fewer steps, else those whose place differs from most
    ranks'.
    """
    waiting = [r for r in ranks if waiting_at_end(r)]
    if not waiting:
        return {"rank_hang": 0.0}
    seen = {_rank(r) for r in ranks}
    absent = [k for k in range(world) if k not in seen]
    missing = sorted([_rank(r) for r in ranks if r not in waiting and _rank(r) is not None]
                     + absent)
    if not missing:
        missing = _mismatched(waiting)
        waiting = [r for r in waiting if _rank(r) not in missing]
    if not missing or not waiting:
        return {"rank_hang": 0.0}
    seconds = [as_float(e.get("seconds")) for r in waiting for e in r.of("collective_error")]
    seconds += [waited_at_end(r) or 0.0 for r in waiting]
    seconds = [v for v in seconds if np.isfinite(v)]
    return {"rank_hang": 1.0, "rank_hang_missing": missing,
            "rank_hang_waiting": sorted(k for k in (_rank(r) for r in waiting) if k is not None),
            "rank_hang_seconds": round(max(seconds), 3) if seconds else None}
