"""What the training loop keeps: the containers in the user's frames that hold tensors or arrays.

A list that gets one tensor per step (a cache never cleared, outputs kept "for later", losses
appended without ``.item()``) is the most common way a loop leaks memory. Every
``HELD_EVERY`` steps (in PyTorch, spaced further when looking would cost more than
``HELD_BUDGET`` of the training time), on the training thread, :class:`HeldWatch` (mixed into both instruments)
looks at the variables of the user's frames on the stack (locals, and the module's globals) and
measures the bytes of tensors and arrays each list, tuple, dict, set or deque holds (one level
deep, plus tuples and short lists inside it; a long container is sampled; the container attributes of ``self``
and of the user's own objects, alone or in a short list such as Keras ``callbacks``, and a
dict's lists too), and the public container attributes of the model's parts whose class the
user wrote (a layer appending each call's attention map to ``self.scores``). A ``held`` event lists those holding at least ``HELD_MIN_BYTES``, or at least
``HELD_MIN_GRAPHS`` tensors with autograd history: name, length, bytes, graphs, and the frame's
file and line.

Importing this module imports neither torch nor tensorflow.
"""

from __future__ import annotations

import collections
import math
import sys
import time

from .codeloc import is_user_file

HELD_EVERY = 50  # steps between looks
HELD_MAX = 40  # looks at most
# after the first HELD_STEADY looks, the looks are spaced (in multiples of HELD_EVERY) so that
# looking costs at most HELD_BUDGET of the training time: a loop of fast steps holding many
# variables is looked at less often, not slowed down
HELD_STEADY = 3
HELD_BUDGET = 0.005
HELD_MIN_BYTES = 1 << 20  # containers holding less are not reported ...
HELD_MIN_GRAPHS = 3  # ... unless they hold this many tensors with autograd history
SAMPLE = 512  # elements of a long container looked at (the rest estimated from them)
_CONTAINERS = (list, tuple, dict, set, frozenset, collections.deque)
_SNAPSHOT = sys.version_info < (3, 13)  # a function frame's f_locals is a dict the frame keeps


def _nbytes(obj, seen: set[int]) -> int:
    """Bytes of one tensor / array (its storage, once per storage), else 0."""
    kind = type(obj).__module__.split(".", 1)[0]
    if kind == "torch" and hasattr(obj, "untyped_storage"):
        try:
            storage = obj.untyped_storage()
            key = storage.data_ptr()
            if key in seen:
                return 0
            seen.add(key)
            return int(storage.nbytes())
        except Exception:  # noqa: BLE001 - a meta / sparse tensor: its elements
            return int(obj.numel() * obj.element_size())
    if kind == "numpy" and hasattr(obj, "nbytes"):
        base = obj.base if getattr(obj, "base", None) is not None else obj
        if id(base) in seen:
            return 0
        seen.add(id(base))
        size = getattr(base, "nbytes", None)  # (np.frombuffer's base is a bytes object)
        return int(size if isinstance(size, int) else obj.nbytes)
    if kind in ("tensorflow", "keras") and hasattr(obj, "shape") and hasattr(obj, "dtype"):
        try:
            size = getattr(obj.dtype, "size", 4)
            n = 1
            for d in obj.shape:
                n *= int(d)
            return n * int(size)
        except Exception:  # noqa: BLE001 - a symbolic tensor
            return 0
    return 0


