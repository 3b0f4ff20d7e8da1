"""Arrays kept on disk: the copy of a large model's initial weights, read back on demand.

Isolate's probes restart from the weights the model had before its first step, so the capture
keeps a copy of them. Above :func:`threshold_bytes` (``MODEL_DEBUGGER_SPILL_MB``, 64 MB by
default) the copy is written, one tensor at a time, to a private temporary file instead of RAM,
and read back through a copy-on-write memory map when a probe asks for it. The file is removed
when the keeper is released, garbage-collected, or the process exits.

Where (:func:`spill_folder`): the folder ``MODEL_DEBUGGER_SPILL_DIR`` names, else the folder of
the capture's record, else the system's temporary folder. A memory file system (tmpfs, ramfs)
would keep the "spilled" copy in RAM as shared memory: such a folder is used only when the
variable names it; otherwise nothing is spilled, the copy stays in RAM (where the record's
``spill`` event says it is), and the reason is recorded.

Importing this module imports neither torch nor tensorflow.
"""

from __future__ import annotations

import os
import tempfile
import weakref

import numpy as np

from ._util import active_recorder

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


_MEMORY_FS = frozenset({"tmpfs", "ramfs", "shm", "devtmpfs", "hugetlbfs"})


def _fs_type(folder: str) -> str | None:
    """The file-system type of ``folder`` from ``/proc/self/mounts`` (None: unknown)."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as fh:
            mounts = [line.split()[:3] for line in fh]
    except OSError:
        return None
    path = os.path.realpath(folder)
    best, fstype = -1, None
    for entry in mounts:
        if len(entry) < 3:
            continue
        point = entry[1].replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) > best:
            best, fstype = len(point), entry[2]
    return fstype


def spill_folder(record: str | None = None) -> tuple[str | None, str]:
    """Where to spill: ``(folder, why)``; ``folder`` is None when nothing should be spilled.

    ``MODEL_DEBUGGER_SPILL_DIR`` is used as named (a memory file system too: the user asked);
    else the folder of ``record`` (the capture's record file), else the temporary folder,
    unless that is a memory file system (the copy would stay in RAM as shared memory).
    """
    named = os.environ.get("MODEL_DEBUGGER_SPILL_DIR", "").strip()
    if named:
        return os.path.abspath(os.path.expanduser(named)), "MODEL_DEBUGGER_SPILL_DIR"
    if record:
        folder, why = os.path.dirname(os.path.abspath(record)), "the record's folder"
    else:
        folder, why = tempfile.gettempdir(), "the temporary folder"
    fstype = _fs_type(folder)
    if fstype in _MEMORY_FS:
        return None, (f"{why} {folder} is a memory file system ({fstype}): a spilled copy "
                      "would stay in RAM; set MODEL_DEBUGGER_SPILL_DIR to a folder on disk")
    return folder, why


def open_spill() -> Spill | None:
    """A new :class:`Spill` where :func:`spill_folder` says, or None (kept in RAM).

    The active capture gets a ``spill`` event either way: the folder, or why nothing was spilled.
    """
    rec = active_recorder()
    folder, why = spill_folder(getattr(rec, "path", None))
    spill = Spill(folder) if folder is not None else None
    if rec is not None:
        if spill is None:
            rec.emit("spill", spilled=False, reason=why)
        else:
            rec.emit("spill", spilled=True, folder=folder, why=why)
    return spill


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
        The file (mode 0600, in ``folder``: see :func:`open_spill`).
    nbytes : int
        Bytes written.
    """

    def __init__(self, folder: str | None = None) -> None:
        if folder is not None:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        fd, self.path = tempfile.mkstemp(prefix="model_debugger-weights-", suffix=".bin",
                                         dir=folder)
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


class SpilledState:
    """The initial-weight bookkeeping both keepers share: in RAM, or in a :class:`Spill`.

    A keeper sets ``_spill`` and ``_spilled`` (where each array lies in the file) when it spills,
    and defines ``_read_spill()`` to rebuild the framework's arrays from the file.
    """

    _initial_state = None
    _spill: Spill | None = None
    _spilled = None

    @property
    def initial_state(self):
        """The weights from before the first step (read back from disk when spilled)."""
        return self._initial_state if self._spill is None else self._read_spill()

    @initial_state.setter
    def initial_state(self, value) -> None:
        self._drop_spill()
        self._initial_state = value

    @property
    def spill_path(self) -> str | None:
        """The file holding the initial weights, or None when they are in RAM."""
        return self._spill.path if self._spill is not None else None

    def _read_spill(self):
        raise NotImplementedError

    def _drop_spill(self) -> None:
        if self._spill is not None:
            self._spill.remove()
        self._spill = self._spilled = None

