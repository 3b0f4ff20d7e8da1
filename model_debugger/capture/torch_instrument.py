"""PyTorch instrumentation: every hook is a handle or an undo callback, removed in ``detach``.

What is patched while a capture is active (and restored afterwards):

- ``Tensor.backward`` / ``torch.autograd.backward``: the loss value and the loop's ``backward()`` line;
- global optimizer step pre/post hooks: per-module gradient norms, update/weight ratio, step time;
- ``Optimizer.__init__``: where the optimizer was built, its class and hyperparameters;
- ``DataLoader.__iter__``: data-wait time and epochs (a training loader iterated again);
- loss functionals (``F.cross_entropy``, ``F.mse_loss``, ...): target statistics for the
  constant-predictor baseline, and validation losses computed under ``no_grad``.
"""

from __future__ import annotations

import gc
import math
import sys
import time
import warnings
import weakref

import numpy as np
import torch

from . import patches
from .codeloc import assignment, definition_location, is_user_file, user_frame, user_location
from .keeper import Keeper
from .norms import MGN_MAX
from .norms import window as norms_window
from .recorder import FLUSH_SECONDS, Recorder, _num, rss_bytes
from .torch_losses import BINARY_LOSSES, CLASS_LOSSES, REG_LOSSES, LossStats
from .torch_util import TimedIterator, floats, hyper, replay_first_nonfinite

GPU_UTIL_EVERY = 10  # steps between GPU utilisation readings (an NVML query each)
# automatic ``norm_every``: reading every gradient may cost this share of a step
NORM_BUDGET = 0.005
NORM_ALWAYS = 32  # the first steps always have norms (and time what they cost)
NORM_RETUNE = 256  # steps between later re-evaluations of norm_every
NORM_MAX_EVERY = 16
_BACKWARD_MODE_AFTER = 64
_UNMEASURED = "unmeasured"  # the gradient norm of a step that norm_every skipped
_OPTIMIZER_EVENTS = 3  # ``optimizer`` events per line that builds one (a loop may build many)
UR_FULL_BYTES = 64 << 20  # weights above this are sampled for the update/weight ratio
UR_STRIDE = 17
_HIST_SAMPLE = 1 << 16  # larger gradients are histogrammed on an evenly strided sample


def _call_chain(frame) -> tuple:
    """A cheap key of a library's call: code and instruction of each frame up to the user's.

    At most 8 frames (GradScaler.step inside a scheduler's wrapper is 4 deep). A code object's
    own hash reads its bytecode: frames are keyed by its id.
    """
    key: tuple = ()
    for _ in range(8):
        if frame is None:
            break
        key += (id(frame.f_code), frame.f_lasti)
        if is_user_file(frame.f_code.co_filename):  # cached per file name
            break
        frame = frame.f_back
    return key


