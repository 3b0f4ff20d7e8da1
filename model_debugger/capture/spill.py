"""Arrays kept on disk: the copy of a large model's initial weights, read back on demand.

Isolate's probes restart from the weights the model had before its first step, so the capture
keeps a copy of them. Above :func:`threshold_bytes` (``MODEL_DEBUGGER_SPILL_MB``, 64 MB by
default) the copy is written, one tensor at a time, to a private temporary file instead of RAM,
and read back through a copy-on-write memory map when a probe asks for it. The file is removed
when the keeper is released, garbage-collected, or the process exits.

Importing this module imports neither torch nor tensorflow.
"""

from __future__ import annotations

import os
import tempfile
import weakref

import numpy as np

DEFAULT_SPILL_MB = 64.0
_ALIGN = 64  # every array starts on a 64-byte boundary of the file (aligned loads)


def threshold_bytes() -> float:
    """Weights larger than this many bytes are spilled to disk (``MODEL_DEBUGGER_SPILL_MB``)."""
    raw = os.environ.get("MODEL_DEBUGGER_SPILL_MB", "")
    try:
        mb = float(raw) if raw.strip() else DEFAULT_SPILL_MB
    except ValueError:
        mb = DEFAULT_SPILL_MB
    if not mb >= 0:  # NaN or negative: the default
        mb = DEFAULT_SPILL_MB
    return mb * 2**20


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


class Spill:
    """A temporary file of raw arrays: :meth:`add` each, :meth:`close`, then :meth:`get`.

    Attributes
    ----------
    path : str
        The file (mode 0600, in the system's temporary folder).
    nbytes : int
        Bytes written.
    """

    def __init__(self) -> None:
        fd, self.path = tempfile.mkstemp(prefix="model_debugger-weights-", suffix=".bin")
        self._fh = os.fdopen(fd, "wb")
        self._remove = weakref.finalize(self, _remove, self.path)  # also at interpreter exit
        self._entries: list[tuple[int, int]] = []  # (offset, nbytes)
        self._map = None
        self.nbytes = 0

    def add(self, data: np.ndarray) -> int:
        """Append the bytes of a contiguous array; return its index."""
        pad = -self.nbytes % _ALIGN
        if pad:
            self._fh.write(b"\0" * pad)
            self.nbytes += pad
        flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        self._fh.write(memoryview(flat))
        self._entries.append((self.nbytes, flat.size))
        self.nbytes += flat.size
        return len(self._entries) - 1

    def close(self) -> None:
        """Finish writing (the file is complete from now on)."""
        if not self._fh.closed:
            self._fh.close()

    def get(self, index: int) -> np.ndarray:
        """The bytes of array ``index`` as a writable copy-on-write ``uint8`` view of the file."""
        self.close()
        offset, size = self._entries[index]
        if size == 0:
            return np.empty(0, dtype=np.uint8)
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="c")
        return self._map[offset:offset + size]

    def remove(self) -> None:
        """Delete the file now (views already handed out stay readable until dropped)."""
        self.close()
        self._map = None
        self._remove()

    @property
    def exists(self) -> bool:
        """Whether the file is still on disk."""
        return os.path.exists(self.path)
