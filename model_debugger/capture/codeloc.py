"""Find the user's file:line behind a call into a framework.

The recorder sits inside framework calls (``loss.backward()``, ``optimizer.step()``); the line worth
showing is the first frame that belongs to the user's code, not to the framework, to
model_debugger, or to the standard library.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import traceback
from types import FrameType, TracebackType

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXAMPLES = os.path.join(_PKG_DIR, "examples") + os.sep  # bundled user scripts
_STDLIB = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")}
_FRAMEWORKS = ("torch", "tensorflow", "keras", "tensorboard", "numpy", "IPython", "ipykernel",
               "accelerate", "lightning", "pytorch_lightning", "transformers")
_framework_dirs: dict[str, str] = {}


def _framework_dir(name: str) -> str | None:
    if name not in _framework_dirs:
        mod = sys.modules.get(name)
        path = getattr(mod, "__file__", None)
        if not path:
            return None
        _framework_dirs[name] = os.path.dirname(os.path.realpath(path))
    return _framework_dirs[name]


@functools.lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    """Return True when ``filename`` belongs to the user's code.

    Parameters
    ----------
    filename : str
        A code object's ``co_filename``.
    """
    if not filename or filename.startswith("<frozen") or filename == "<string>":
        return False
    real = os.path.realpath(filename)
    if real.startswith(_PKG_DIR + os.sep) and not real.startswith(_EXAMPLES):
        return False
    if any(real.startswith(d + os.sep) for d in _STDLIB) and "site-packages" not in real:
        return False
    for name in _FRAMEWORKS:
        d = _framework_dir(name)
        if d and real.startswith(d + os.sep):
            return False
    return True


def user_frame(start: FrameType | None = None) -> FrameType | None:
    """Return the innermost user frame at or above ``start`` (default: the caller)."""
    frame = start or sys._getframe(1)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return frame
        frame = frame.f_back
    return None


def user_location(start: FrameType | None = None) -> dict | None:
    """Return ``{"file": ..., "line": ...}`` for the innermost user frame, or None."""
    frame = user_frame(start or sys._getframe(1))
    if frame is None:
        return None
    return {"file": frame.f_code.co_filename, "line": frame.f_lineno}


def traceback_location(tb: TracebackType | None) -> dict | None:
    """Return the innermost user ``file:line`` of a traceback (where the user's code failed)."""
    best = None
    for fs in traceback.extract_tb(tb):
        if is_user_file(fs.filename):
            best = {"file": fs.filename, "line": fs.lineno}
    return best


def frame_span(frame, scope: dict) -> tuple[int, int] | None:
    """The lines a name found in ``scope`` of ``frame`` was assigned on.

    Its function's lines up to the one running; None for the module's globals (anywhere in
    the file).
    """
    if scope is frame.f_globals or frame.f_lineno is None:
        return None
    return frame.f_code.co_firstlineno, frame.f_lineno


def definition_location(obj: object) -> dict | None:
    """Return where ``obj``'s class is defined, or None for built-in classes."""
    import inspect

    cls = obj if isinstance(obj, type) else type(obj)
    try:
        filename = inspect.getsourcefile(cls)
        # a framework class (nn.Sequential) is not parsed: getsourcelines reads the whole file
        if not filename or not is_user_file(filename):
            return None
        _, line = inspect.getsourcelines(cls)
    except (TypeError, OSError):
        return None
    return {"file": filename, "line": line}


def assignment(namespace: dict | None, name: str,
               span: tuple[int, int] | None = None) -> dict | None:
    """Where ``name = ...`` is first assigned in the file that holds ``namespace``.

    ``span`` (first, last line): there first, the lines of the function whose frame holds the
    name up to the line it runs (a name reused by another function of the file is not it);
    anywhere in the file when the function assigns it nowhere (a parameter).
    """
    import re

    path = (namespace or {}).get("__file__")
    if not path or not name or not name.isidentifier():
        return None
    pattern = re.compile(rf"\s*{name}\s*(:[^=]*)?=(?!=)")
    try:
        with open(path, encoding="utf-8") as fh:
            found = [n for n, line in enumerate(fh, 1) if pattern.match(line)]
    except (OSError, UnicodeDecodeError):
        return None
    inside = [n for n in found if span and span[0] <= n <= span[1]]
    return {"file": path, "line": (inside or found)[0]} if found else None