class TorchInstrument:
    """Instruments PyTorch training for one Recorder."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.cfg = rec.config
        self._link = patches.Link(self)  # what the patched functions reach this through
        self._undo: list = []
        self._pending_losses: list[float] = []
        self._backwards = 0
        self._in_backward = False
        self._opt_steps = 0
        self._mode = None  # "optimizer" once a step is seen, "backward" for loops without one
        self._last_step_end = None
        self._data_wait = 0.0
        self._models: dict[int, tuple] = {}  # id(model) -> (weakref, name)
        self._param_names: dict[int, str] = {}
        self._param_modules: dict[int, str] = {}  # id(param) -> owning module's name
        self._plans: dict[tuple, tuple] = {}  # param ids -> (host indices, other indices, modules)
        self._root = None
        self._last_input = None
        self._nonfinite_seen = False
        self._refs_seen: set[str] = set()
        self._sites: dict[tuple, bool] = {}  # backward()/step() call sites: called by the user?
        self._chains: set[tuple] = set()  # call chains of library callers already located
        self._train_loaders: set[int] = set()
        self._active_loader = None
        # target statistics stay on the target's device until a ``targets`` event is written
        self.losses = LossStats(rec, self._ref)
        self._before: list | None = None
        self._cuda = torch.cuda.is_available()
        self._gpu_util = self._cuda  # until NVML turns out to be missing
        self._loader_refs: dict[int, weakref.ref] = {}
        self.keeper = Keeper()
        self._seen_optimizers: weakref.WeakSet = weakref.WeakSet()
        self._optimizers_built = 0  # constructions seen during the capture
        self._nest: list | None = None  # [optimizer, backward() count, step() depth]
        self._built_at: dict[tuple, int] = {}  # (file, line) -> optimizers built there
        self._last_loss_call = None
        self._replay = None
        self._in_weights = False
        self._guarded_before_backward = self._guard(self._before_backward)
        self._step_norms: tuple = (None, None)
        self._last_opt = None
        self._steady_loss = None  # the training loss's name once there is nothing left to keep
        self._rows: list[tuple] = []  # per-step numbers not yet written (see _drain)
        self._drained = 0.0
        self._norm_auto = not self.cfg.norm_every
        self._norm_every = self.cfg.norm_every or 1
        self._norm_cost = [0.0, 0, 0.0, 0]  # seconds and count of norms, of steps (automatic)
        self._retune_at = NORM_ALWAYS
        self._norms_on_host = True  # every gradient was read on the host (NumPy) last time
        self._rss_due = True  # read the RSS with this step's row (the steps norms are measured)
        self._opt_counts: dict[int, int] = {}  # id(optimizer) -> its steps in this capture
        self._ur_stride = 1  # every UR_STRIDE-th weight is compared for a large model
        self._mgn_at = 0  # where the next step's window of module norms starts (norms.py)

    # -- attach / detach -------------------------------------------------------------------
    def attach(self) -> None:
        from torch.optim import optimizer as optim_mod
        from torch.utils.data import DataLoader

        self.rec.before_event(self._drain)
        self._patch(torch.Tensor, "backward", lambda nxt: self._wrap_backward(nxt, True))
        self._patch(torch.autograd, "backward", lambda nxt: self._wrap_backward(nxt, False))
        self._undo.append(optim_mod.register_optimizer_step_pre_hook(
            self._guard(self._pre_step)).remove)
        self._undo.append(optim_mod.register_optimizer_step_post_hook(
            self._guard(self._post_step)).remove)
        self._patch(optim_mod.Optimizer, "__init__", self._wrap_opt_init)
        self._patch(DataLoader, "__iter__", self._wrap_loader_iter)
        for owner in (optim_mod.Optimizer, torch.nn.Module):
            self._patch(owner, "zero_grad", self._wrap_zero_grad)
        functional = torch.nn.functional
        for name in CLASS_LOSSES + BINARY_LOSSES + REG_LOSSES:
            if hasattr(functional, name):
                self._patch(functional, name, lambda nxt, name=name: self._wrap_loss(nxt, name))

    def _guard(self, fn):
        """Run an observation so that a failure in it never breaks the user's training.

        The first failure is recorded as an ``internal_error`` event; the hook then carries on.
        """
        def guarded(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - observation must never break training
                if not getattr(self, "_internal_seen", False):
                    self._internal_seen = True
                    self.rec.emit("internal_error", where=getattr(fn, "__name__", "?"),
                                  error=f"{type(exc).__name__}: {exc}"[:500])
                return None

        return guarded

    def _wrap_zero_grad(self, original):
        link = self._link

        def zero_grad(obj, *args, **kwargs):
            inst = link()
            if inst is not None:
                inst.keeper.zero_grad_calls += 1
            return original(obj, *args, **kwargs)

        zero_grad.__wrapped__ = original
        return zero_grad

    def _patch(self, owner, name, factory) -> None:
        """Stack ``factory(next)`` over ``owner.name`` (see :mod:`.patches`)."""
        self._undo.append(patches.install(owner, name, factory))

    def detach(self) -> None:
        """Remove every hook and patch (idempotent), and let go of the user's objects.

        Wrappers that something else kept (torch._dynamo snapshots ``Tensor`` methods) only
        call through from now on; what Isolate needs stays in :attr:`keeper`.
        """
        self._link.cut()
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:  # noqa: BLE001 - one failing undo must not keep others in place
                pass
        self._last_input = None
        self._last_opt = None
        self._before = None
        self._before_params = None
        self._last_loss_call = None
        self._step_norms = (None, None)
        self._plans.clear()
        self._models.clear()
        self._root = None

    def finish(self) -> None:
        """Flush what is pending when the capture ends (losses without a step, eval losses)."""
        if self._mode is None and self._pending_losses:
            for loss in self._pending_losses:
                self._emit_step(loss, None)
            self._pending_losses = []
        self._drain()
        self.losses.flush_eval()
        self.losses.emit()
        if self._backwards or self._opt_steps:  # torch imported but not trained: say nothing
            most = max(self._built_at.items(), key=lambda kv: kv[1], default=(None, 0))
            built_at = {"file": most[0][0], "line": most[0][1]} if most[1] > 1 and \
                most[0][0] else None  # the line that built the most optimizers
            self.rec.emit("calls", zero_grad=self.keeper.zero_grad_calls,
                          backward=self._backwards, optimizer_steps=self._opt_steps,
                          optimizers_built=self._optimizers_built, most_built_at=built_at)

    # -- code references -------------------------------------------------------------------
    def _ref(self, kind: str, loc: dict | None, **extra) -> None:
        if loc is None:
            return
        key = f"{kind}:{loc['file']}:{loc['line']}"
        if key not in self._refs_seen:
            self._refs_seen.add(key)
            self.rec.emit("ref", kind=kind, **loc, **extra)

    def _site(self, kind: str) -> None:
        """Reference the user's line of a ``backward()``/``step()`` call, once per call site.

        Called from a hook four frames below that call (this, the hook, its guard, the
        framework's wrapper). When the calling frame is the user's own code, its code object
        and instruction identify the call site: one dictionary lookup a step. When a library
        made the call (GradScaler, a scheduler's wrapper, Accelerate), the user's line is
        further up and the key is the chain of frames up to it.
        """
        frame = sys._getframe(4)
        key = (kind, id(frame.f_code), frame.f_lasti)
        direct = self._sites.get(key)
        if direct is None:
            if len(self._sites) > 1024:  # generated code, say: forget, look up again
                self._sites.clear()
            direct = self._sites[key] = is_user_file(frame.f_code.co_filename)
            if direct:
                self._ref(kind, user_location(frame))
        if not direct:
            chain = (kind, _call_chain(frame))
            if chain not in self._chains:
                if len(self._chains) > 1024:
                    self._chains.clear()
                self._chains.add(chain)
                self._ref(kind, user_location(frame))

    # -- backward --------------------------------------------------------------------------
    def _wrap_backward(self, original, is_method: bool):
        link = self._link

        def backward(*args, **kwargs):
            inst = link()
            # the tensor: self of Tensor.backward, or autograd.backward's ``tensors``
            tensor = args[0] if args else kwargs.get("tensors")
            # Tensor.backward calls torch.autograd.backward: observe the outer call only.
            if inst is None or inst._in_backward or \
                    not (is_method or isinstance(tensor, torch.Tensor)):
                return original(*args, **kwargs)
            inst._in_backward = True
            try:
                inst._guarded_before_backward(tensor)
                return original(*args, **kwargs)
            finally:
                inst._in_backward = False

        backward.__wrapped__ = original
        return backward

    def _before_backward(self, loss) -> None:
        self.losses.flush_eval()
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            value = loss.item()
        else:
            value = None
        self._site("backward")
        if self._active_loader is not None and self._active_loader not in self._train_loaders:
            self._train_loaders.add(self._active_loader)
            ref = self._loader_refs.get(self._active_loader)
            if self.keeper.train_loader is None and ref is not None:
                self.keeper.train_loader = ref()
        if not self._models:
            self._discover(sys._getframe(), None)
        if value is not None and not math.isfinite(value) and not self._nonfinite_seen:
            self._nonfinite_seen = True
            self.rec.emit("nonfinite", step=self.rec.step, what="loss", value=str(value),
                          module=self._localize(), replay=self._replay,
                          **({"in_weights": True} if self._in_weights else {}))
        self._backwards += 1
        if self._mode == "backward":
            self._emit_step(value, None)
        else:
            self._pending_losses.append(value)
            if self._mode is None and len(self._pending_losses) >= _BACKWARD_MODE_AFTER:
                self._mode = "backward"
                for loss_value in self._pending_losses:
                    self._emit_step(loss_value, None)
                self._pending_losses = []

    # -- model discovery and non-finite localization ---------------------------------------
    def _discover(self, frame, params) -> None:
        """Find the nn.Module(s) being trained: in the user's frames first, then via gc."""
        wanted = {id(p) for p in params} if params is not None else None
        candidates = []
        f = user_frame(frame)
        depth = 0
        while f is not None and depth < 8:
            for scope in (f.f_locals, f.f_globals):
                for name, obj in list(scope.items()):
                    if isinstance(obj, torch.nn.Module):
                        candidates.append((name, obj, f.f_globals))
            f, depth = f.f_back, depth + 1
        if not candidates and wanted is not None:
            with warnings.catch_warnings():  # some torch objects warn on isinstance checks
                warnings.simplefilter("ignore")
                candidates = [("model", o, None) for o in gc.get_objects()
                              if isinstance(o, torch.nn.Module)]
        best = None
        for name, module, namespace in candidates:
            ids = [id(p) for p in module.parameters()]
            score = len(wanted.intersection(ids)) if wanted is not None else len(ids)
            if score and (best is None or score > best[0]):
                best = (score, name, module, namespace)
        if best is None:
            return
        _, name, model, namespace = best
        if id(model) in self._models:
            return
        self._models[id(model)] = (weakref.ref(model), name)
        for pname, p in model.named_parameters():
            self._param_names[id(p)] = pname
            self._param_modules[id(p)] = pname.rsplit(".", 1)[0] if "." in pname else "(root)"
        self._plans.clear()
        self._root = weakref.ref(model)
        modules = [n for n, m in model.named_modules() if n and not list(m.children())]
        self.rec.emit("model", name=name, cls=type(model).__name__,
                      params=sum(p.numel() for p in model.parameters()), modules=modules[:500],
                      training=model.training)
        self._ref("model", definition_location(model) or assignment(namespace, name), name=name)
        handle = model.register_forward_pre_hook(self._keep_input, with_kwargs=True)
        self._undo.append(handle.remove)
        self.keeper.on_model(model, namespace)

    def _keep_input(self, module, args, kwargs):
        self._last_input = (args, kwargs)

    def _localize(self) -> str | None:
        """Name the first module holding non-finite weights or producing non-finite output.

        Sets ``self._replay``: "nonfinite" when replaying the batch repeats the problem,
        "finite" when the same inputs, weights and loss give a finite value (not reproducible:
        a hardware suspicion), None when no replay was possible.
        """
        self._replay = None
        self._in_weights = False
        model = self._root() if self._root else None
        if model is None:
            return None
        for name, p in model.named_parameters():
            if not torch.isfinite(p.detach()).all():
                self._in_weights = True  # an earlier update (a gradient) put them there
                return name.rsplit(".", 1)[0] if "." in name else name
        if self._last_input is None:
            return None
        found, out = replay_first_nonfinite(model, *self._last_input)
        if found is None and isinstance(out, torch.Tensor) and self._last_loss_call is not None:
            # the same batch through the same weights and loss: does the non-finite value repeat?
            name, target, kwargs, shape = self._last_loss_call
            fn = patches.original(torch.nn.functional, name)
            try:
                with torch.no_grad():
                    value = fn(out.reshape(shape), target, **kwargs)
                self._replay = "finite" if bool(torch.isfinite(value).all()) else "nonfinite"
            except (RuntimeError, ValueError, TypeError):
                self._replay = None
        elif found is not None:
            self._replay = "nonfinite"
        return found

    # -- optimizer -------------------------------------------------------------------------
    def _wrap_opt_init(self, original):
        link = self._link

        def __init__(opt, *args, **kwargs):
            original(opt, *args, **kwargs)
            inst = link()
            if inst is not None and opt not in inst._seen_optimizers:
                inst._guard(inst._on_new_optimizer)(opt)

        __init__.__wrapped__ = original
        return __init__

    def _on_new_optimizer(self, opt) -> None:
        self._seen_optimizers.add(opt)
        self._optimizers_built += 1
        self.keeper.on_optimizer(opt)
        loc = user_location(sys._getframe())
        self._ref("optimizer", loc, cls=type(opt).__name__)
        where = (loc or {}).get("file"), (loc or {}).get("line")
        built = self._built_at[where] = self._built_at.get(where, 0) + 1
        if built <= _OPTIMIZER_EVENTS:  # one built every step: counted in ``calls`` instead
            self.rec.emit("optimizer", cls=type(opt).__name__, hyper=hyper(opt.defaults),
                          location=loc)
        if not self._param_names:
            params = [p for g in opt.param_groups for p in g["params"]]
            self._discover(sys._getframe(), params)

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
        self._step_norms = (_UNMEASURED, None)  # none kept from a step whose optimizer raised
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
            self._ur_stride = _ratio_stride(params)
            self._before = _copy_weights(params, self._ur_stride)
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
        norms = _norms([p.grad for p in params], host, rest)
        total = math.sqrt(sum([n * n for n in norms]))
        if not math.isfinite(total) and not self._nonfinite_seen:
            self._nonfinite_seen = True
            bad = [m for m, v in _per_module(modules, norms).items() if not math.isfinite(v)]
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
            host = [i for i, p in enumerate(params) if _on_host(p.grad)]
            rest = sorted(set(range(len(params))) - set(host))
            modules = [self._param_modules.get(id(p)) or f"param{i}" for i, p in enumerate(params)]
            plan = self._plans[key] = (host, rest, modules)
        return plan

    def _histograms(self, params) -> None:
        """Histograms of the gradients; a sparse one's histogram is of its stored values.

        The event's ``numel`` counts the values histogrammed before striding (``sparse``: the
        stored values of a sparse gradient).
        """
        for p in params[:64]:
            sparse = p.grad.layout != torch.strided
            g = _dense_values(p.grad).flatten()
            numel = g.numel()
            if numel == 0:
                continue
            stride = -(-numel // _HIST_SAMPLE)
            inner = numel // max(1, p.grad.shape[0]) if p.grad.dim() and not sparse else 1
            while stride > 1 and math.gcd(stride, inner) > 1:  # not one kernel tap of a conv
                stride += 1
            g = (g[::stride] if stride > 1 else g).float()
            lo, hi = torch.aminmax(g)
            lo, hi = float(lo), float(hi)
            if not (math.isfinite(lo) and math.isfinite(hi)):  # rare: copy the finite values
                g = g[torch.isfinite(g)]
                if g.numel() == 0:
                    continue
                lo, hi = float(g.min()), float(g.max())
            counts = torch.histc(g, bins=30, min=lo, max=hi if hi > lo else lo + 1e-12)
            extra = {"sparse": True} if sparse else {}
            self.rec.emit("hist", step=self.rec.step, param=self._param_names.get(id(p), "?"),
                          lo=lo, hi=hi, counts=[int(c) for c in counts.tolist()],
                          numel=int(numel), stride=stride, **extra)

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
                ratio = _update_ratio(before, self._before_params, self._ur_stride)
            except (TypeError, ValueError, RuntimeError):  # weights replaced by the step
                ratio = None
        losses = [v for v in self._pending_losses if v is not None]
        self._pending_losses = []
        loss = sum(losses) / len(losses) if losses else None
        gn, parts = self._step_norms
        self._step_norms = (None, None)
        self._emit_step(loss, gn, parts, ratio)

    def _emit_step(self, loss, gn, parts=None, ratio=None) -> None:
        """Keep one step's numbers as a row; rows become ``step`` events in :meth:`_drain`."""
        now = time.perf_counter()
        dt = now - self._last_step_end if self._last_step_end is not None else None
        self._last_step_end = now
        if self._norm_auto and dt is not None:
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
        self._rows.append((self.rec.step, self.rec.epoch, loss, gn, parts, dt, self._data_wait,
                           rss, ratio, None if root is None else root.training, cuda))
        self._data_wait = 0.0
        self.rec.step += 1
        if self._norm_auto and self.rec.step >= self._retune_at:
            self._retune_norms()
        if now - self._drained >= FLUSH_SECONDS:
            self._drain()
            self.rec.flush()  # on disk now: a killed run loses at most FLUSH_SECONDS of steps
        if self.cfg.hist_every and self.rec.step % self.cfg.hist_every == 0:
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

    def _step_event(self, i, ep, loss, gn, parts, dt, dw, rss, ratio, training, cuda) -> dict:
        """One kept row as the fields of a ``step`` event."""
        step = {"i": i, "ep": ep, "loss": _num(loss), "dt": dt, "dw": dw}
        if rss is not None:
            step["rss"] = rss
        if gn is not _UNMEASURED:  # left out: not measured (norm_every); None: no gradient
            step["gn"] = _num(gn)
        if parts:
            step["mgn"] = {k: _num(v) for k, v in self._window(_per_module(*parts)).items()}
        if ratio is not None:
            step["ur"] = _num(ratio)
        if training is not None:
            step["tm"] = training
        if cuda is not None:
            step["cuda"], step["cuda_peak"] = cuda[0], cuda[1]
            if len(cuda) > 2:
                step["gpu_util"] = cuda[2]
        return step

    def _window(self, per_module: dict) -> dict:
        """This step's modules in ``mgn`` (bounded, see :mod:`.norms`)."""
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

    # -- data loading ----------------------------------------------------------------------
    def _wrap_loader_iter(self, original):
        link = self._link

        def __iter__(loader):
            it = original(loader)
            inst = link()
            if inst is None:
                return it
            inst._guard(inst._on_loader_iter)(loader)
            return TimedIterator(it, link, id(loader))

        __iter__.__wrapped__ = original
        return __iter__

    def _on_loader_iter(self, loader) -> None:
        self._loader_refs[id(loader)] = weakref.ref(loader)
        if id(loader) in self._train_loaders:  # a training loader iterated again: next epoch
            self.losses.flush_eval()
            self.rec.set_epoch(self.rec.epoch + 1, "dataloader")

    # -- losses ----------------------------------------------------------------------------
    def _wrap_loss(self, original, name: str):
        link = self._link

        def loss_fn(input, target, *args, **kwargs):
            out = original(input, target, *args, **kwargs)
            inst = link()
            if inst is None:
                return out
            try:
                if inst._steady_loss == name and torch.is_grad_enabled():
                    # nothing left to keep: the replay's loss call, and the targets counted
                    inst._last_loss_call = (name, target, kwargs, input.shape)
                    inst.losses.count(name, input, target, out)
                else:
                    inst.losses.observe(name, input, target, out)
                    inst._keep_loss(name, input, target, args, kwargs)
            except Exception:  # noqa: BLE001 - observation must never break training
                pass
            return out

        loss_fn.__wrapped__ = original
        return loss_fn

    def _keep_loss(self, name, input, target, args, kwargs) -> None:
        if not isinstance(target, torch.Tensor) or not isinstance(input, torch.Tensor):
            return
        if self.losses.targets["loss"] not in (None, name):
            return
        if torch.is_grad_enabled():
            self._last_loss_call = (name, target, kwargs, input.shape)
        training = torch.is_grad_enabled()
        described = self.keeper.on_loss(name, input, target, args, kwargs, self._last_input,
                                        training, self.rec.epoch)
        if described is not None:
            self.rec.emit("loss_input", **described)
        if training and self.losses.targets["loss"] == name and \
                not self.losses.counting_all() and not self.keeper.sampling(True, self.rec.epoch):
            self._steady_loss = name  # the training loss from now on takes the short path


def _per_module(modules: list[str], norms: list[float]) -> dict[str, float]:
    """Sum per-parameter norms into per-module norms (the root of the sum of squares)."""
    acc: dict[str, float] = {}
    for mod, n in zip(modules, norms):
        acc[mod] = acc.get(mod, 0.0) + n * n
    return {k: math.sqrt(v) for k, v in acc.items()}


def _norms(grads: list, host: list[int], rest: list[int]) -> list[float]:
    """L2 norm of each gradient.

    Parameters
    ----------
    grads : list of Tensor
    host, rest : list of int
        Indices measured on the host with NumPy (dense float32/float64 CPU tensors: a BLAS dot
        through a NumPy view costs a fraction of a torch kernel launch, and is faster on large
        tensors too) and with one multi-tensor norm kernel, read with one device-to-host copy.
    """
    norms = [0.0] * len(grads)
    try:
        with np.errstate(all="ignore"):  # an overflow is inf, as in torch's own norm (> 1.8e19)
            for i in host:
                a = grads[i].numpy().ravel()
                if a.dtype.itemsize < 4:  # the plan is stale (model.half() mid-run)
                    raise TypeError(a.dtype)
                norms[i] = math.sqrt(a.dot(a))
    except (RuntimeError, TypeError):  # a gradient that needs grad (create_graph=True), ...
        host, rest = [], list(range(len(grads)))
    if rest:
        with torch.no_grad():
            try:
                values = floats(torch._foreach_norm([grads[i] for i in rest]))
            except (RuntimeError, NotImplementedError):  # sparse (nn.Embedding(sparse=True))
                values = floats([torch.linalg.vector_norm(_dense_values(grads[i]))
                                 for i in rest])
        for k, i in enumerate(rest):
            norms[i] = values[k]
    return norms


def _on_host(t) -> bool:
    """A dense float32/float64 CPU tensor: NumPy reads it through a view, without a kernel."""
    return t.device.type == "cpu" and t.layout == torch.strided and \
        t.dtype in (torch.float32, torch.float64)


def _ratio_stride(params: list) -> int:
    """1 (every weight), or :data:`UR_STRIDE` when copying them all would cost over
    :data:`UR_FULL_BYTES` of RAM: the ratio is then measured on every 17th weight of each
    tensor (a prime stride: not one column of each row), a copy of 6% of the weights."""
    size = sum(p.numel() * p.element_size() for p in params)
    return UR_STRIDE if size > UR_FULL_BYTES else 1


def _sample(p, stride: int, host: bool):
    """The weights of ``p`` compared for the ratio: all, or every ``stride``-th (a view)."""
    if host:
        a = p.detach().numpy()
        return a.ravel()[::stride] if stride > 1 else a
    t = p.detach()
    return t.reshape(-1)[::stride] if stride > 1 else t


def _copy_weights(params: list, stride: int = 1) -> list:
    """Copies of the weights before a step (for the update/weight ratio).

    Host tensors are copied by NumPy (its buffers come from malloc and are reused, where a
    tensor of a few MB is freshly mapped and page-faulted on every copy); others by torch.
    With ``stride`` > 1 only every ``stride``-th weight is copied.
    """
    return [_sample(p, stride, True).copy() if _on_host(p) else _sample(p, stride, False).clone()
            for p in params]


def _update_ratio(before: list, params: list, stride: int = 1) -> float | None:
    """||weights after - weights before|| / ||weights before|| over all parameters.

    ``before`` is consumed (it ends up holding minus the update); ``stride`` as it was copied.
    """
    num = den = 0.0
    rest = []
    with np.errstate(all="ignore"):
        for b, p in zip(before, params):
            if isinstance(b, np.ndarray):
                den += float(np.vdot(b, b))
                np.subtract(b, _sample(p, stride, True), out=b)
                num += float(np.vdot(b, b))
            else:
                rest.append((b, _sample(p, stride, False)))
    if rest:
        with torch.no_grad():
            b, a = [r[0] for r in rest], [r[1] for r in rest]
            weights = floats(torch._foreach_norm(b))
            torch._foreach_sub_(b, a)
            updates = floats(torch._foreach_norm(b))
        den += sum(w * w for w in weights)
        num += sum(u * u for u in updates)
    return math.sqrt(num) / math.sqrt(den) if den > 0 else None


def _dense_values(grad):
    """The stored values of a gradient: a sparse one's non-zeros (summed where repeated)."""
    if grad.layout == torch.sparse_coo:
        return grad.detach().coalesce().values()
    if grad.layout != torch.strided:  # compressed sparse layouts store no duplicates
        return grad.detach().values()
    return grad.detach()
