"""DataLoader hooks of the PyTorch instrument (mixed into ``TorchInstrument``): data wait, epochs.

What they record:

- ``DataLoader.__iter__`` returns a :class:`TimedIterator`: the time its ``__next__`` waits is the
  ``dw`` of the next ``step`` row (only for the training loader once one is known);
- a training loader (one whose batch reached a ``backward()``) iterated again starts the next
  epoch: an ``epoch`` event with ``source="dataloader"``, after the validation losses seen in
  between were written (``eval_loss``);
- the training loader goes to the keeper for Isolate;
- ``DataLoader.__init__`` notes where each loader was made: the first training loader's line
  is the ``loader`` reference, with its ``batch_size``.

State owned here: the loaders seen (weakly), which of them train, the loader of the last batch
and the data wait of the step in progress.
"""

from __future__ import annotations

import sys
import time
import weakref

from .codeloc import user_location
from .passes import Passes


class TimedIterator:
    """Wraps a DataLoader iterator: time spent waiting in ``__next__`` is data wait."""

    def __init__(self, inner, link, loader_id: int) -> None:
        self._inner = inner
        self._link = link  # the instrument's :class:`~.patches.Link` (cut after the capture)
        self._loader_id = loader_id

    def __iter__(self):
        return self

    def __next__(self):
        t0 = time.perf_counter()
        inst = self._link()
        if inst is not None:
            inst._in_data = True
        drawn = False
        try:
            item = next(self._inner)
            drawn = True
            return item
        finally:
            inst = self._link()
            if inst is not None:
                inst._in_data = False
                inst._active_loader = self._loader_id
                if self._loader_id in inst._train_loaders or not inst._train_loaders:
                    inst._data_wait += time.perf_counter() - t0
                inst._count_batch(self._loader_id, drawn)

    def __len__(self):
        return len(self._inner)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class DataHooks:
    """``DataLoader.__iter__``: timed iterators, epochs of the training loader."""

    def _init_data_state(self) -> None:
        self._data_wait = 0.0
        self._train_loaders: set[int] = set()
        self._active_loader = None
        self._loader_refs: dict[int, weakref.ref] = {}
        self._datasets: dict[int, weakref.ref] = {}  # id of a loader -> its dataset (the last
        # few; weakly: only the training loader's is kept, by the keeper)
        self._loaders_made: dict[int, tuple] = {}  # id -> (location, batch size, weakref)
        self._passes = Passes()  # batches drawn per pass over each loader

    def _note_train_loader(self) -> None:
        """The loader of the batch that reached ``backward()`` trains (called each backward).

        The first training loader's construction line becomes the ``loader`` reference (with its
        batch size): where the batch size is set.
        """
        if self._active_loader is not None and self._active_loader not in self._train_loaders:
            first = not self._train_loaders
            self._train_loaders.add(self._active_loader)
            self._passes.trains(self._active_loader)
            ref = self._loader_refs.get(self._active_loader)
            if self.keeper.train_loader is None and ref is not None:
                self.keeper.train_loader = ref()
            held = self._datasets.get(self._active_loader)
            if self.keeper.train_dataset is None and held is not None:
                self.keeper.train_dataset = held()
            made = self._loaders_made.get(self._active_loader)
            alive = ref() if ref is not None else None
            if first and made is not None and made[0] is not None and alive is not None \
                    and made[2]() is alive:  # not a dead loader's reused id
                self.ref("loader", made[0], batch_size=made[1], batches=_length(alive))

    def _wrap_loader_init(self, original):
        link = self._link

        def __init__(loader, *args, **kwargs):
            original(loader, *args, **kwargs)
            inst = link()
            if inst is not None:
                inst.guard(inst._on_loader_made)(loader)

        __init__.__wrapped__ = original
        return __init__

    def _on_loader_made(self, loader) -> None:
        if len(self._loaders_made) > 256:  # loaders built every step: keep the first ones
            return
        batch = getattr(loader, "batch_size", None)
        self._loaders_made[id(loader)] = (user_location(sys._getframe()),
                                          batch if isinstance(batch, int) else None,
                                          weakref.ref(loader))

    def _wrap_loader_iter(self, original):
        link = self._link

        def __iter__(loader):
            t0 = time.perf_counter()
            it = original(loader)  # (starting worker processes: the loop waits for data)
            inst = link()
            if inst is None:
                return it
            if id(loader) in inst._train_loaders or not inst._train_loaders:
                inst._data_wait += time.perf_counter() - t0
            inst.guard(inst._on_loader_iter)(loader)
            return TimedIterator(it, link, id(loader))

        __iter__.__wrapped__ = original
        return __iter__

    def _on_loader_iter(self, loader) -> None:
        self._loader_refs[id(loader)] = weakref.ref(loader)
        try:
            self._datasets[id(loader)] = weakref.ref(loader.dataset)
        except (AttributeError, TypeError):  # no dataset, or one that takes no weak reference
            pass
        while len(self._datasets) > 8:  # (an evaluation loader made every epoch)
            self._datasets.pop(next(iter(self._datasets)))
        cut, _ = self._passes.begin(id(loader), loader, user_location(sys._getframe()),
                                    _length(loader))
        if cut:
            self.keeper.cut_passes = True  # the training loader's last pass drew under half
        if id(loader) in self._train_loaders:  # a training loader iterated again: next epoch
            self.losses.flush_eval()
            self.rec.set_epoch(self.rec.epoch + 1, "dataloader")


    def _count_batch(self, loader_id: int, drawn: bool) -> None:
        """One ``__next__`` of a loader's pass: a batch drawn, or the pass ran out."""
        if drawn:
            self._passes.drew(loader_id)
        else:
            self._passes.ran_out(loader_id)

    def _emit_passes(self) -> None:
        """``passes``: how many batches each pass over the training loader drew, of how many.

        Only when one loader trained (see :class:`~.passes.Passes`).
        """
        event = self._passes.event() if len(self._train_loaders) == 1 else None
        if event is not None:
            self.rec.emit("passes", **event)


def _length(loader) -> int | None:
    """Batches per epoch of a loader (None for an iterable dataset without a length)."""
    try:
        return int(len(loader))
    except (TypeError, ValueError, NotImplementedError):
        return None
