"""Step rows of the PyTorch instrument (mixed into ``TorchInstrument``): timing, memory, writing.

Each training step (an optimizer step, or a ``backward()`` in a loop without an optimizer) is
kept as a row of numbers and written as a ``step`` event in batches (:meth:`StepRows._drain`):

- ``i``, ``ep``, ``loss``, ``dt`` (seconds since the last step ended), ``dw`` (of which waiting
  for data), ``bz`` (of which inside forward, backward and the optimizer step: the rest is the
  loop's own time), ``tm`` (the model's training flag);
- ``gn`` and ``mgn`` (global and per-module gradient norms, a bounded window of modules per step,
  see :mod:`.norms`), ``ur`` (update/weight ratio) when they were measured; the norms are those
  before a ``clip_grad_norm_``, and ``gnc`` is the global norm after it;
- in a multi-rank job ``co``, ``cn``, ``fw`` and ``pcs`` (:mod:`.torch_dist`);
- memory: ``rss`` on the steps whose norms are measured, ``cuda``/``cuda_peak`` (allocated
  bytes) every step on a GPU, ``gpu_util`` every :data:`GPU_UTIL_EVERY` steps.

It also tunes the automatic ``norm_every`` (a ``norm_every`` event when it changes) and writes
a ``module_norms`` event when a model has more modules than one step's window.

State owned here: the kept rows, the step clock, the cost of measuring norms, the window.
"""

from __future__ import annotations

import math
import time

import torch

from ._util import FLUSH_SECONDS, num, rss_bytes
from .held import HELD_EVERY, HeldWatch
from .norms import MGN_MAX
from .norms import window as norms_window
from .sampler import OverheadWatch
from .torch_grads import per_module

GPU_UTIL_EVERY = 10  # steps between GPU utilisation readings (an NVML query each)
# automatic ``norm_every``: reading every gradient may cost this share of a step
NORM_BUDGET = 0.005
NORM_ALWAYS = 32  # the first steps always have norms (and time what they cost)
NORM_RETUNE = 256  # steps between later re-evaluations of norm_every
NORM_MAX_EVERY = 16
# a ``targets`` event every ``hist_every`` steps, at most once in this many seconds
TARGETS_SECONDS = 2.0
UNMEASURED = "unmeasured"  # the gradient norm of a step that norm_every skipped


