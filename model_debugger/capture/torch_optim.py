"""Optimizer hooks of the PyTorch instrument (mixed into ``TorchInstrument``).

What they record:

- ``Optimizer.__init__``: an ``optimizer`` event (class, hyperparameters, the line that built
  it; at most three per line, a loop may build one every step) and its ``ref``; an optimizer
  built before the capture gets its event at its first step;
- the global step pre-hook: on the steps with full detail (:mod:`.torch_steps`) the ``step``
  call site (``ref``); on the steps that ``norm_every`` (automatic: those with full detail),
  ``hist_every`` and ``update_every`` pick, the gradient norms (global and per module; a
  non-finite gradient norm is a ``nonfinite`` event with ``what="grad"``), ``hist`` events and a
  copy of the weights; after the warm-up, histograms are spaced (a multiple of ``hist_every``)
  so that they cost at most :data:`HIST_BUDGET` of the training time; for ``step(closure)`` (Lightning, LBFGS) all of this
  happens once the closure has run its backward;
- ``clip_grad_norm_`` (through ``_clip_grads_with_norm_``): the clip's coefficient, so that the
  norms recorded are those before the clip (the clipped total is the row's ``gnc``) and one
  ``clip`` event per ``max_norm`` (at most three);
- ``LRScheduler.__init__``: a ``scheduler`` ``ref`` (where the first schedule was built); on
  every step (lean ones too), the first parameter group's learning rate, as an ``lr`` event
  when it moved by 1.5x or more since the last one (at most ``LR_EVENTS``: the schedule's
  trajectory);
- the first step of each optimizer: a ``trained`` event (the model's parameter count and how
  many of them the optimizers' steps so far updated: frozen layers, an optimizer over part of
  the model, a branch cut from the graph all leave parameters without a gradient);
- the global step post-hook: the update/weight ratio, and the step's row (see
  :mod:`.torch_steps`) with the mean of the losses seen since the last step.

State owned here: the optimizers seen, the per-optimizer step counts, the measurement plans and
the norms and weight copies of the step in progress.
"""

from __future__ import annotations

import math
import sys
import time
import weakref

from ._util import RateTrack
from .codeloc import user_location
from .torch_grads import (
    copy_weights,
    grad_norms,
    histogram,
    on_host,
    per_module,
    ratio_stride,
    update_ratio,
)
from .torch_steps import DETAIL_WARMUP, UNMEASURED
from .torch_util import hyper

_OPTIMIZER_EVENTS = 3  # ``optimizer`` events per line that builds one (a loop may build many)
HIST_PARAMS = 64  # gradients histogrammed per step, at most
# after the warm-up (torch_steps.DETAIL_WARMUP) histograms are spaced (a multiple of
# hist_every) so that they cost at most this share of the training time
HIST_BUDGET = 0.005


