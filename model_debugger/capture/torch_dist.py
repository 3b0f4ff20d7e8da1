"""torch.distributed (mixed into ``TorchInstrument``): the rank, its collectives, its replica.

Nothing here runs until a process group exists. Then:

- ``init_process_group`` (patched) records a ``rank`` event: rank, world size, backend, local
  rank and node rank (``LOCAL_RANK``/``GROUP_RANK`` from the launcher, when set), host, and
  ``job``, a token rank 0 shares through the group's store (records of one job on several
  nodes are matched by it); with
  ``MODEL_DEBUGGER_COLLECTIVE_TIMEOUT`` set (``--collective-timeout``) the group's timeout is
  at most that many seconds, so a rank that never joins ends the job instead of hanging it;
- every collective of ``torch.distributed`` the code calls (``all_reduce``, ``barrier``, ...)
  is timed: the step rows of a multi-rank job gain ``co`` (seconds inside those calls),
  ``cn`` (collectives entered so far) and ``fw`` (seconds inside the model's forward, which
  holds no collective: the rank's own work, comparable across ranks), and every
  :data:`CHECKSUM_EVERY` steps ``pcs``, a float64 checksum of the optimizer's parameters (the
  model's, on a rank whose optimizer never stepped), and ``pn``, how many values it covers
  (replicas that train in lockstep hold the same; sharded parameters, FSDP or DTensor, are not
  summed); ``checksum0`` holds the same before the first update (did the ranks start equal?);
- a collective that raises (a timeout, a peer gone) is a ``collective_error`` event; a training
  thread that has not finished a step for :data:`STALL_SECONDS` is a ``stall`` event (written
  again each time the wait doubles, so its ``seconds`` tell how long it lasted) saying
  where it waits (inside which collective, ``backward`` where DDP's all-reduce runs, ``forward``,
  ``data`` or the loop's own code) and on which line of the user's code, written by the
  recorder's flusher thread while it waits;
  when the capture ends, a ``collectives`` event holds the last collective reached;
- ``destroy_process_group`` (patched) writes ``group_destroyed`` first: with torch 2.13's gloo
  a rank sometimes aborts (SIGABRT) inside it after all its work is done, and its record then
  says so instead of reading as a crash.

DDP's own all-reduce runs inside ``backward()`` in C++ and is not a Python call: its waiting
shows as backward time, compared across ranks by the rank analysis (:mod:`model_debugger.ranks`).
"""

from __future__ import annotations

import math
import os
import socket
import sys
import threading
import time

from .codeloc import user_location

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
               "all_to_all", "all_to_all_single", "barrier", "monitored_barrier", "broadcast",
               "broadcast_object_list", "gather", "gather_object", "reduce", "reduce_scatter",
               "reduce_scatter_tensor", "scatter", "scatter_object_list", "send", "recv")
CHECKSUM_EVERY = 10  # optimizer steps between replica checksums (and the first step)
STALL_SECONDS = 2.0  # no step for this long: where the training thread waits is recorded
TIMEOUT_ENV = "MODEL_DEBUGGER_COLLECTIVE_TIMEOUT"


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


