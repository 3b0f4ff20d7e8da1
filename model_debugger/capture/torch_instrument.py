"""PyTorch instrumentation: one :class:`TorchInstrument` per Recorder.

It is built from one mixin per concern; every hook and patch is a handle held by the
:class:`~.instrument.Instrument` base and removed when the capture closes.

What is patched while a capture is active (and restored afterwards), and where it is handled:

- ``Tensor.backward`` / ``torch.autograd.backward`` (here): the loss value, the loop's
  ``backward()`` line, a non-finite loss; in a loop without an optimizer each backward is a step;
- global optimizer step pre/post hooks and ``Optimizer.__init__`` (:mod:`.torch_optim`):
  where optimizers are built, gradient norms, histograms, update/weight ratio, one row a step;
  ``clip_grad._clip_grads_with_norm_`` (same module): the norms before a clip;
- the step rows themselves, their timing and memory readings (:mod:`.torch_steps`);
- the model's forward pre-hook, model discovery, non-finite localization (:mod:`.torch_model`);
- ``DataLoader.__iter__`` and ``__init__`` (:mod:`.torch_data`): data-wait time, epochs, and
  where the training loader (its batch size) was made;
- loss functionals, ``F.cross_entropy``, ``F.mse_loss``, ... (:mod:`.torch_losses`): target
  statistics for the constant-predictor baseline, and validation losses computed under
  ``no_grad``;
- ``zero_grad`` of optimizers and modules (here): counted for the ``calls`` event;
- Lightning's and Hugging Face's ``Trainer`` (:mod:`.torch_trainers`), once imported: a callback
  for the metrics they log, their sanity checks and their accumulation's loss scale;
- after an evaluation forward, until the next one, a ``TorchFunctionMode``
  (:mod:`.torch_eval_labels`): the labels a hand-written validation score compares the
  predictions with;
- ``torch.distributed``'s ``init_process_group`` and collectives (:mod:`.torch_dist`): the rank,
  time inside collectives, replica checksums, where a waiting rank waits.
"""

from __future__ import annotations

import math
import sys
import time
import weakref

import torch

from .codeloc import is_user_file, user_location
from .instrument import Instrument
from .keeper import Keeper, same_values
from .torch_data import DataHooks
from .torch_dist import DistHooks
from .torch_eval_labels import EvalLabelHooks
from .torch_hooks import UserHooks
from .torch_losses import BINARY_LOSSES, CLASS_LOSSES, REG_LOSSES, LossHooks
from .torch_model import ModelHooks
from .torch_optim import OptimizerHooks
from .torch_steps import StepRows
from .torch_trainers import TrainerHooks
from .torch_util import nonfinite_op

GRAPH_LAG = 3  # backwards after which a loss tensor still alive is kept by the user's code
_WATCHED = 256  # weak references waiting for GRAPH_LAG backwards, at most
_BACKWARD_MODE_AFTER = 64  # backward() calls without an optimizer step: a loop without one


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


