"""The time a trainer spends in each callback between steps, measured directly.

A trainer (Keras ``fit``, a Lightning or Hugging Face ``Trainer``) runs its callbacks on the
training thread between two steps: a ``ModelCheckpoint`` that saves every batch, a
``TensorBoard(update_freq=1)``, a callback of the user's that evaluates or logs. The step rows
measure the model's own work; what the rest of each step is spent on is measured here: each
callback's per-batch hooks are timed for the duration of one ``fit``/``train`` (an attribute of
the instance, removed when it returns), and where each callback was constructed is noted when
it is made.

Shared by both instruments; importing this module imports neither torch nor tensorflow.
"""

from __future__ import annotations

import sys
import time
import weakref

from .codeloc import user_frame

MAX_KEPT = 4096  # call durations kept per callback (for the median call)


class CallbackClock:
    """The callbacks of one ``fit`` with their batch hooks timed, and where each was made."""

    def __init__(self) -> None:
        self._made = weakref.WeakKeyDictionary()  # callback -> where it was constructed
        self._timed: list = []  # [(callback, [seconds, calls], hook names, name, where)]

    def made(self, cb, frame) -> None:
        """Note the user's line constructing ``cb`` (``frame``: inside its ``__init__``)."""
        try:
            if cb not in self._made:
                self._made[cb] = made_at(cb, frame)
        except Exception:  # noqa: BLE001 - unhashable, no weak references: not noted
            pass

    def where(self, cb) -> dict | None:
        """Where ``cb`` was constructed, if noted."""
        try:
            return self._made.get(cb)
        except Exception:  # noqa: BLE001 - an unhashable callback (a dataclass)
            return None

    def time(self, callbacks, hooks: tuple[str, ...], base: type | None) -> None:
        """Time the hooks of each callback that overrides one of ``base``'s ``hooks``."""
        for cb in callbacks:
            if base is not None and not isinstance(cb, base):
                continue
            names = [n for n in hooks if callable(getattr(cb, n, None)) and n not in vars(cb)
                     and getattr(type(cb), n, None) is not getattr(base, n, None)]
            if names:
                spent = [0.0, 0, {}]
                self._timed.append((cb, spent, names, type(cb).__name__, self.where(cb)))
                for name in names:  # (listed first: untime removes whatever was set)
                    setattr(cb, name, timed(getattr(cb, name), spent, name))

    def time_method(self, owner, name: str, label: str, where: dict | None) -> None:
        """Time one method of one object (a trainer's own periodic work: its checkpoints)."""
        method = getattr(owner, name, None)
        if callable(method) and name not in vars(owner):
            spent = [0.0, 0, {}]
            self._timed.append((owner, spent, [name], label, where))
            setattr(owner, name, timed(method, spent, name))

    def untime(self) -> list[dict]:
        """Restore every timed hook; the callbacks' entries of the ``callbacks`` event."""
        out, timed_, self._timed = [], self._timed, []
        for cb, (seconds, calls, hooks), names, label, where in timed_:
            for name in names:
                vars(cb).pop(name, None)
            where = where or {}
            typical = 0.0  # each hook's median call times its calls: a save every N batches
            for count, took in hooks.values():  # is not a save every batch
                took = sorted(took)
                typical += count * took[len(took) // 2] if took else 0.0
            out.append({"cls": label, "seconds": seconds, "calls": calls,
                        "typical_seconds": typical,
                        "file": where.get("file"), "line": where.get("line")})
        return out


def noting_init(link, base: type):
    """A patch of ``base.__init__`` noting where each instance is made.

    ``link()`` is the instrument, whose ``_clock`` is the :class:`CallbackClock`. A class
    without an ``__init__`` of its own (Lightning's and transformers' ``Callback``) calls on
    along the instance's method order, as the inherited one would (a mixin after it included).
    """
    own = "__init__" in vars(base)

    def factory(original):
        def __init__(cb, *args, **kwargs):
            if own:
                original(cb, *args, **kwargs)
            else:
                super(base, cb).__init__(*args, **kwargs)
            inst = link()
            if inst is not None:
                inst._clock.made(cb, sys._getframe(1))

        __init__.__wrapped__ = original
        return __init__

    return factory


def made_at(cb, frame) -> dict | None:
    """The user's line that constructed ``cb``: past the ``__init__`` of its own class."""
    frame = user_frame(frame)
    while frame is not None and frame.f_code.co_name == "__init__" and \
            frame.f_locals.get("self") is cb:
        frame = user_frame(frame.f_back)
    return None if frame is None else {"file": frame.f_code.co_filename, "line": frame.f_lineno}


def timed(method, spent: list, name: str):
    """``method`` (bound), adding its seconds and calls to ``spent``.

    ``spent``: ``[seconds, calls, {name: [calls, durations]}]``, the first
    :data:`MAX_KEPT` durations of each hook kept (for its median call).
    """
    mine = spent[2].setdefault(name, [0, []])

    def hook(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            took = time.perf_counter() - t0
            spent[0] += took
            spent[1] += 1
            mine[0] += 1
            if len(mine[1]) < MAX_KEPT:
                mine[1].append(took)

    hook.__wrapped__ = method
    return hook
