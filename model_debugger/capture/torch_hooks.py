"""Hooks the user's code registers on modules, counted per call site (the ``hooks`` event).

A forward hook registered inside the training loop and never removed (``model[3].
register_forward_hook(save)`` every step, the handle dropped) adds one more hook each step:
every forward then runs all of them, and whatever they store grows with the run. The capture
wraps ``nn.Module.register_forward_hook`` (and the pre-hook and full backward variants): a
call from a user file counts for its line, and the returned handles are kept (up to
:data:`MAX_HANDLES` per line) so that the end of the run can say how many are still
registered. Registrations made by libraries or by this package are not counted.
"""

from __future__ import annotations

import sys

import torch

from .codeloc import is_user_file

METHODS = ("register_forward_hook", "register_forward_pre_hook",
           "register_full_backward_hook", "register_full_backward_pre_hook")
MAX_HANDLES = 4096


def _live(handle) -> bool:
    """Whether the hook behind ``handle`` is still registered."""
    ref = getattr(handle, "hooks_dict_ref", None)
    hooks = ref() if callable(ref) else None
    return hooks is not None and getattr(handle, "id", None) in hooks


class UserHooks:
    """Mixin of :class:`~.torch_instrument.TorchInstrument`: the user's module hooks."""

    def _init_hooks_state(self) -> None:
        self._hook_sites: dict[tuple, list] = {}  # (file, line) -> [registered, handles]

    def _attach_hooks(self) -> None:
        for name in METHODS:
            if hasattr(torch.nn.Module, name):
                self.patch(torch.nn.Module, name, self._wrap_register)

    def _wrap_register(self, original):
        link = self._link

        def register(module, *args, **kwargs):
            handle = original(module, *args, **kwargs)
            inst = link()
            if inst is not None:
                inst.guard(inst._hook_registered)(handle, sys._getframe(1))
            return handle

        register.__wrapped__ = original
        return register

    def _hook_registered(self, handle, frame) -> None:
        if frame is None or not is_user_file(frame.f_code.co_filename):
            return  # this package's own hooks, a library's
        site = self._hook_sites.setdefault((frame.f_code.co_filename, frame.f_lineno), [0, []])
        site[0] += 1
        if len(site[1]) < MAX_HANDLES:
            site[1].append(handle)

    def _emit_hooks(self, steps: int) -> None:
        """One ``hooks`` event per line that registered hooks more than once."""
        for (path, line), (registered, handles) in self._hook_sites.items():
            if registered >= 2:
                self.rec.emit("hooks", file=path, line=line, registered=registered,
                              live=sum(map(_live, handles)), steps=steps)

    def _let_go_hooks(self) -> None:
        self._hook_sites = {}
