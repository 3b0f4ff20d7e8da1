"""The time ``fit`` spends in each of the user's callbacks (mixed into ``KerasInstrument``).

``fit``'s step rows time its train function (``bz``); the rest of each step is its callbacks
and its own bookkeeping. Each callback ``fit`` receives that overrides a batch hook has that
hook timed for the duration of the ``fit`` (:class:`~.callback_clock.CallbackClock`); where
each was made is noted in ``Callback.__init__``. A ``callbacks`` event per ``fit`` lists them.

Importing this module imports neither torch nor tensorflow.
"""

from __future__ import annotations

from .callback_clock import CallbackClock, noting_init

BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


class CallbackTiming:
    """Times the batch hooks of the callbacks a ``fit`` receives; notes where each was made.

    A callback that sets the learning rate (``ReduceLROnPlateau``, ``LearningRateScheduler``)
    is the ``scheduler`` reference, at the line that made it.
    """

    def _init_callbacks(self) -> None:
        self._clock = CallbackClock()

    def _attach_callbacks(self) -> None:
        base = self._keras.callbacks.Callback
        self.patch(base, "__init__", noting_init(self._link, base))
        self.hold(self._clock.untime)  # (a fit that never returned: restored at the end)

    def _time_callbacks(self, callbacks) -> None:
        """Time the overridden batch hooks of each callback ``fit`` received."""
        self._clock.untime()
        if type(callbacks).__name__ == "CallbackList":
            callbacks = getattr(callbacks, "callbacks", None)
        if isinstance(callbacks, (list, tuple)):
            self._clock.time(callbacks, BATCH_HOOKS, self._keras.callbacks.Callback)
            rates = (self._keras.callbacks.ReduceLROnPlateau,
                     self._keras.callbacks.LearningRateScheduler)
            for cb in callbacks:  # a callback that sets the rate: where the schedule is made
                if isinstance(cb, rates):
                    self.ref("scheduler", self._clock.where(cb), cls=type(cb).__name__)

    def _emit_callbacks(self, steps: int) -> None:
        """The ``callbacks`` event of the ``fit`` that just returned; the hooks are restored."""
        out = self._clock.untime()
        if out:
            self.rec.emit("callbacks", steps=steps, callbacks=out)
