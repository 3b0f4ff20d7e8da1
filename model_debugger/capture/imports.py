"""Run a callback when a module is imported, without importing it ourselves.

The recorder must not import torch or tensorboard: when the user's code imports them later (a
script run under ``capture()``), the instrument attaches right after the import finishes.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callable]] = {}
        self._busy: set[str] = set()

    def find_spec(self, fullname, path, target=None):  # noqa: D401 - importlib protocol
        if fullname not in self.callbacks or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.discard(fullname)
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module
        finder = self

        def exec_module(module):
            original(module)
            for cb in finder.callbacks.pop(fullname, []):
                cb(module)

        spec.loader = _WrappedLoader(loader, exec_module)
        return spec


class _WrappedLoader(importlib.abc.Loader):
    def __init__(self, inner, exec_module):
        self._inner = inner
        self._exec = exec_module

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._exec(module)

    def __getattr__(self, name):
        return getattr(self._inner, name)


_finder = _Finder()


def when_imported(name: str, callback: Callable) -> Callable[[], None]:
    """Call ``callback(module)`` now if ``name`` is imported, else right after its import.

    Returns
    -------
    callable
        Cancels a pending callback (a no-op once it has run).
    """
    if name in sys.modules:
        callback(sys.modules[name])
        return lambda: None
    _finder.callbacks.setdefault(name, []).append(callback)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)

    def cancel() -> None:
        cbs = _finder.callbacks.get(name, [])
        if callback in cbs:
            cbs.remove(callback)
        if not cbs:
            _finder.callbacks.pop(name, None)
        if not _finder.callbacks and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)

    return cancel
