"""Step rows of the PyTorch instrument (mixed into ``TorchInstrument``): timing, memory, writing.

Each training step (an optimizer step, or a ``backward()`` in a loop without an optimizer) is
kept as a row of numbers and written as a ``step`` event in batches (:meth:`StepRows._drain`):

- every step: ``i``, ``ep``, ``loss``, ``dt`` (seconds since the last step ended), ``dw`` (of
  which waiting for data), ``cuda``/``cuda_peak`` (allocated bytes) on a GPU, ``gpu_util`` every
  :data:`GPU_UTIL_EVERY` steps;
- the steps with full detail (below): ``bz`` (of which inside forward, backward and the
  optimizer step: the rest is the loop's own time), ``tm`` (the model's training flag), ``rss``
  (with the norms), ``gn`` and ``mgn`` (global and per-module gradient norms, a bounded window of
  modules per step, see :mod:`.norms`; the norms are those before a ``clip_grad_norm_``, and
  ``gnc`` is the global norm after it); ``ur`` (update/weight ratio) on its own schedule;
- in a multi-rank job ``co``, ``cn``, ``fw`` and ``pcs`` (:mod:`.torch_dist`).

Steady-state thinning: this module owns which steps record full detail. Every step of the first
:data:`DETAIL_WARMUP` steps does (where most problems show, and where the detectors learn the
loop's shape), so does every step for :data:`DETAIL_WARMUP` steps after a non-finite loss, and
after the warm-up every k-th step: the smallest k that keeps what full detail costs the capture
above a lean step within :data:`DETAIL_BUDGET` of a step (at most :data:`DETAIL_MAX_EVERY`,
re-evaluated every :data:`DETAIL_RETUNE` steps; a ``detail_every`` event when it changes). The
capture's own time is read with ``perf_counter`` at the entry and exit of the step's hooks. A
lean step still counts, with its loss, its time and its data wait; a step whose loss is not
finite switches to full detail at once. With the automatic ``norm_every`` the gradient norms are
measured on exactly the steps with full detail. A multi-rank job, a loop whose own time the line
sampler watches, and an accelerator's steps keep full detail on every step.

It also writes a ``module_norms`` event when a model has more modules than one step's window.

State owned here: the kept rows, the step clock, the detail schedule and what it cost, the window.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from ._util import FLUSH_SECONDS, num, rss_bytes
from .held import HELD_EVERY, HeldWatch
from .norms import MGN_MAX
from .norms import window as norms_window
from .sampler import OverheadWatch
from .torch_grads import per_module

GPU_UTIL_EVERY = 10  # steps between GPU utilisation readings (an NVML query each)
# steady-state thinning (see the module's docstring): full detail on the first DETAIL_WARMUP
# steps (>= the steps the early detectors read: OVERHEAD_AFTER, PAIRING_STEPS, the first loss
# batches), then every k-th step, k the smallest that keeps full detail's extra cost within
# DETAIL_BUDGET of a step, at most DETAIL_MAX_EVERY, re-evaluated every DETAIL_RETUNE steps
DETAIL_WARMUP = 64
DETAIL_BUDGET = 0.01
DETAIL_RETUNE = 256
DETAIL_MAX_EVERY = 16
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
        self._norm_every = self.cfg.norm_every  # 0: the norms follow the detail schedule
        # the detail schedule: this step has full detail (``_timed``: since it began, so its
        # forward/backward/step time is whole), every k-th step does, every step before
        # ``_detail_until`` does; the capture's own seconds in this step's hooks so far, and
        # per step since the last retune: own seconds of detailed and lean steps, step seconds
        self._detail = self._timed = True
        self._detail_every = 1
        self._detail_until = DETAIL_WARMUP
        self._own = 0.0
        self._own_times: tuple[list, list, list] = ([], [], [])
        self._retune_at = DETAIL_WARMUP
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

    # -- which steps record full detail -----------------------------------------------------
    def _full_detail(self) -> None:
        """Full detail from this step on, for :data:`DETAIL_WARMUP` steps (a non-finite loss)."""
        self._detail = True
        self._detail_until = max(self._detail_until, self.rec.step + DETAIL_WARMUP)

    def _next_detail(self, own: float, dt: float | None) -> None:
        """Account for the step just ended (its own seconds, its length); plan the next one."""
        detail, lean, steps = self._own_times
        (detail if self._detail else lean).append(own)
        if dt is not None:
            steps.append(dt)
        step = self.rec.step
        if step >= self._retune_at:
            self._retune_detail()
        # a run of as many consecutive steps as there are sets of parameters stepping (a
        # GAN's two optimizers alternate: with k even, every k-th step alone is always D's)
        # (the interval grows with them: full detail's share of the steps stays in its budget)
        sets = len(self._opt_counts) or 1
        self._detail = self._timed = self._rss_due = \
            step < self._detail_until or step % (self._detail_every * sets) < sets or \
            self._multi or self._sampler is not None

    def _retune_detail(self) -> None:
        """The smallest k that keeps full detail's extra cost within :data:`DETAIL_BUDGET`.

        Full detail costs the median own seconds of a detailed step over those of a lean one
        (none yet: the whole of it), against the median step (both since the last retune).
        """
        self._retune_at = self.rec.step + DETAIL_RETUNE
        (detail, lean, steps), self._own_times = self._own_times, ([], [], [])
        if not detail or not steps or not self._norms_on_host:
            return  # on an accelerator the time is mostly waiting for the backward kernels
        step = statistics.median(steps)
        extra = statistics.median(detail) - (statistics.median(lean) if lean else 0.0)
        if step <= 0:
            return
        share = max(extra, 0.0) / step
        cap = min(DETAIL_MAX_EVERY, self.cfg.detail_every_max)
        every = max(1, min(cap, math.ceil(share / DETAIL_BUDGET)))
        if every < self._detail_every:  # lower k only with a 20% margin: no flip-flop
            every = max(every, min(self._detail_every, math.ceil(share / (0.8 * DETAIL_BUDGET))))
        if every != self._detail_every:
            self._detail_every = every
            self.rec.emit("detail_every", step=self.rec.step, every=every,
                          share=round(share, 5), budget=DETAIL_BUDGET)

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
        rec = self.rec
        step = rec.step
        last, self._last_step_end = self._last_step_end, now
        dt = None
        if last is not None:
            dt = now - last
            self._dt_total += dt
            self._dt_count += 1
        cuda = None
        if self._cuda:
            cuda = (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated())
            if self._gpu_util and step % GPU_UTIL_EVERY == 0 and cuda[0]:
                cuda += (self._read_gpu_util(),)  # a third value: utilisation was read
        rss = rss_bytes() if self._rss_due else None
        training = busy = dist = None
        if self._detail:  # (a lean step: loss, time, data wait; see the module docstring)
            root = self._root() if self._root else None
            training = None if root is None else root.training
            busy = self._busy if self._timed else None  # (turned detailed midway: not whole)
            if dt is not None and self._early is not None:  # (collectives the code called
                self._watch_overhead(dt, self._data_wait, (busy or 0.0) + self._coll_s)  # are
            if self._multi:  # not its own)
                dist = self._dist_fields(self._last_opt)
        self._busy, self._busy_depth = 0.0, 0
        self._rows.append((step, rec.epoch, loss, gn, parts, dt, self._data_wait, rss, ratio,
                           training, cuda, clipped, busy, dist))
        self._data_wait = 0.0
        rec.step = step = step + 1
        own, self._own = self._own + time.perf_counter() - now, 0.0
        self._next_detail(own, dt)  # (before the periodic work below: no step's own cost)
        if not step % HELD_EVERY and self._held_due(step):
            # the containers the loop keeps (held.py)
            self._guarded_look_held(step, None, self._dt_total / max(self._dt_count, 1))
        if now - self._drained >= FLUSH_SECONDS:
            self._drain()
            rec.flush()  # on disk now: a killed run loses at most FLUSH_SECONDS of steps
        hist_every = self.cfg.hist_every
        if hist_every and step % hist_every == 0 and now - self._targets_at >= TARGETS_SECONDS:
            self._targets_at = now  # (a killed run keeps the statistics of its last seconds)
            self.losses.emit()

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
            event = self._step_event
            try:
                events = [event(*row) for row in rows]
            except BaseException:  # a time limit or Ctrl-C mid-batch: all are written later
                kept[:0] = rows
                raise
            self.rec.emit_steps(events)

    def _step_event(self, i, ep, loss, gn, parts, dt, dw, rss, ratio, training, cuda,
                    clipped, busy, dist) -> dict:
        """One kept row as a ``step`` event."""
        step = {"t": "step", "i": i, "ep": ep, "loss": num(loss), "dt": dt, "dw": dw}
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
