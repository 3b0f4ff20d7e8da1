"""The base of every framework instrument: it owns every undo handle and removes them on close.

An instrument reaches the world through hooks and patches. Each one it installs is registered
here as it is made (:meth:`Instrument.hold`, :meth:`Instrument.patch`): a torch hook handle, a
global optimizer step hook, a layer of :mod:`.patches`, a callable that puts an attribute back.
:meth:`Instrument.close` cuts the :class:`~.patches.Link` the installed wrappers reach the
instrument through, then undoes every handle in the reverse order of registration, going on
past one that raises, and lets go of the user's objects (:meth:`Instrument._let_go`). No
instrument keeps a list of handles of its own.

The instrument also owns what both frameworks record the same way: a failure inside an
observation is one ``internal_error`` event (:meth:`Instrument.guard`) and a line of the user's
code is one ``ref`` event per kind and line (:meth:`Instrument.ref`).

Importing this module imports neither torch nor tensorflow.
"""

from __future__ import annotations

from collections.abc import Callable

from . import patches


class Instrument:
    """Instruments one framework for one Recorder; the owner of every undo handle.

    Parameters
    ----------
    rec : Recorder
        Where the events go; its ``config`` is the instrument's :attr:`cfg`.

    Attributes
    ----------
    undo_errors : list of Exception
        What undos that failed in :meth:`close` raised (the others were still undone).
    """

    def __init__(self, rec) -> None:
        self.rec = rec
        self.cfg = rec.config
        self._link = patches.Link(self)  # what the patched functions reach this through
        self._undo: list[Callable[[], None]] = []
        self._refs_seen: set[str] = set()
        self._internal_seen = False
        self.undo_errors: list[Exception] = []

    # -- handles ---------------------------------------------------------------------------
    def hold(self, handle) -> None:
        """Register an undo: a handle with ``remove()`` (torch hooks) or a callable.

        Parameters
        ----------
        handle : object
            ``handle.remove()`` or ``handle()`` undoes what was installed; called once, by
            :meth:`close`.
        """
        remove = getattr(handle, "remove", None)
        self._undo.append(remove if callable(remove) else handle)

    def patch(self, owner, name: str, factory: Callable) -> None:
        """Stack ``factory(next)`` over ``owner.name`` until :meth:`close` (see :mod:`.patches`).

        An inherited attribute is deleted again when the capture ends: the class dict is as
        before.
        """
        self.hold(patches.install(owner, name, factory))

    def close(self) -> None:
        """Remove every hook and patch, in reverse order, and let go of the user's objects.

        Idempotent. An undo that raises does not keep the others in place: an ``Exception`` is
        kept in :attr:`undo_errors`, anything else (a ``KeyboardInterrupt``) is raised once every
        undo ran. Wrappers that something else kept (torch._dynamo snapshots ``Tensor`` methods,
        a traced step) only call through from now on.
        """
        self._link.cut()
        interrupt = None
        try:
            while self._undo:
                undo = self._undo.pop()
                try:
                    undo()
                except Exception as exc:  # noqa: BLE001 - one failing undo keeps no other in place
                    self.undo_errors.append(exc)
                except BaseException as exc:  # noqa: BLE001 - raised once all are undone
                    interrupt = interrupt or exc
        finally:
            self._let_go()
        if interrupt is not None:
            raise interrupt

    def _let_go(self) -> None:
        """After the undos: drop references to the user's objects (overridden)."""

    def finish(self) -> None:
        """Write what is pending when the capture ends, before :meth:`close` (overridden)."""

    # -- recording -------------------------------------------------------------------------
    def guard(self, fn: Callable) -> Callable:
        """``fn`` wrapped so that a failure in it never breaks the user's training.

        The first failure of the instrument is recorded as an ``internal_error`` event; the
        wrapper then returns None and training carries on.
        """
        def guarded(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - observation must never break training
                if not self._internal_seen:
                    self._internal_seen = True
                    self.rec.emit("internal_error", where=getattr(fn, "__name__", "?"),
                                  error=f"{type(exc).__name__}: {exc}"[:500])
                return None

        return guarded

    def ref(self, kind: str, loc: dict | None, **extra) -> None:
        """Record a ``ref`` event for a line of the user's code, once per kind and line."""
        if loc is None:
            return
        key = f"{kind}:{loc['file']}:{loc['line']}"
        if key not in self._refs_seen:
            self._refs_seen.add(key)
            self.rec.emit("ref", kind=kind, **loc, **extra)
