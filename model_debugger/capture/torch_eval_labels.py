"""Validation labels that a hand-written score compares the model's predictions with.

A loop that scores validation by hand, ``(model(xv).argmax(1) == yv).float().mean()``, calls no
loss on it, so :mod:`.torch_losses` never sees ``yv`` and the keeper holds no validation batch:
the probes that read validation (a renumbering of its classes, a shift of its inputs) cannot
run. Here, after an evaluation forward (under ``no_grad`` or ``inference_mode``, once training
has stepped) and while the keeper still samples validation, a ``TorchFunctionMode`` watches the
torch calls of the user's code until the next forward of the model. Class ids taken from that
output (``argmax``, the indices of ``max``/``topk``, a threshold or a rounding of a score,
after any elementwise transform of it) compared with ``==``/``eq`` to an untracked tensor of as
many values make that tensor the forward's labels: kept as a validation batch beside the
forward's inputs (:meth:`~.keeper.Keeper.on_eval_labels`), with an ``eval_labels`` reference to
where they were assigned, or to the comparison. Nothing is intercepted outside those stretches,
nor inside the model's own forward (the next forward's pre-hook ends the watch before it runs).
A mode re-dispatches a call to a patched function through its module name, so the patched
losses and ``backward`` observe only their outermost call. The watch starts only on an empty
mode stack (never beside a user's mode or a ``torch.device`` context), is taken off the stack
wherever it sits when it ends, follows at most :data:`MAX_OPS` calls and lets go of every
tensor once it found the labels; under ``torch.compile`` it follows nothing.

Mixed into ``TorchInstrument``.
"""

from __future__ import annotations

import sys

import torch
from torch.overrides import TorchFunctionMode

from .codeloc import assignment, frame_span, is_user_file, user_frame, user_location
from .keeper import same_memory

# the model's scores, and what stays a score: elementwise or shape-only transforms of one
_SCORE_OPS = frozenset({
    "softmax", "log_softmax", "sigmoid", "exp", "squeeze", "unsqueeze", "view", "reshape",
    "flatten", "detach", "cpu", "cuda", "to", "float", "double", "contiguous", "clone",
    "__getitem__", "select", "narrow", "__mul__", "mul", "__add__", "add", "__sub__", "sub",
    "__truediv__", "div", "__neg__", "neg"})
# class ids made from a score: the label it picks
_ID_OPS = frozenset({"argmax", "__gt__", "gt", "__ge__", "ge", "round", "max", "topk"})
# what stays class ids
_ID_KEEP = frozenset({"squeeze", "unsqueeze", "view", "reshape", "flatten", "detach", "cpu",
                      "cuda", "to", "long", "int", "float", "type", "contiguous", "clone",
                      "__getitem__", "select"})
_EQ = frozenset({"eq", "__eq__"})
MAX_OPS = 2000  # calls followed after one evaluation forward at most


class _Watch(TorchFunctionMode):
    """Follows one evaluation output through the user's calls to the comparison with labels."""

    def __init__(self, owner, output: torch.Tensor, model_input) -> None:
        super().__init__()
        self.owner = owner
        self.model_input = model_input
        self.scores = {id(output): output}  # strong references: the ids stay meaningful
        self.ids: dict[int, torch.Tensor] = {}
        self.done = False
        self.ops = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.done and not torch.compiler.is_compiling():  # (nothing to trace into)
            self.ops += 1
            try:
                self._follow(getattr(func, "__name__", ""), args, out)
            except Exception:  # noqa: BLE001 - observation must never break the user's code
                self.finish()
            if self.ops >= MAX_OPS:
                self.finish()
        return out

    def finish(self) -> None:
        """Stop following: let go of every tensor (the mode stays until the next forward)."""
        self.done = True
        self.scores, self.ids, self.model_input = {}, {}, None

    def _follow(self, name: str, args, out) -> None:
        first = args[0] if args else None
        if name in _EQ and len(args) == 2:
            for mine, other in ((args[0], args[1]), (args[1], args[0])):
                if id(mine) in self.ids and isinstance(other, torch.Tensor) and \
                        id(other) not in self.ids and id(other) not in self.scores and \
                        other.numel() == mine.numel() and other.dim() >= 1 and \
                        not other.requires_grad and other.dtype != torch.bool:
                    model_input = self.model_input
                    self.finish()
                    self.owner._eval_labels_found(model_input, other)
                    return
            return
        if not isinstance(first, torch.Tensor):
            return
        if id(first) in self.scores:
            if name in _ID_OPS:
                if name in ("max", "topk"):  # (values, indices) when along a dimension
                    indices = getattr(out, "indices", None)
                    if isinstance(indices, torch.Tensor):
                        self.ids[id(indices)] = indices
                elif isinstance(out, torch.Tensor):
                    self.ids[id(out)] = out
            elif name in _SCORE_OPS and isinstance(out, torch.Tensor):
                self.scores[id(out)] = out
        elif id(first) in self.ids and name in _ID_KEEP and isinstance(out, torch.Tensor):
            self.ids[id(out)] = out