class TorchInstrument(ModelHooks, OptimizerHooks, StepRows, DataHooks, LossHooks, TrainerHooks,
                      DistHooks, UserHooks, EvalLabelHooks, Instrument):
    """Instruments PyTorch training for one Recorder.

    Parameters
    ----------
    rec : Recorder
        Where the events go.

    Attributes
    ----------
    keeper : Keeper
        What Isolate needs once the capture ends (the model, weights, batches, the loader).
    losses : LossStats
        Target statistics and validation losses seen by the loss functionals.
    """

    def __init__(self, rec) -> None:
        super().__init__(rec)
        self.keeper = Keeper()
        self._pending_losses: list[float] = []  # losses of backward() calls since the last step
        self._backwards = 0
        self._bwd_at_step = 0  # backward() calls before the last optimizer step
        self._clear_pending: dict | None = None  # a zero_grad() since a backward, before a step
        self._cleared = [0, None]  # steps whose gradients were cleared first; the first line
        self._in_backward = False
        self._sites: dict[tuple, bool] = {}  # backward()/step() call sites: called by the user?
        self._chains: set[tuple] = set()  # call chains of library callers already located
        self._init_model_state()
        self._init_optimizer_state()
        self._init_step_state()
        self._init_data_state()
        self._init_loss_state()
        self._init_trainer_state()
        self._init_dist_state()
        self._init_hooks_state()
        self._init_eval_label_state()
        self._guarded_eval_output = self.guard(self._eval_output)
        self._guarded_unwatch = self.guard(self._eval_unwatch)
        self._guarded_before_backward = self.guard(self._before_backward)
        self._reset_checked = self._reset_stale = 0  # steps checked / gradients found not reset
        self._reset_param = None
        # losses / outputs: [weak references to the last GRAPH_LAG, looked at again, alive]
        self._graph_counts = {"losses": [[], 0, 0], "outputs": [[], 0, 0]}

    # -- attach / close --------------------------------------------------------------------
    def attach(self) -> None:
        """Install the hooks and patches (each one held until :meth:`close`)."""
        from torch.optim import optimizer as optim_mod
        from torch.utils.data import DataLoader

        self.rec.before_event(self._drain)
        self.patch(torch.Tensor, "backward", lambda nxt: self._wrap_backward(nxt, True))
        self.patch(torch.autograd, "backward", lambda nxt: self._wrap_backward(nxt, False))
        self.hold(optim_mod.register_optimizer_step_pre_hook(self.guard(self._pre_step)))
        self.hold(optim_mod.register_optimizer_step_post_hook(self.guard(self._post_step)))
        self.patch(optim_mod.Optimizer, "__init__", self._wrap_opt_init)
        from torch.optim import lr_scheduler

        base = getattr(lr_scheduler, "LRScheduler", None) or lr_scheduler._LRScheduler
        self.patch(base, "__init__", self._wrap_scheduler_init)
        from torch.nn.utils import clip_grad

        if hasattr(clip_grad, "_clip_grads_with_norm_"):  # torch >= 2.6
            self.patch(clip_grad, "_clip_grads_with_norm_", self._wrap_clip)
        self.patch(DataLoader, "__iter__", self._wrap_loader_iter)
        self.patch(DataLoader, "__init__", self._wrap_loader_init)
        for owner in (optim_mod.Optimizer, torch.nn.Module):
            self.patch(owner, "zero_grad", self._wrap_zero_grad)
        functional = torch.nn.functional
        for name in CLASS_LOSSES + BINARY_LOSSES + REG_LOSSES:
            if hasattr(functional, name):
                self.patch(functional, name, lambda nxt, name=name: self._wrap_loss(nxt, name))
        self._attach_trainers()
        self._attach_dist()
        self._attach_hooks()
        self._attach_eval_labels()

    def _let_go(self) -> None:
        """After every hook is gone, let go of the user's objects.

        What Isolate needs stays in :attr:`keeper`.
        """
        self._reset_param = None
        self._let_go_model()
        self._let_go_optimizer()
        self._let_go_loss()
        self._let_go_hooks()

    def finish(self) -> None:
        """Flush what is pending when the capture ends (losses without a step, eval losses)."""
        if self._mode is None and self._pending_losses:
            for loss in self._pending_losses:
                self._emit_step(loss, None)
            self._pending_losses = []
        self._drain()
        self.losses.flush_eval()
        self.losses.emit()
        self._emit_overhead()
        self._dist_finish()
        self._emit_passes()
        if self._backwards or self._opt_steps:  # torch imported but not trained: say nothing
            most = max(self._built_at.items(), key=lambda kv: kv[1], default=(None, 0))
            built_at = {"file": most[0][0], "line": most[0][1]} if most[1] > 1 and \
                most[0][0] else None  # the line that built the most optimizers
            if self._reset_checked:
                self.rec.emit("grad_reset", checked=self._reset_checked,
                              not_reset=self._reset_stale)
            losses, outputs = self._graph_counts["losses"], self._graph_counts["outputs"]
            if losses[1] or outputs[1]:
                self.rec.emit("graphs_kept", checked=losses[1], alive=losses[2],
                              outputs_checked=outputs[1], outputs_alive=outputs[2],
                              lag=GRAPH_LAG)
            self._emit_hooks(self._opt_steps)
            if self._cleared[0]:
                self.rec.emit("grads_cleared", steps=self._cleared[0], of=self._opt_steps,
                              location=self._cleared[1])
            self.rec.emit("calls", zero_grad=self.keeper.zero_grad_calls,
                          backward=self._backwards, optimizer_steps=self._opt_steps,
                          optimizers_built=self._optimizers_built, most_built_at=built_at)

    def _check_reset(self) -> None:
        """Whether the gradients were reset since the last optimizer step (``grad_reset``).

        Read on the first backward of a step, before it adds anything: a parameter the last
        step updated still holding a non-zero gradient means the new gradient is added to the
        old one. One small parameter is read (a bias, say), on the steps with full detail
        (:mod:`.torch_steps`): the measurement ``missing_zero_grad`` and Classify use, however
        the loop clears (``zero_grad``, ``p.grad = None``, ``p.grad.zero_()``) or fails to.
        """
        probe = self._reset_probe() if self._reset_param is None else self._reset_param()
        if probe is None:
            return
        self._reset_checked += 1
        grad = probe.grad
        if grad is not None and bool(grad.detach().ne(0).any()):
            self._reset_stale += 1

    def _watch_graph(self, tensor, outputs: bool = False) -> None:
        """Whether the losses (or predictions) of past steps, and their graphs, stay alive.

        A loop that rebinds ``loss`` each step frees the last one (and its graph: every
        activation it saved); one that keeps it (``losses.append(loss)``,
        ``preds.append(model(x))``) keeps them all. Each backward's tensor, and each training
        forward's output, is held by weak reference and looked at again once :data:`GRAPH_LAG`
        backwards have run (every backward counts, so the look-back is in steps whatever the
        forwards per step or the steps with full detail): a trainer may keep the last one or
        two. Only the steps with full detail are watched (:mod:`.torch_steps`).
        """
        counts = self._graph_counts["outputs" if outputs else "losses"]
        refs = counts[0]
        # stamped with the backwards so far: looked at once GRAPH_LAG backwards passed, not
        # GRAPH_LAG forwards (a step that calls the model five times still holds the first
        # outputs in its loss's graph when the fifth is made)
        refs.append((weakref.ref(tensor), self._backwards))
        while refs and self._backwards - refs[0][1] >= GRAPH_LAG:
            old = refs.pop(0)[0]()
            counts[1] += 1
            if old is not None and old.grad_fn is not None:
                counts[2] += 1
        if len(refs) > _WATCHED:  # forwards without a backward (an evaluation with grad on)
            del refs[0]

    def _reset_probe(self):
        """The smallest parameter the last optimizer updated (kept by weak reference)."""
        opt = self._last_opt
        params = [p for g in getattr(opt, "param_groups", ()) for p in g["params"]
                  if p.requires_grad]
        if not params:
            return None
        p = min(params, key=lambda t: t.numel())
        self._reset_param = weakref.ref(p)
        return p

    def _nonfinite_batch(self) -> dict | None:
        """Which part of the batch that gave the first non-finite loss held non-finite values.

        ``{"inputs": rows, "target": rows, "rows": batch rows}`` (rows with at least one NaN or
        inf), or None when the model's inputs and the loss's target were finite: then the
        model made the value, not the data.
        """
        def bad_rows(tensors) -> int:
            worst = 0
            for t in tensors:
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim():
                    worst = max(worst, int((~torch.isfinite(t.detach())).reshape(
                        t.shape[0], -1).any(1).sum()))
            return worst

        out = {}
        target = self._last_loss_call[1] if self._last_loss_call is not None else None
        if self._last_input is not None:
            args, kwargs = self._last_input
            inputs = [*args, *(kwargs or {}).values()]
            if isinstance(target, torch.Tensor):  # HF's labels= input is the loss's target
                inputs = [t for t in inputs if not (isinstance(t, torch.Tensor) and
                                                    same_values(t, target))]
            n = bad_rows(inputs)
            if n:
                out["inputs"] = n
        if target is not None:
            n = bad_rows([target])
            if n:
                out["target"] = n
            if out and isinstance(target, torch.Tensor) and target.dim():
                out["rows"] = int(target.shape[0])
        return out or None

    def _wrap_zero_grad(self, original):
        link = self._link

        def zero_grad(obj, *args, **kwargs):
            inst = link.target
            if inst is not None:
                inst.keeper.zero_grad_calls += 1
                if inst.keeper.zero_grad_calls == 1:  # where gradients are cleared (once)
                    inst.guard(inst.ref)("zero_grad", user_location(sys._getframe()))
                if inst._backwards > inst._bwd_at_step and inst._clear_pending is None and \
                        not inst._in_backward:  # gradients taken, not yet applied: cleared
                    inst._clear_pending = user_location(sys._getframe()) or {}
            return original(obj, *args, **kwargs)

        zero_grad.__wrapped__ = original
        return zero_grad

    # -- code references -------------------------------------------------------------------
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
                self.ref(kind, user_location(frame))
        if not direct:
            chain = (kind, _call_chain(frame))
            if chain not in self._chains:
                if len(self._chains) > 1024:
                    self._chains.clear()
                self._chains.add(chain)
                self.ref(kind, user_location(frame))

    # -- backward --------------------------------------------------------------------------
    def _wrap_backward(self, original, is_method: bool):
        link = self._link

        def backward(*args, **kwargs):
            inst = link.target  # (an attribute: read on every call)
            # the tensor: self of Tensor.backward, or autograd.backward's ``tensors``
            tensor = args[0] if args else kwargs.get("tensors")
            # Tensor.backward calls torch.autograd.backward: observe the outer call only.
            if inst is None or inst._in_backward or \
                    not (is_method or isinstance(tensor, torch.Tensor)):
                return original(*args, **kwargs)
            inst._in_backward = True
            try:
                inst._guarded_before_backward(tensor)
                if not inst._detail:  # a lean step: its backward is not timed apart
                    return original(*args, **kwargs)
                inst._busy_enter()
                try:
                    return original(*args, **kwargs)
                finally:
                    inst._busy_exit()
            finally:
                inst._in_backward = False

        backward.__wrapped__ = original
        return backward

    def _before_backward(self, loss) -> None:
        """The loss of every backward (every step's); on the steps with full detail, more.

        A lean step (:mod:`.torch_steps`) records the loss and counts the backward; a
        non-finite loss turns its step, and the steps after it, to full detail.
        """
        t0 = time.perf_counter()
        if self.losses.eval_losses:
            self.losses.flush_eval()
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            value = loss.item()
        else:
            value = None
        finite = value is None or math.isfinite(value)
        if not finite:
            self._full_detail()
        detail = self._detail
        if detail:
            self._site("backward")
        if self._active_loader is not None:
            self._note_train_loader()
        discovering = not self._models
        if discovering:
            self._discover(sys._getframe(), None)
        if not finite and not self._nonfinite_seen:
            self._nonfinite_seen = True
            in_batch = self._nonfinite_batch()
            op = nonfinite_op(loss)  # (before backward frees what the graph saved)
            self.rec.emit("nonfinite", step=self.rec.step, what="loss", value=str(value),
                          module=self._localize(), replay=self._replay, **self._forward,
                          **({"in_weights": True} if self._in_weights else {}),
                          **({"in_batch": in_batch} if in_batch else {}),
                          **({"op": op} if op else {}))
        if detail and self._opt_steps and not self._pending_losses and \
                self._mode == "optimizer":
            self._check_reset()
        if not self._backwards and isinstance(loss, torch.Tensor) and loss.grad_fn is not None:
            self._reached = _reached_leaves(loss.grad_fn)
            if torch.is_anomaly_enabled():  # a debugging mode left on: every op keeps a trace
                self.rec.emit("debug_mode", mode="detect_anomaly")
        if detail and isinstance(loss, torch.Tensor) and loss.grad_fn is not None and \
                not discovering:
            # (discovery read the frames' locals: a function frame keeps that snapshot, and
            # with it this loss, alive; it would read as kept by the user)
            self._watch_graph(loss)
        self._backwards += 1
        self._clear_pending = None  # gradients taken again after the clearing: they count
        self._own += time.perf_counter() - t0  # (the step's row times its own part)
        if self._mode == "backward":
            self._emit_step(value, None)
        else:
            self._pending_losses.append(value)
            if self._mode is None and len(self._pending_losses) >= _BACKWARD_MODE_AFTER:
                self._mode = "backward"
                for loss_value in self._pending_losses:
                    self._emit_step(loss_value, None)
                self._pending_losses = []


def _reached_leaves(fn, limit: int = 20000) -> set[int]:
    """Ids of the parameters (``nn.Parameter`` leaves) a backward from ``fn`` accumulates into.

    A walk of the autograd graph (``AccumulateGrad`` nodes hold their ``variable``), at most
    ``limit`` nodes: the first backward only. A plain leaf (a detached prediction made to
    require grad again) is no parameter.
    """
    seen, out, stack = set(), set(), [fn]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        var = getattr(node, "variable", None)
        if isinstance(var, torch.nn.Parameter):
            out.add(id(var))
        stack.extend(nxt for nxt, _ in getattr(node, "next_functions", ()))
    return out
