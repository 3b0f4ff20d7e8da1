"""Model hooks of the PyTorch instrument (mixed into ``TorchInstrument``).

Which model trains, its inputs, and where a non-finite value comes from.

What they record:

- the model being trained, found in the user's frames (or, given the optimizer's parameters,
  among every live ``nn.Module``): a ``model`` event (name, class, parameter count, leaf
  modules, training flag) and its ``ref`` (where it is defined or assigned); the keeper gets it
  for Isolate;
- a forward pre-hook on that model keeps the last batch's inputs, so that a non-finite loss
  can be localized: the first module holding non-finite weights, or producing a non-finite
  output when the last forward is replayed (``module``, ``replay``, ``in_weights`` of the
  ``nonfinite`` event written by the backward hook).

State owned here: the models seen, parameter names and owning modules, the root model, the
last inputs and the replay's verdict.
"""

from __future__ import annotations

import gc
import sys
import warnings
import weakref

import torch

from . import patches
from ._util import forward_fields
from .codeloc import (
    assignment,
    definition_location,
    frame_span,
    user_frame,
    user_location,
)
from .torch_util import replay_first_nonfinite


class ModelHooks:
    """Discovery of the trained model, its last inputs, localization of non-finite values."""

    def _init_model_state(self) -> None:
        self._models: dict[int, tuple] = {}  # id(model) -> (weakref, name)
        self._param_names: dict[int, str] = {}
        self._next_search = 0  # the optimizer step of the next search for the model (gc)
        self._param_modules: dict[int, str] = {}  # id(param) -> owning module's name
        self._root = None
        self._last_input = None
        self._fwd_open = 0  # training forwards entered and not yet left
        self._eval_seen = False  # the first evaluation forward's line is referenced
        self._nonfinite_seen = False
        self._replay = None
        self._forward: dict = {}
        self._in_weights = False

    def _let_go_model(self) -> None:
        self._last_input = None
        self._models.clear()
        self._root = None

    # -- discovery -------------------------------------------------------------------------
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
                        candidates.append((name, obj, f.f_globals, frame_span(f, scope)))
            f, depth = f.f_back, depth + 1
        if not candidates and wanted is not None:
            with warnings.catch_warnings():  # some torch objects warn on isinstance checks
                warnings.simplefilter("ignore")
                candidates = [("model", o, None, None) for o in gc.get_objects()
                              if isinstance(o, torch.nn.Module)]
        best = None
        for name, module, namespace, span in candidates:
            ids = [id(p) for p in module.parameters()]
            score = len(wanted.intersection(ids)) if wanted is not None else len(ids)
            if score and (best is None or score > best[0]):
                best = (score, name, module, namespace, span)
        if best is None:
            return
        _, name, model, namespace, span = best
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
        self.ref("model", definition_location(model) or assignment(namespace, name, span),
                 name=name)
        self.hold(model.register_forward_pre_hook(self._keep_input, with_kwargs=True))
        self.hold(model.register_forward_hook(self._forward_done, always_call=True))
        self.keeper.on_model(model, namespace)

    # -- non-finite values ------------------------------------------------------------------
    def _keep_input(self, module, args, kwargs):
        if self._eval_watch is not None:  # the model runs again: its own ops are not watched
            self._guarded_unwatch()
        self._last_input = (args, kwargs)
        grad = torch.is_grad_enabled()
        if not self._eval_seen and self._opt_steps and not (grad and module.training):
            self._eval_seen = True  # where validation inputs enter the model (``eval_forward``)
            self.ref("eval_forward", user_location(sys._getframe()))
        if grad:  # a training forward: part of the step's own work
            if self._detail:  # (timed on the steps with full detail: torch_steps)
                if not self._fwd_open:
                    self._forward_started()
                self._busy_enter()
            self._fwd_open += 1

    def _forward_done(self, module, args, out):
        if self._fwd_open:
            self._fwd_open -= 1
            if self._detail:  # (see _keep_input; a lean step watches no output)
                self._training_output(out)
        if not torch.is_grad_enabled() and self._opt_steps:
            self._guarded_eval_output(module, out)  # labels a hand-written score compares with

    def _training_output(self, out) -> None:
        """A training forward ended on a step with full detail: its time, its output watched."""
        if not self._fwd_open:
            self._forward_ended()
        self._busy_exit()
        first = out if isinstance(out, torch.Tensor) else next(
            (v for v in (out.values() if isinstance(out, dict) else
                         out if isinstance(out, (tuple, list)) else ())
             if isinstance(v, torch.Tensor)), None)
        if first is not None and first.grad_fn is not None:
            self._watch_graph(first, outputs=True)  # predictions kept step after step
            self._watch_pairing(first)  # the gradient the loss gives each prediction

    def _localize(self) -> str | None:
        """Name the first module holding non-finite weights or producing non-finite output.

        Sets ``self._replay``: "nonfinite" when replaying the batch repeats the problem,
        "finite" when the same inputs, weights and loss give a finite value (not reproducible:
        a hardware suspicion), None when no replay was possible; and ``self._forward``
        (:func:`~._util.forward_fields`) when the replayed model output was finite.
        """
        self._replay = None
        self._forward = {}
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
        if found is None and isinstance(out, torch.Tensor) and out.is_floating_point():
            self._forward = forward_fields(out.detach().float().cpu().numpy())  # (bf16 too)
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