class DistHooks:
    """The rank of a process group, its collectives and a checksum of its replica."""

    def _init_dist_state(self) -> None:
        self._dist: dict | None = None  # the ``rank`` event's fields, once a group exists
        self._multi = False  # a group of more than one rank: rows carry the extra fields
        # [entered, finished, name of the last, perf_counter when it was entered, depth]
        self._coll = [0, 0, None, 0.0, 0]
        self._coll_s = 0.0  # seconds inside collectives since the last step
        self._fw_s = 0.0  # seconds inside the model's training forward since the last step
        self._fw_t0 = 0.0
        self._stalled_at = None  # (step, seconds) of the last ``stall`` event written
        self._group_t0 = 0.0  # perf_counter when the group was seen
        self._train_thread = None  # the thread that made the group (where training runs)
        self._checked_start = False  # ``checksum0`` was taken

    def _attach_dist(self) -> None:
        """Patch ``init_process_group`` and the collectives (when torch.distributed exists)."""
        try:
            import torch.distributed as dist
        except ImportError:  # a build without distributed support
            return
        if not dist.is_available():
            return
        self.patch(dist, "init_process_group", self._wrap_init)
        self.patch(dist, "destroy_process_group", self._wrap_destroy)
        for name in COLLECTIVES:
            if hasattr(dist, name):
                self.patch(dist, name, lambda nxt, name=name: self._wrap_collective(nxt, name))
        self.rec.before_event(self._dist_drain)
        if dist.is_initialized():  # the group was made before this capture began
            self._guarded_on_group()

    # -- the group -------------------------------------------------------------------------
    def _wrap_init(self, original):
        link = self._link

        def init_process_group(*args, **kwargs):
            seconds = os.environ.get(TIMEOUT_ENV)
            if seconds and link() is not None:
                args, kwargs = _with_timeout(original, args, kwargs, float(seconds))
            out = original(*args, **kwargs)
            inst = link()
            if inst is not None:
                inst._guarded_on_group()
            return out

        init_process_group.__wrapped__ = original
        return init_process_group

    def _wrap_destroy(self, original):
        link = self._link

        def destroy_process_group(*args, **kwargs):
            inst = link()
            if inst is not None and inst._dist is not None:
                inst._guarded_destroyed()
            return original(*args, **kwargs)

        destroy_process_group.__wrapped__ = original
        return destroy_process_group

    def _guarded_destroyed(self) -> None:
        self.guard(self._destroyed)()

    def _destroyed(self) -> None:
        """``group_destroyed``, on disk before the call: gloo may abort the process inside it."""
        self._drain()
        self.rec.emit("group_destroyed", step=self.rec.step)

    def _guarded_on_group(self) -> None:
        self.guard(self._on_group)()

    def _on_group(self) -> None:
        import torch.distributed as dist

        world = int(dist.get_world_size())
        self._dist = {"rank": int(dist.get_rank()), "world_size": world, "job": _job_token(dist),
                      "backend": str(dist.get_backend()),
                      "local_rank": _env_int("LOCAL_RANK"), "node_rank": _env_int("GROUP_RANK"),
                      "host": socket.gethostname()[:100]}
        self._multi = world > 1
        self._group_t0 = time.perf_counter()
        self._train_thread = threading.get_ident()
        self.rec.emit("rank", step=self.rec.step, **self._dist)

    # -- collectives -----------------------------------------------------------------------
    def _wrap_collective(self, original, name: str):
        link = self._link

        def collective(*args, **kwargs):
            inst = link()
            if inst is None or inst._coll[4]:  # not ours, or a collective inside another
                return original(*args, **kwargs)
            coll = inst._coll
            coll[0] += 1
            coll[2] = name
            coll[4] = 1
            t0 = coll[3] = time.perf_counter()
            try:
                return original(*args, **kwargs)
            except Exception as exc:
                inst._guarded_coll_error(name, coll[0], time.perf_counter() - t0, exc)
                raise
            finally:
                coll[1] = coll[0]
                coll[4] = 0
                if not inst._busy_depth:  # (one inside backward, SyncBatchNorm's, is in bz)
                    inst._coll_s += time.perf_counter() - t0

        collective.__wrapped__ = original
        collective.__name__ = name
        return collective

    def _guarded_coll_error(self, name, seq, seconds, exc) -> None:
        self.guard(self._coll_error)(name, seq, seconds, exc)

    def _coll_error(self, name, seq, seconds, exc) -> None:
        self.rec.emit("collective_error", name=name, seq=seq, step=self.rec.step,
                      seconds=round(seconds, 3), error=f"{type(exc).__name__}: {exc}"[:500])

    # -- per step --------------------------------------------------------------------------
    def _forward_started(self) -> None:
        self._fw_t0 = time.perf_counter()

    def _forward_ended(self) -> None:
        self._fw_s += time.perf_counter() - self._fw_t0

    def _dist_fields(self, opt) -> dict | None:
        """The extra fields of this step's row (None outside a multi-rank group)."""
        if not self._multi:
            self._coll_s = self._fw_s = 0.0
            return None
        out = {"co": self._coll_s, "fw": self._fw_s, "cn": self._coll[0]}
        self._coll_s = self._fw_s = 0.0
        if self.rec.step % CHECKSUM_EVERY == 0:
            summed = _checksum(self._replica(opt))
            if summed is not None:
                out["pcs"], out["pn"] = summed
        return out

    def _replica(self, opt) -> list:
        """The parameters a replica checksum covers: the optimizer's, else the model's.

        (A rank whose optimizer never steps still has a model: its checksum shows it apart.)
        """
        if opt is not None:
            return [p for g in opt.param_groups for p in g["params"]]
        root = self._root() if self._root else None
        return list(root.parameters()) if root is not None else []

    def _before_first_update(self, opt) -> None:
        """``checksum0``: the replica before any update (did the ranks start equal?)."""
        if self._multi and not self._opt_steps and not self._checked_start:
            self._checked_start = True
            summed = _checksum(self._replica(opt))
            if summed is not None:
                self.rec.emit("checksum0", pcs=summed[0], pn=summed[1])

    # -- where a rank waits ----------------------------------------------------------------
    def _waiting_in(self) -> str:
        coll = self._coll
        if coll[4]:
            return f"{coll[2]}#{coll[0]}"
        if self._in_backward:
            return "backward"
        if self._fwd_open:
            return "forward"
        if self._in_data:
            return "data"
        return "loop"

    def _dist_drain(self) -> None:
        """Record a ``stall`` when no step came for :data:`STALL_SECONDS`.

        Called before every event, and by the flusher thread while the training thread stands
        still.
        """
        if not self._multi:
            return
        last = self._last_step_end
        now = time.perf_counter()
        since = now - (last if last is not None else self._group_t0)
        due = STALL_SECONDS
        if self._stalled_at is not None and self._stalled_at[0] == self.rec.step:
            due = 2 * self._stalled_at[1]  # the same wait, written again each time it doubles
        if since < due:
            return
        self._stalled_at = (self.rec.step, since)
        frame = sys._current_frames().get(self._train_thread)
        self.rec.emit("stall", step=self.rec.step, where=self._waiting_in(),
                      seconds=round(since, 3), collectives=self._coll[0],
                      location=user_location(frame) if frame is not None else None)

    def _dist_finish(self) -> None:
        """The last collective this rank reached, when the capture ends."""
        if self._dist is None:
            return
        coll = self._coll
        last = self._last_step_end
        since = time.perf_counter() - (last if last is not None else self._group_t0)
        self.rec.emit("collectives", entered=coll[0], finished=coll[1], last=coll[2],
                      step=self.rec.step, waiting=bool(coll[4]),
                      since_step=round(since, 3))


