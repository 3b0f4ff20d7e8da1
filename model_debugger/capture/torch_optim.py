"""Optimizer hooks of the PyTorch instrument (mixed into ``TorchInstrument``).

What they record:

- ``Optimizer.__init__``: an ``optimizer`` event (class, hyperparameters, the line that built
  it; at most three per line, a loop may build one every step) and its ``ref``; an optimizer
  built before the capture gets its event at its first step;
- the global step pre-hook: the ``step`` call site (``ref``), on the steps that
  ``norm_every``/``hist_every``/``update_every`` pick, the gradient norms (global and per
  module; a non-finite gradient norm is a ``nonfinite`` event with ``what="grad"``), ``hist``
  events and a copy of the weights;
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
from .torch_steps import UNMEASURED
from .torch_util import hyper

_OPTIMIZER_EVENTS = 3  # ``optimizer`` events per line that builds one (a loop may build many)
HIST_PARAMS = 64  # gradients histogrammed per step, at most


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

    def _let_go_optimizer(self) -> None:
        self._last_opt = None
        self._before = None
        self._before_params = None
        self._step_norms = (None, None)
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
                          location=loc)
        if not self._param_names:
            params = [p for g in opt.param_groups for p in g["params"]]
            self._discover(sys._getframe(), params)

    # -- steps -----------------------------------------------------------------------------
    def _params(self, opt) -> list:
        return [p for g in opt.param_groups for p in g["params"] if p.grad is not None]

    def _pre_step(self, opt, args, kwargs) -> None:
        nest = self._nest
        if nest is not None and nest[0] is opt and nest[1] == self._backwards:
            nest[2] += 1  # a subclass's step() calling super().step(): both are hooked
            return
        self._nest = [opt, self._backwards, 1]  # a step that raised leaves a stale one: fine
        self._site("step")
        if opt is not self._last_opt and opt not in self._seen_optimizers:  # built before
            self._seen_optimizers.add(opt)  # this capture began
            self.keeper.on_optimizer(opt)
            self.rec.emit("optimizer", cls=type(opt).__name__, hyper=hyper(opt.defaults),
                          location=None)
        self._last_opt = opt
        # schedules count the steps of each set of parameters: a GAN's two optimizers
        # alternate, and an optimizer re-created every step still updates the same weights
        groups = opt.param_groups
        key = id(groups[0]["params"][0]) if groups and groups[0]["params"] else id(opt)
        n = self._opt_counts.get(key, 0)
        self._opt_counts[key] = n + 1
        cfg = self.cfg
        self._step_norms = (UNMEASURED, None)  # none kept from a step whose optimizer raised
        self._before = None
        norms = self._norm_every == 1 or n % self._norm_every == 0
        self._rss_due = norms  # reading /proc right after a step costs ~40 us in cold caches
        hist = cfg.hist_every and n % cfg.hist_every == 0
        update = cfg.update_every and n % cfg.update_every == 0
        if not (norms or hist or update or not self._param_names):
            return  # nothing to measure on this step: the parameters are not even listed
        params = self._params(opt)
        if not self._param_names and params:
            self._discover(sys._getframe(), params)
        if norms:
            t0 = time.perf_counter()
            self._step_norms = self._grad_norms(params)
            cost = self._norm_cost
            cost[0] += time.perf_counter() - t0
            cost[1] += 1
        if hist and params:
            self._histograms(params)
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
        if not math.isfinite(total) and not self._nonfinite_seen:
            self._nonfinite_seen = True
            bad = [m for m, v in per_module(modules, norms).items() if not math.isfinite(v)]
            self.rec.emit("nonfinite", step=self.rec.step, what="grad", value=str(total),
                          module=bad[-1] if bad else None)
        return total, ((modules, norms) if self.cfg.module_norms else None)

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
        nest = self._nest
        if nest is not None and nest[0] is opt and nest[2] > 1:
            nest[2] -= 1  # the inner step() of a subclass: the outer one is the step
            return
        self._nest = None
        self._mode = "optimizer"
        self._opt_steps += 1
        ratio = None
        if self._before is not None:
            before, self._before = self._before, None
            try:
                ratio = update_ratio(before, self._before_params, self._ur_stride)
            except (TypeError, ValueError, RuntimeError):  # weights replaced by the step
                ratio = None
        losses = [v for v in self._pending_losses if v is not None]
        self._pending_losses = []
        if len(losses) > 1 and not getattr(self, "_accumulation_seen", False):
            self._accumulation_seen = True  # the recorded loss may be scaled (loss / k)
            self.rec.emit("accumulation", step=self.rec.step, backwards=len(losses))
        loss = sum(losses) / len(losses) if losses else None
        gn, parts = self._step_norms
        self._step_norms = (None, None)
        self._emit_step(loss, gn, parts, ratio)
