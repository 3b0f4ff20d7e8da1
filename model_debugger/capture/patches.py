"""Patches of shared attributes that stack: any number of recorders, exited in any order.

Every attribute a capture replaces (``torch.Tensor.backward``, ``keras.Model.__call__``,
``sys.stdout``, ...) goes through :func:`install`. Each attribute keeps its original and a list
of layers, one per installing instrument; the installed value is rebuilt from the original
through the layers still present whenever one is added or removed, so an inner recorder that
exits first does not take the outer one's patch with it, and an outer one that exits first does
not leave its wrapper under the inner one's. When the last layer goes, the original object is
put back (``is`` the same object), or deleted when it was inherited: the class dict is as before.

A wrapper handed to the outside world may be kept there (torch._dynamo snapshots
``Tensor`` methods, a module does ``from sys import stdout``): wrappers reach their instrument
through a :class:`Link`, cut when the instrument detaches, after which they only call through.
"""

from __future__ import annotations

from collections.abc import Callable

_MISSING = object()


class Link:
    """A reference to an instrument that is cut when it detaches: ``inst = link()``."""

    __slots__ = ("target",)

    def __init__(self, target) -> None:
        self.target = target

    def __call__(self):
        """The instrument, or None once the link is cut."""
        return self.target

    def cut(self) -> None:
        """Forget the target: wrappers kept elsewhere call the original from now on."""
        self.target = None


class _Slot:
    """One patched attribute: its original and the layers installed over it."""

    def __init__(self, owner, name: str) -> None:
        self.owner = owner
        self.name = name
        vars_ = getattr(owner, "__dict__", {})
        self.own = vars_.get(name, _MISSING)  # the value in the owner's own dict, if any
        self.base = getattr(owner, name)  # what layer 0 wraps (inherited or own)
        self.layers: list[list] = []  # [token, factory]
        self.installed = _MISSING

    def foreign(self) -> bool:
        """Someone else replaced the attribute after our last install."""
        current = getattr(self.owner, self.name, _MISSING)
        return self.installed is not _MISSING and current is not self.installed

    def rebuild(self) -> None:
        if self.foreign():  # replaced on top of ours since: leave theirs, ours call through
            return
        if not self.layers:
            if self.own is _MISSING:
                if self.name in getattr(self.owner, "__dict__", {}):
                    delattr(self.owner, self.name)
            else:
                setattr(self.owner, self.name, self.own)
            self.installed = _MISSING
            return
        value = self.base
        for _token, factory in self.layers:
            value = factory(value)
        setattr(self.owner, self.name, value)
        self.installed = value


_slots: dict[tuple[int, str], _Slot] = {}


def install(owner, name: str, factory: Callable) -> Callable[[], None]:
    """Install ``factory(next)`` over ``owner.name``; return the function that removes it.

    Parameters
    ----------
    owner : object
        A class, a module, ``sys``...
    name : str
        The attribute.
    factory : callable
        ``factory(next_value) -> value``: called again whenever the stack of layers changes
        (``next_value`` is the original or the value built by the layers below).

    Returns
    -------
    callable
        Removes this layer (idempotent) and puts back what the others need, or the original.
    """
    key = (id(owner), name)
    slot = _slots.get(key)
    if slot is None or slot.foreign():  # a foreign value on top: stack over it from now on
        slot = _slots[key] = _Slot(owner, name)
    token = object()
    slot.layers.append([token, factory])
    try:
        slot.rebuild()
    except BaseException:
        slot.layers.pop()
        if not slot.layers:
            _slots.pop(key, None)
        raise

    def remove() -> None:
        if not any(layer[0] is token for layer in slot.layers):
            return
        slot.layers[:] = [layer for layer in slot.layers if layer[0] is not token]
        try:
            slot.rebuild()
        finally:
            if not slot.layers and _slots.get(key) is slot:
                del _slots[key]

    return remove


def original(owner, name: str):
    """``owner.name`` as it was before any capture patched it."""
    slot = _slots.get((id(owner), name))
    return slot.base if slot is not None else getattr(owner, name)


def patched() -> list[tuple[object, str]]:
    """``(owner, name)`` of every attribute with a layer installed now (for tests)."""
    return [(s.owner, s.name) for s in _slots.values() if s.layers]