class StepRows(OverheadWatch, HeldWatch):
    """One row of numbers per training step, written as ``step`` events in batches."""

    def _init_step_state(self) -> None:
        self._last_step_end = None
        self._targets_at = -math.inf  # when the last ``targets`` event was written
        self._dt_total, self._dt_count = 0.0, 0  # the steps' durations so far (their mean)
        self._rows: list[tuple] = []  # per-step numbers not yet written (see _drain)
        self._drained = 0.0
        self._norm_auto = not self.cfg.norm_every
        self._norm_every = self.cfg.norm_every or 1
        self._norm_cost = [0.0, 0, 0.0, 0]  # seconds and count of norms, of steps (automatic)
        self._retune_at = NORM_ALWAYS
        self._norms_on_host = True  # every gradient was read on the host (NumPy) last time
        self._rss_due = True  # read the RSS with this step's row (the steps norms are measured)
        self._mgn_at = 0  # where the next step's window of module norms starts (norms.py)
        self._cuda = torch.cuda.is_available()
        self._gpu_util = self._cuda  # until NVML turns out to be missing
        # time inside forward, backward and the optimizer step since the last step ended
        self._busy = 0.0
        self._busy_depth = 0
        self._busy_t0 = 0.0
        self._in_data = False  # waiting in a DataLoader's __next__
        self._init_overhead()
        self._init_held()
        self._guarded_look_held = self.guard(self._look_held)

    # -- where the step's time goes ---------------------------------------------------------
    def _busy_enter(self) -> None:
        if not self._busy_depth:
            self._busy_t0 = time.perf_counter()
        self._busy_depth += 1

    def _busy_exit(self) -> None:
        if self._busy_depth:
            self._busy_depth -= 1
            if not self._busy_depth:
                self._busy += time.perf_counter() - self._busy_t0

    def _idle(self) -> bool:
        """Outside data loading, forward, backward, the optimizer step and collectives.

        (The sampler asks.)
        """
        return not self._busy_depth and not self._in_data and not self._coll[4]

    def _emit_step(self, loss, gn, parts=None, ratio=None, clipped=None) -> None:
        """Keep one step's numbers as a row; rows become ``step`` events in :meth:`_drain`."""
        now = time.perf_counter()
        dt = now - self._last_step_end if self._last_step_end is not None else None
        self._last_step_end = now
        if dt is not None:
            self._dt_total += dt
            self._dt_count += 1
            if self._norm_auto:
                cost = self._norm_cost
                cost[2] += dt
                cost[3] += 1
        root = self._root() if self._root else None
        cuda = None
        if self._cuda:
            cuda = (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated())
            if self._gpu_util and self.rec.step % GPU_UTIL_EVERY == 0 and cuda[0]:
                cuda += (self._read_gpu_util(),)  # a third value: utilisation was read
        rss = rss_bytes() if self._rss_due else None
        self._rss_due = True
        busy, self._busy, self._busy_depth = self._busy, 0.0, 0
        if dt is not None and self._early is not None:  # (collectives the code called are
            self._watch_overhead(dt, self._data_wait, busy + self._coll_s)  # not its own)
        self._rows.append((self.rec.step, self.rec.epoch, loss, gn, parts, dt, self._data_wait,
                           rss, ratio, None if root is None else root.training, cuda, clipped,
                           busy, self._dist_fields(self._last_opt) if self._multi else None))
        self._data_wait = 0.0
        self.rec.step += 1
        if not self.rec.step % HELD_EVERY and self._held_due(self.rec.step):
            # the containers the loop keeps (held.py)
            self._guarded_look_held(self.rec.step, None, self._dt_total / max(self._dt_count, 1))
        if self._norm_auto and self.rec.step >= self._retune_at:
            self._retune_norms()
        if now - self._drained >= FLUSH_SECONDS:
            self._drain()
            self.rec.flush()  # on disk now: a killed run loses at most FLUSH_SECONDS of steps
        if self.cfg.hist_every and self.rec.step % self.cfg.hist_every == 0 and \
                now - self._targets_at >= TARGETS_SECONDS:
            self._targets_at = now  # (a killed run keeps the statistics of its last seconds)
            self.losses.emit()

    def _retune_norms(self) -> None:
        """Automatic ``norm_every``: the smallest k that keeps measuring norms within budget.

        Norms measured on one step cost ``cost[0] / cost[1]`` seconds; a step lasts
        ``cost[2] / cost[3]`` seconds (both since the last evaluation).
        """
        self._retune_at = self.rec.step + NORM_RETUNE
        cost, self._norm_cost = self._norm_cost, [0.0, 0, 0.0, 0]
        if not cost[1] or cost[2] <= 0 or not self._norms_on_host:
            return  # on an accelerator the time is mostly waiting for the backward kernels
        share = (cost[0] / cost[1]) / (cost[2] / cost[3])
        every = max(1, min(NORM_MAX_EVERY, math.ceil(share / NORM_BUDGET)))
        if every < self._norm_every:  # lower k only with a 20% margin: no flip-flop at a bound
            every = max(every, min(self._norm_every, math.ceil(share / (0.8 * NORM_BUDGET))))
        if every != self._norm_every:
            self._norm_every = every
            self.rec.emit("norm_every", step=self.rec.step, every=every,
                          share=round(share, 5), budget=NORM_BUDGET)

    def _drain(self) -> None:
        """Write the kept step rows as ``step`` events (in one batch: warm in the CPU caches).

        Called every ``FLUSH_SECONDS``, before any other event is written (the record keeps
        its order) and when the capture ends.
        """
        with self.rec._lock:  # the flusher thread drains too; the training thread appends
            kept = self._rows
            n = len(kept)
            rows = kept[:n]  # slice and del of n rows: a row appended meanwhile stays kept
            del kept[:n]
            self._drained = time.perf_counter()
            done = 0
            try:
                for row in rows:
                    step = self._step_event(*row)
                    done += 1  # emit queues the event first: a row is done once emit is called
                    self.rec.emit("step", **step)
            except BaseException:  # a time limit or Ctrl-C mid-batch: the rest is written later
                kept[:0] = rows[done:]
                raise

    def _step_event(self, i, ep, loss, gn, parts, dt, dw, rss, ratio, training, cuda,
                    clipped, busy, dist) -> dict:
        """One kept row as the fields of a ``step`` event."""
        step = {"i": i, "ep": ep, "loss": num(loss), "dt": dt, "dw": dw}
        if dist:  # a multi-rank job: collectives, forward, replica checksum (torch_dist)
            step.update(dist)
        if busy:
            step["bz"] = busy
        if rss is not None:
            step["rss"] = rss
        if gn is not UNMEASURED:  # left out: not measured (norm_every); None: no gradient
            step["gn"] = num(gn)
        if clipped is not None:  # gn is the norm before clip_grad_norm_, gnc after it
            step["gnc"] = num(clipped)
        if parts:
            step["mgn"] = {k: num(v) for k, v in self._window(per_module(*parts)).items()}
        if ratio is not None:
            step["ur"] = num(ratio)
        if training is not None:
            step["tm"] = training
        if cuda is not None:
            step["cuda"], step["cuda_peak"] = cuda[0], cuda[1]
            if len(cuda) > 2:
                step["gpu_util"] = cuda[2]
        return step

    def _window(self, per_module: dict) -> dict:
        """The per-module norms this step records in ``mgn`` (a bounded window: :mod:`.norms`)."""
        out = norms_window(per_module, self._mgn_at)
        if out is not per_module:
            if not self._mgn_at:
                self.rec.emit("module_norms", modules=len(per_module), per_step=MGN_MAX)
            self._mgn_at += MGN_MAX
        return out

    def _read_gpu_util(self) -> int | None:
        """Percent of the last NVML sample period the GPU ran a kernel (None: not measurable)."""
        try:
            return int(torch.cuda.utilization())
        except Exception:  # noqa: BLE001 - no NVML (pynvml) or no permission: stop asking
            self._gpu_util = False
            return None