def _with_timeout(original, args: tuple, kwargs: dict, seconds: float) -> tuple:
    """``init_process_group``'s arguments with its timeout at most ``seconds``.

    The user's timeout is kept when shorter, whether passed by name or by position.
    """
    import datetime
    import inspect

    limit = datetime.timedelta(seconds=seconds)
    try:
        bound = inspect.signature(original).bind_partial(*args, **kwargs)
    except (TypeError, ValueError):  # let the call itself report its own error
        return args, kwargs
    asked = bound.arguments.get("timeout")
    bound.arguments["timeout"] = limit if asked is None else min(asked, limit)
    return bound.args, bound.kwargs


JOB_KEY = "model_debugger/job"


def _job_token(dist) -> str | None:
    """One random token per job, the same on every rank: rank 0's, through the group's store.

    Records of one job written on several nodes are told apart from other jobs' by it. The
    store (the rendezvous' key-value store) is no collective: nothing runs on the device.
    """
    if dist.get_world_size() < 2:
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
        if dist.get_rank() == 0:
            import secrets

            store.set(JOB_KEY, secrets.token_hex(8))
        return store.get(JOB_KEY).decode("ascii", "replace")[:32]
    except Exception:  # noqa: BLE001 - no store (a custom group): records are still per rank
        return None


def _sharded(p) -> bool:
    """A parameter that holds a shard (FSDP, DTensor): replicas differ by design."""
    return type(p).__name__ in ("DTensor", "FlatParameter") or \
        getattr(p, "_is_flat_param", False) or hasattr(p, "_local_tensor")


def _checksum(params: list) -> tuple[float, int] | None:
    """A float64 checksum of parameters (sum of values plus sum of squares).

    And how many values it covers. Summed on each parameter's device, read once per device.
    None when a parameter is a shard (FSDP, tensor parallel: the ranks hold different parts)
    or on the meta device, or when the sum is not finite.
    """
    import torch

    sums: dict = {}
    count = 0
    if not params:
        return None
    with torch.no_grad():
        for p in params:
            if getattr(p, "is_meta", False) or _sharded(p):
                return None
            d = p.detach()
            count += d.numel()
            part = d.sum(dtype=torch.float64) + torch.linalg.vector_norm(
                d, dtype=torch.float64) ** 2
            sums[d.device] = sums.get(d.device, 0) + part
    total = sum(float(v) for v in sums.values())
    return (total, count) if math.isfinite(total) else None