class EvalLabelHooks:
    """The watch over an evaluation output, from its forward's end to the next forward."""

    def _init_eval_label_state(self) -> None:
        self._eval_watch: _Watch | None = None
        self._eval_labels_noted = False

    def _attach_eval_labels(self) -> None:
        self.hold(self._eval_unwatch)

    def _eval_output(self, module, out) -> None:
        """After an evaluation forward: watch its output when validation is still sampled."""
        self._eval_unwatch()
        if not self._opt_steps or torch.is_grad_enabled() or \
                self._last_input is None or not self.keeper.wants_eval_labels(self.rec.epoch) \
                or torch._C._len_torch_function_stack() or torch.compiler.is_compiling():
            return  # (under another mode, the user's or a device context: never beside it)
        if not isinstance(out, torch.Tensor):
            logits = out.get("logits") if hasattr(out, "get") else None
            out = logits if isinstance(logits, torch.Tensor) else next(
                (v for v in (out.values() if isinstance(out, dict) else
                             out if isinstance(out, (tuple, list)) else ())
                 if isinstance(v, torch.Tensor)), None)
        if out is None or out.dim() < 1:
            return
        watch = _Watch(self, out, self._last_input)
        watch.__enter__()
        self._eval_watch = watch

    def _eval_unwatch(self) -> None:
        """End the watch (at the next forward, or when the capture closes)."""
        watch, self._eval_watch = self._eval_watch, None
        if watch is None:
            return
        watch.finish()
        _remove_mode(watch)

    def _eval_labels_found(self, model_input, labels: torch.Tensor) -> None:
        """The comparison named the labels: keep them with the forward's inputs.

        The first time, the ``eval_labels`` reference: where the outermost of the user's frames
        holding the labels under a name assigned them (``yv = ...`` in the loop that calls an
        ``evaluate(net, xv, yv)``; ``made``), else the comparison's line (where they are used).
        """
        target = _as_training_targets(labels.detach(), self.keeper.train_batches)
        if target is None:
            return
        if not self._eval_labels_noted:
            self._eval_labels_noted = True
            frame = sys._getframe()
            made = _made_at(labels, frame)
            self.ref("eval_labels", made or user_location(frame), made=made is not None)
        self.keeper.on_eval_labels(model_input, target, self.rec.epoch)


def _made_at(labels: torch.Tensor, frame) -> dict | None:
    """Where the outermost user frame (of 8) holding ``labels`` by name assigned that name."""
    found = None
    f, depth = user_frame(frame), 0
    while f is not None and depth < 8:
        if is_user_file(f.f_code.co_filename):
            scopes = (f.f_globals,) if f.f_locals is f.f_globals else (f.f_locals, f.f_globals)
            for scope in scopes:
                name = next((n for n, v in list(scope.items()) if v is labels or
                             isinstance(v, torch.Tensor) and same_memory(v, labels)), None)
                if name is not None:
                    found = assignment(f.f_globals, name, frame_span(f, scope)) or found
                    break
        f, depth = f.f_back, depth + 1
    return found


def _as_training_targets(labels: torch.Tensor, train_batches: list) -> torch.Tensor | None:
    """``labels`` shaped as the kept training targets, or None when they cannot be targets.

    Integer class ids against integer targets, floats against floats (a binary task's
    ``(B, 1)`` column kept as one): what a comparison finds is a target only when it is what
    the training loss was given.
    """
    ref = next((b[1] for b in train_batches), None)
    if ref is None or labels.is_floating_point() != ref.is_floating_point() or \
            labels.dim() < 1:
        return None
    rows = labels.shape[0]
    tail = tuple(ref.shape[1:])
    if tuple(labels.shape[1:]) == tail:
        return labels
    size = 1
    for n in tail:
        size *= n
    return labels.reshape(rows, *tail) if labels.numel() == rows * size else None


def _remove_mode(mode) -> None:
    """Take ``mode`` off torch's function-mode stack wherever it sits (modes above it stay)."""
    from torch.overrides import _get_current_function_mode_stack, _pop_mode, _push_mode

    if not any(m is mode for m in _get_current_function_mode_stack()):
        return
    above = []
    while True:
        top = _pop_mode()
        if top is mode:
            break
        above.append(top)
    for m in reversed(above):
        _push_mode(m)