def held(container, seen: set[int] | None = None) -> tuple[int, int]:
    """``(bytes, graphs)`` a container holds.

    Bytes: tensors and arrays among its elements and the tuples and short lists in it
    (storages counted once across ``seen``; a container longer than ``SAMPLE`` is evenly
    sampled and scaled up).

    Graphs: the PyTorch tensors among them that carry autograd history (each keeps its whole
    graph alive, which its own bytes do not show).
    """
    seen = set() if seen is None else seen
    items = container.values() if isinstance(container, dict) else container
    n = len(container)
    stride = max(1, n // SAMPLE)
    try:
        picked = list(items)[::stride] if stride > 1 else list(items)
    except RuntimeError:  # changed size while read (another thread): not this time
        return 0, 0
    total = graphs = 0
    nested = not isinstance(container, dict)  # a dict's lists are containers of their own
    for item in picked:  # a tuple or a short list inside (a step's weight copies) counts too
        inner = item if isinstance(item, tuple) or nested and isinstance(item, list) and \
            len(item) <= SAMPLE else (item,)
        for x in inner:
            total += _nbytes(x, seen)
            graphs += _has_graph(x)
    return total * stride, graphs * stride


def _has_graph(obj) -> bool:
    """A PyTorch tensor with autograd history (a ``grad_fn``)."""
    return type(obj).__module__.split(".", 1)[0] == "torch" and \
        getattr(obj, "grad_fn", None) is not None


def _candidates(name: str, value, depth: int = 0):
    """The containers a variable holds, one level each.

    Itself, an object's (``self``) container attributes, and the lists of a dict of lists
    (``history['val_loss']``).
    """
    if isinstance(value, _CONTAINERS):
        if value:
            yield name, value
        if isinstance(value, dict):
            for key, inner in list(value.items())[:16]:
                if isinstance(key, (str, int)) and isinstance(inner, (list, collections.deque)) \
                        and inner:
                    yield f"{name}[{key!r}]", inner
        elif isinstance(value, (list, tuple)) and len(value) <= 16 and not depth:
            for i, item in enumerate(value):  # a list of the user's objects (callbacks)
                if _users_object(item):
                    yield from _attributes(f"{name}[{i}]", item)
    elif not depth and (name == "self" or _users_object(value)):
        yield from _attributes(name, value)  # one level: an object's own containers


def _users_object(value) -> bool:
    """An instance of a class defined in the user's code (a callback, a trainer, a cache)."""
    if isinstance(value, type) or not isinstance(getattr(value, "__dict__", None), dict):
        return False
    module = sys.modules.get(type(value).__module__)
    path = getattr(module, "__file__", None) if module is not None else None
    parts = str(path).replace("\\", "/").split("/")
    return type(value).__module__ == "__main__" or bool(
        path and is_user_file(path) and "site-packages" not in parts and
        "dist-packages" not in parts)


def _attributes(name: str, value):
    """An object's container attributes (``self.cache``, ``callbacks[0].snapshots``)."""
    if not isinstance(getattr(value, "__dict__", None), dict):
        return
    for attr, inner in list(vars(value).items())[:64]:
        if isinstance(inner, _CONTAINERS) and not attr.startswith("__"):
            yield from _candidates(f"{name}.{attr}", inner, 1)


class HeldWatch:
    """Every ``HELD_EVERY`` steps: a ``held`` event of the user's containers holding tensors.

    The instrument calls :meth:`_init_held` once and :meth:`_look_held` after each step, on
    the training thread.
    """

    def _init_held(self) -> None:
        self._held_looks = 0
        self._held_next = HELD_EVERY  # the step of the next look

    def _held_due(self, step: int) -> bool:
        """Whether ``step`` is a step to look at (cheap: called after every step)."""
        return step >= self._held_next and self._held_looks < HELD_MAX

    def _look_held(self, step: int, frame=None, step_seconds: float | None = None) -> None:
        """Look at the user's frames on the stack when ``step`` is due.

        ``step_seconds`` is the mean duration of a step so far: with it, the next look is
        spaced so that looking stays within :data:`HELD_BUDGET` of the training time.
        """
        if not self._held_due(step) or step % HELD_EVERY or step == 0:
            return
        self._held_looks += 1
        started = time.perf_counter()
        try:
            self._look_frames(step, frame if frame is not None else sys._getframe(1))
        finally:
            every = HELD_EVERY
            if self._held_looks >= HELD_STEADY and step_seconds:
                cost = time.perf_counter() - started
                every *= max(1, math.ceil(cost / (HELD_BUDGET * step_seconds * HELD_EVERY)))
            self._held_next = step + every

    def _look_frames(self, step: int, f) -> None:
        found = []
        seen: set[int] = set()
        done: set[int] = set()
        depth = 0
        while f is not None and depth < 30:
            code = f.f_code
            if is_user_file(code.co_filename):
                module = f.f_globals is f.f_locals
                traced = sys.gettrace() is not None
                # (before 3.13 f_locals is a snapshot the frame keeps: cleared below, so the
                # look holds none of the loop's locals alive; a debugger's frames are skipped)
                scopes = [] if traced and not module and _SNAPSHOT else [("local", f.f_locals)]
                if not module:
                    scopes.append(("global", f.f_globals))
                for scope, names in scopes:
                    for var, obj in list(names.items()):
                        if var.startswith("__"):
                            continue
                        for name, value in _candidates(var, obj):
                            if id(value) in done:
                                continue
                            done.add(id(value))
                            size, graphs = held(value, seen)
                            if size >= HELD_MIN_BYTES or graphs >= HELD_MIN_GRAPHS:
                                found.append({"name": name, "len": len(value), "bytes": size,
                                              "graphs": graphs, "scope": scope,
                                              "file": code.co_filename, "func": code.co_name,
                                              "line": f.f_lineno})
                    if scope == "local" and not module and _SNAPSHOT:
                        names.clear()
            f, depth = f.f_back, depth + 1
        found += self._held_in_model(seen, done)
        if found:
            self.rec.emit("held", step=step, containers=found[:20])

    def _held_in_model(self, seen: set[int], done: set[int]) -> list[dict]:
        """Containers the model's own parts keep, as ``held`` entries.

        A layer of the user's class appending what each call computes to ``self.<list>``
        (attention maps "for inspection", a cache). Public attributes only (a framework's ``_parameters`` or ``_layers`` are not kept
        data); the part's class names where it was written.
        """
        root = getattr(self, "_root", None)
        model = root() if callable(root) else None
        if model is None:
            return []
        if hasattr(model, "named_modules"):
            parts = list(model.named_modules())
        else:
            flatten = getattr(model, "_flatten_layers", None)
            parts = [(layer.name, layer) for layer in flatten(include_self=True)] \
                if callable(flatten) else []
        found = []
        for path, part in parts[:512]:
            if not _users_object(part):
                continue
            code = getattr(getattr(type(part), "__init__", None), "__code__", None)
            for attr, inner in list(vars(part).items())[:64]:
                if attr.startswith("_") or not isinstance(inner, _CONTAINERS) or not inner \
                        or id(inner) in done:
                    continue
                done.add(id(inner))
                size, graphs = held(inner, seen)
                if size >= HELD_MIN_BYTES or graphs >= HELD_MIN_GRAPHS:
                    found.append({"name": f"model.{path}.{attr}" if path else f"model.{attr}",
                                  "len": len(inner), "bytes": size, "graphs": graphs,
                                  "scope": "model", "file": getattr(code, "co_filename", None),
                                  "func": type(part).__name__,
                                  "line": getattr(code, "co_firstlineno", None)})
        return found