class OptimizerHooks:
    """Optimizer construction and step hooks: norms, histograms, update ratio, one row a step."""

    def _init_optimizer_state(self) -> None:
        self._opt_steps = 0
        self._mode = None  # "optimizer" once a step is seen, "backward" for loops without one
        self._plans: dict[tuple, tuple] = {}  # param ids -> (host indices, other indices, modules)
        self._seen_optimizers: weakref.WeakSet = weakref.WeakSet()
        self._optimizers_built = 0  # constructions seen during the capture
        self._nest: list | None = None  # [optimizer, backward() count, step() depth]
        self._built_at: dict[tuple, int] = {}  # (file, line) -> optimizers built there
        self._before: list | None = None
        self._before_params = None
        self._step_norms: tuple = (None, None)
        self._last_opt = None
        self._opt_counts: dict[int, int] = {}  # id(optimizer) -> its steps in this capture
        self._ur_stride = 1  # every UR_STRIDE-th weight is compared for a large model
        self._clip = None  # (parameter ids, max_norm, total norm) of a clip since the last step
        self._clips_seen: set[float] = set()  # max_norm values with a ``clip`` event
        self._step_clipped = None  # the clipped global norm of the step in progress
        self._guarded_on_clip = self.guard(self._on_clip)
        self._updated: set[int] = set()  # ids of parameters some optimizer's first step updated
        self._rates = RateTrack(self.rec)  # the learning rate's trajectory (``lr`` events)
        self._scheduler_seen = False
        self._updated_by: set[int] = set()  # ids of the optimizers counted there
        self._elsewhere_seen = False  # an optimizer_elsewhere event was written
        self._reached: set[int] = set()  # ids of the parameters the first backward reached
        self._opt_key = 0  # the schedules' key of ``_last_opt`` (see _pre_step)
        self._hist_stride = 1  # histograms every hist_every * this steps (HIST_BUDGET)

    def _let_go_optimizer(self) -> None:
        self._last_opt = None
        self._before = None
        self._before_params = None
        self._step_norms = (None, None)
        self._clip = None
        self._plans.clear()

    # -- construction ----------------------------------------------------------------------
    def _wrap_opt_init(self, original):
        link = self._link

        def __init__(opt, *args, **kwargs):
            original(opt, *args, **kwargs)
            inst = link()
            if inst is not None and opt not in inst._seen_optimizers:
                inst.guard(inst._on_new_optimizer)(opt)

        __init__.__wrapped__ = original
        return __init__

    def _on_new_optimizer(self, opt) -> None:
        self._seen_optimizers.add(opt)
        self._optimizers_built += 1
        self.keeper.on_optimizer(opt)
        loc = user_location(sys._getframe())
        self.ref("optimizer", loc, cls=type(opt).__name__)
        where = (loc or {}).get("file"), (loc or {}).get("line")
        built = self._built_at[where] = self._built_at.get(where, 0) + 1
        if built <= _OPTIMIZER_EVENTS:  # one built every step: counted in ``calls`` instead
            self.rec.emit("optimizer", cls=type(opt).__name__, hyper=hyper(opt.defaults),
                          location=loc, at_step=self.rec.step)
        if not self._param_names:
            params = [p for g in opt.param_groups for p in g["params"]]
            self._discover(sys._getframe(), params)

    def _wrap_scheduler_init(self, original):
        link = self._link

        def __init__(sched, *args, **kwargs):
            original(sched, *args, **kwargs)
            inst = link()
            if inst is not None and not inst._scheduler_seen:
                inst._scheduler_seen = True
                inst.guard(inst.ref)("scheduler", user_location(sys._getframe()),
                                     cls=type(sched).__name__)

        __init__.__wrapped__ = original
        return __init__

    def _note_lr(self, opt, detail: bool = True) -> None:
        """An ``lr`` event when the first group's rate moved by ``LR_MOVE`` or more.

        A tensor rate (a capturable optimizer's, on the device) is read on the steps with full
        detail only: reading it waits for the device.
        """
        groups = opt.param_groups
        lr = groups[0].get("lr") if groups else None
        if hasattr(lr, "item"):  # a tensor learning rate
            if not detail:
                return
            lr = float(lr.item())
        self._rates.note(lr)

    # -- steps -----------------------------------------------------------------------------
    def _params(self, opt) -> list:
        return [p for g in opt.param_groups for p in g["params"] if p.grad is not None]

    def _pre_step(self, opt, args, kwargs) -> tuple | None:
        """The global step pre-hook: the step's bookkeeping, and what this step measures.

        A lean step (:mod:`.torch_steps`) counts the step and measures only what a fixed
        schedule (``norm_every``, ``hist_every``, ``update_every``) asks of it.
        """
        t0 = time.perf_counter()
        try:
            nest = self._nest
            if nest is not None and nest[0] is opt and nest[1] == self._backwards:
                nest[2] += 1  # a subclass's step() calling super().step(): both are hooked
                return None
            self._nest = [opt, self._backwards, 1]  # a step that raised leaves a stale one
            if self._clear_pending is not None:  # zero_grad() between backward() and here
                # (a closure takes the gradients again inside the step; another model's
                # zero_grad leaves these alone)
                if not callable(args[1] if len(args) > 1 else kwargs.get("closure")) and \
                        _no_gradient(opt):
                    self._cleared[0] += 1
                    self._cleared[1] = self._cleared[1] or self._clear_pending or None
                self._clear_pending = None
            self._bwd_at_step = self._backwards
            detail = self._detail
            if detail:  # (a lean step: neither its time split nor the call site, known)
                self._busy_enter()  # left in _post_step (or reset with the step's row)
                self._site("step")
            if not self._rates.full:  # every step: a schedule restarting each epoch shows
                self._note_lr(opt, detail)  # every restart, whichever steps have full detail
            if self._multi and not self._opt_steps:
                self._before_first_update(opt)
            if opt is not self._last_opt:
                if opt not in self._seen_optimizers:  # built before this capture began
                    self._seen_optimizers.add(opt)
                    self.keeper.on_optimizer(opt)
                    self.rec.emit("optimizer", cls=type(opt).__name__,
                                  hyper=hyper(opt.defaults), location=None)
                self._last_opt = opt
                # schedules count the steps of each set of parameters: a GAN's two optimizers
                # alternate, an optimizer re-created every step still updates the same weights
                groups = opt.param_groups
                self._opt_key = id(groups[0]["params"][0]) \
                    if groups and groups[0]["params"] else id(opt)
            key = self._opt_key
            n = self._opt_counts.get(key, 0)
            self._opt_counts[key] = n + 1
            cfg = self.cfg
            self._step_norms = (UNMEASURED, None)  # none kept from a step whose step raised
            self._step_clipped = None
            self._before = None
            every = self._norm_every  # 0: automatic, the steps with full detail (torch_steps)
            norms = detail if not every else every == 1 or n % every == 0
            self._rss_due = norms  # reading /proc after a step costs ~40 us in cold caches
            hist = bool(cfg.hist_every and n % (cfg.hist_every * self._hist_stride) == 0)
            update = bool(cfg.update_every and n % cfg.update_every == 0)
            if not (norms or hist or update or not self._param_names):
                return None  # nothing to measure on this step: the parameters not even listed
            return self._measure_step(opt, args, kwargs, norms, hist, update)
        finally:
            self._own += time.perf_counter() - t0  # the capture's own time (torch_steps)

    def _measure_step(self, opt, args, kwargs, norms: bool, hist: bool, update: bool):
        """Measure now, or, for ``step(closure)``, once the closure ran its backward."""
        # ``args`` are the step's own, the optimizer first: ``step(closure)`` has it second
        closure = args[1] if len(args) > 1 else kwargs.get("closure")
        if not callable(closure):
            self._measure(opt, norms, hist, update)
            return None
        # step(closure): the gradients of this step exist once the closure ran its backward
        # (Lightning, LBFGS); measure after its first call, not before the stale ones
        measure = self.guard(self._measure)
        first = [True]

        def closure_then_measure(*a, **k):
            out = closure(*a, **k)
            if first[0]:
                first[0] = False
                measure(opt, norms, hist, update)
            return out

        if len(args) > 1:
            return (args[0], closure_then_measure, *args[2:]), kwargs
        return args, {**kwargs, "closure": closure_then_measure}

    def _optimizer_elsewhere(self, opt) -> None:
        """Write ``optimizer_elsewhere`` when the optimizer owns none of what backward reached.

        The first backward's graph names the parameters the loss reaches
        (``_reached``, its leaves); when the optimizer's parameters got no gradient while
        those did, the optimizer was built over other parameters (another model instance, a
        stale copy). Told apart from a cut graph, where backward reaches no parameter at all.
        """
        reached = self._reached
        if not reached:
            return
        own = {id(p) for g in opt.param_groups for p in g["params"]}
        if reached & own:
            return
        self._elsewhere_seen = True
        self.rec.emit("optimizer_elsewhere", step=self.rec.step, optimizer_params=len(own),
                      model_params_with_grad=len(reached), shared=0)

    def _note_updated(self, opt, params) -> None:
        """A ``trained`` event: how much of the model the optimizers' first steps updated."""
        self._updated_by.add(id(opt))
        model = self._root() if self._root is not None else None
        if model is None or not params:
            return
        self._updated.update(id(p) for p in params)
        sizes = {id(p): p.numel() for p in model.parameters()}  # (a tied weight counts once)
        if not any(id(p) in sizes for p in params):
            return  # it trains another model (each fold of a k-fold loop builds its own): it
            # says nothing of how much of this one trains
        self.rec.emit("trained", params=sum(sizes.values()),
                      updated=sum(n for i, n in sizes.items() if i in self._updated))

    def _measure(self, opt, norms: bool, hist: bool, update: bool) -> None:
        """Read this step's gradients (norms, histograms) and copy the weights it will update."""
        params = self._params(opt)
        if not self._param_names and params and self._opt_steps >= self._next_search:
            # no nn.Module found yet: a search walks every object (gc); a model of plain
            # tensors (a dict of parameters) has none, so the searches thin out: steps 0, 1,
            # 2, 4, 8, ... (each one cost ~0.1 s a step on such a loop)
            self._next_search = max(1, 2 * self._opt_steps)
            self._discover(sys._getframe(), params)
        if not params and not self._elsewhere_seen:
            self._optimizer_elsewhere(opt)
        if id(opt) not in self._updated_by and len(self._updated_by) < 8:
            self._note_updated(opt, params)
        if norms:
            self._step_norms = self._grad_norms(params)
        if hist and params:
            t0 = time.perf_counter()
            self._histograms(params)
            self._space_histograms(time.perf_counter() - t0)
        if update and params:
            self._ur_stride = ratio_stride(params)
            self._before = copy_weights(params, self._ur_stride)
            self._before_params = params

    def _grad_norms(self, params) -> tuple[float | None, tuple | None]:
        """The global gradient norm, and (module names, per-parameter norms) for the record.

        Per-module norms are summed when the step rows are written (:meth:`_drain`), not here:
        per step only the norms themselves are computed.
        """
        if not params:
            return None, None
        host, rest, modules = self._plan(params)
        self._norms_on_host = not rest
        norms = grad_norms([p.grad for p in params], host, rest)
        total = math.sqrt(sum([n * n for n in norms]))
        clip, self._clip = self._clip, None
        if clip is not None:  # clipped since the backward: the norms before it are the truth
            norms, total = self._unclipped(params, norms, total, clip)
        if not math.isfinite(total) and not self._nonfinite_seen:
            self._nonfinite_seen = True
            bad = [m for m, v in per_module(modules, norms).items() if not math.isfinite(v)]
            self.rec.emit("nonfinite", step=self.rec.step, what="grad", value=str(total),
                          module=bad[-1] if bad else None)
        return total, ((modules, norms) if self.cfg.module_norms else None)

    def _unclipped(self, params, norms, total, clip) -> tuple[list[float], float]:
        """The per-parameter norms and their total before ``clip_grad_norm_`` scaled them.

        The clip multiplied every gradient it covered by one coefficient,
        ``min(max_norm / (total_norm + 1e-6), 1)``: dividing by it undoes the clip exactly,
        whatever the norm type it measured. The clipped total is kept for the step's row.
        """
        ids, max_norm, total_norm = clip
        try:
            coef = min(max_norm / (float(total_norm) + 1e-6), 1.0)
        except (TypeError, ValueError, RuntimeError, ZeroDivisionError):
            return norms, total
        self._step_clipped = total
        if not (math.isfinite(coef) and coef > 0):  # a non-finite total: nothing to undo
            return norms, total
        norms = [v / coef if id(p) in ids else v for p, v in zip(params, norms)]
        return norms, math.sqrt(sum([v * v for v in norms]))

    def _wrap_clip(self, original):
        """``torch.nn.utils.clip_grad._clip_grads_with_norm_``: where every norm clip scales.

        ``clip_grad_norm_`` calls it through its module, so a clip is seen however the user,
        Lightning or Accelerate imported ``clip_grad_norm_``.
        """
        link = self._link

        def _clip_grads_with_norm_(parameters, max_norm, total_norm, *args, **kwargs):
            inst = link()
            if inst is not None:
                if not isinstance(parameters, (list, tuple)) and \
                        not hasattr(parameters, "grad"):
                    parameters = list(parameters)  # a generator is read once: keep it
                inst._guarded_on_clip(parameters, max_norm, total_norm)
            return original(parameters, max_norm, total_norm, *args, **kwargs)

        _clip_grads_with_norm_.__wrapped__ = original
        return _clip_grads_with_norm_

    def _on_clip(self, parameters, max_norm, total_norm) -> None:
        params = [parameters] if hasattr(parameters, "grad") else parameters
        self._clip = ({id(p) for p in params}, float(max_norm), total_norm)
        if float(max_norm) not in self._clips_seen and len(self._clips_seen) < 3:
            self._clips_seen.add(float(max_norm))
            self.rec.emit("clip", max_norm=float(max_norm),
                          location=user_location(sys._getframe()))

    def _plan(self, params) -> tuple[list[int], list[int], list[str]]:
        """How to measure this list of parameters, worked out once per list."""
        key = tuple(map(id, params))
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 16:
                self._plans.clear()
            host = [i for i, p in enumerate(params) if on_host(p.grad)]
            rest = sorted(set(range(len(params))) - set(host))
            modules = [self._param_modules.get(id(p)) or f"param{i}" for i, p in enumerate(params)]
            plan = self._plans[key] = (host, rest, modules)
        return plan

    def _space_histograms(self, cost: float) -> None:
        """After the warm-up, space histograms so that they cost at most :data:`HIST_BUDGET`.

        ``cost``: the seconds this step's histograms took. The spacing is a multiple of
        ``hist_every`` (the steps stay aligned with it), against the mean step so far.
        """
        if self.rec.step < DETAIL_WARMUP or not self._dt_count:
            return
        step = self._dt_total / self._dt_count
        self._hist_stride = max(1, math.ceil(cost / (HIST_BUDGET * step * self.cfg.hist_every)))

    def _histograms(self, params) -> None:
        """Emit ``hist`` events of the first :data:`HIST_PARAMS` gradients.

        One per gradient, as :func:`~.torch_grads.histogram` bins it.
        """
        for p in params[:HIST_PARAMS]:
            fields = histogram(p.grad)
            if fields is not None:
                self.rec.emit("hist", step=self.rec.step,
                              param=self._param_names.get(id(p), "?"), **fields)

    def _post_step(self, opt, args, kwargs) -> None:
        t0 = time.perf_counter()
        nest = self._nest
        if nest is not None and nest[0] is opt and nest[2] > 1:
            nest[2] -= 1  # the inner step() of a subclass: the outer one is the step
            return
        self._nest = None
        if self._detail:
            self._busy_exit()
        self._mode = "optimizer"
        self._opt_steps += 1
        ratio = None
        if self._before is not None:
            before, self._before = self._before, None
            try:
                ratio = update_ratio(before, self._before_params, self._ur_stride)
            except (TypeError, ValueError, RuntimeError):  # weights replaced by the step
                ratio = None
        pending, self._pending_losses = self._pending_losses, []
        if len(pending) == 1:  # one backward: its loss (or None)
            loss = pending[0]
        else:
            losses = [v for v in pending if v is not None]
            if len(losses) > 1 and not getattr(self, "_accumulation_seen", False):
                self._accumulation_seen = True  # the recorded loss may be scaled (loss / k)
                self.rec.emit("accumulation", step=self.rec.step, backwards=len(losses))
            if not losses:
                loss = None
            elif self._sum_losses:  # a trainer divided each micro-batch's loss by the steps
                loss = sum(losses)
            else:
                loss = sum(losses) / len(losses)
        gn, parts = self._step_norms
        self._step_norms = (None, None)
        clipped, self._step_clipped, self._clip = self._step_clipped, None, None
        self._own += time.perf_counter() - t0  # (the step's row times its own part)
        self._emit_step(loss, gn, parts, ratio, clipped)


def _no_gradient(opt) -> bool:
    """Whether every parameter ``opt`` steps holds no gradient, or an all-zero one (read once)."""
    import torch

    try:
        with torch.no_grad():
            for group in opt.param_groups:
                for p in group["params"]:
                    g = p.grad
                    if g is not None and g.numel() and bool(g.detach().abs().max() > 0):
                        return False
    except (RuntimeError, TypeError, AttributeError, KeyError):  # (sparse gradients...)
        return False
    return True
