"""The session folder: the only code that knows its layout.

A session lives in ``<root>/<id>/`` (``root`` is ``.model_debugger`` by default)::

    session.json            the event log (atomic rewrite on every event)
    .lock                   the session lock (flock; holds "pid phase")
    artifact.py             the reproduced code (script copy, or prelude + cell), redacted
    cell.py                 a notebook session's reproduced cell
    log.<ext>               a minimal reproducer's copied log
    runs/<i>/record.jsonl   Reproduce run i (``findings.json`` beside run 0 when probed there)
    .../record.ranks/       beside a record: the records of the processes that run started
                            (``proc-<pid>.jsonl``, a multi-process job)
    isolate/<n>/            the n-th Isolate re-run (``record.jsonl``, ``findings.json``)
    verify/<n>/             the n-th Verify: ``before-<seed>.jsonl``, ``after-<seed>.jsonl``
    fixes/<n>.py            the code of the n-th approved fix
    repro.py                written by export

Every path below is built here and nowhere else. Writes go through
:func:`model_debugger.safe_write.write_inside` (atomic, private, no symlink followed); folders
are private (0700) and files 0600.
"""

from __future__ import annotations

import os
import secrets
import stat
import time

from .safe_write import read_inside, regular_inside, write_inside

ROOT = ".model_debugger"
SESSION_FILE = "session.json"
LOCK_FILE = ".lock"
ARTIFACT = "artifact.py"
CELL = "cell.py"
RECORD = "record.jsonl"
FINDINGS = "findings.json"
RANKS = ".ranks"  # <record stem>.ranks/ beside a record: a multi-process job's process records
REPRO = "repro.py"
SCAN_DEPTH = 2
_SKIP = {"node_modules", "__pycache__", "site-packages"}


def _ignore_all(root: str) -> None:
    """Write ``root/.gitignore`` (``*``) unless one exists; never follows a symlink."""
    try:
        fd = os.open(os.path.join(root, ".gitignore"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:  # there is one already (the user's), or the root is read-only
        return
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write("*\n")


class Store:
    """The files of one session folder.

    Parameters
    ----------
    directory : str
        The session folder (``<root>/<id>``).
    """

    def __init__(self, directory: str) -> None:
        self.directory = os.path.abspath(directory)

    @classmethod
    def create(cls, root: str = ROOT) -> Store:
        """Make a new, private session folder under ``root`` (0700, whatever the umask).

        A ``root`` this call creates, or one named ``.model_debugger``, gets a ``.gitignore``
        of ``*`` so that sessions are never committed.
        """
        root = os.path.abspath(root)
        made_root = not os.path.isdir(root)
        os.makedirs(root, mode=0o700, exist_ok=True)
        if made_root or os.path.basename(root) == ROOT:
            _ignore_all(root)
        while True:
            sid = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
            try:
                os.mkdir(os.path.join(root, sid), 0o700)
                break
            except FileExistsError:  # pragma: no cover - 2**24 ids per second
                continue
        directory = os.path.join(root, sid)
        os.chmod(directory, 0o700)
        return cls(directory)

    # -- paths -----------------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The session id (the folder's name)."""
        return os.path.basename(self.directory)

    @property
    def session_file(self) -> str:
        """The absolute path of the folder's ``session.json`` (the event log)."""
        return os.path.join(self.directory, SESSION_FILE)

    @property
    def lock_file(self) -> str:
        """The absolute path of the lock file that serialises appends to the session."""
        return os.path.join(self.directory, LOCK_FILE)

    def path(self, rel: str) -> str:
        """The absolute path of a file named relative to the folder (as events record them)."""
        return os.path.join(self.directory, rel)

    def rel(self, path: str) -> str:
        """``path`` relative to the folder, with ``/`` separators (what events record)."""
        return os.path.relpath(path, self.directory).replace(os.sep, "/")

    @staticmethod
    def run_rel(i: int) -> str:
        """The record of Reproduce run ``i``, relative to the folder."""
        return f"runs/{int(i)}/{RECORD}"

    def run_dir(self, i: int) -> str:
        """The folder of Reproduce run ``i`` (created)."""
        return self._folder("runs", i)

    def run_record(self, i: int) -> str:
        """The record of Reproduce run ``i`` (its folder created)."""
        return os.path.join(self.run_dir(i), RECORD)

    def isolate_dir(self, n: int) -> str:
        """The folder of the ``n``-th Isolate re-run (created)."""
        return self._folder("isolate", n)

    def isolate_record(self, n: int) -> str:
        """The record of the ``n``-th Isolate re-run (its folder created)."""
        return os.path.join(self.isolate_dir(n), RECORD)

    @staticmethod
    def intervention_rel(n: int, label: str, seed: int) -> str:
        """A confirmation re-run's record of Isolate round ``n``, relative to the folder.

        ``label`` is ``baseline`` or the intervention's id.
        """
        if not label.replace("_", "").isalnum():
            raise ValueError(f"not a record label: {label!r}")
        return f"isolate/{int(n)}/{label}-{int(seed)}.jsonl"

    def verify_dir(self, n: int) -> str:
        """The folder of the ``n``-th Verify (created)."""
        return self._folder("verify", n)

    @staticmethod
    def verify_rel(n: int, which: str, seed: int) -> str:
        """A Verify run's record, relative to the folder (``which``: before/after)."""
        if which not in ("before", "after"):
            raise ValueError(f"which must be 'before' or 'after', not {which!r}")
        return f"verify/{int(n)}/{which}-{int(seed)}.jsonl"

    @staticmethod
    def fix_rel(n: int) -> str:
        """The copy of the ``n``-th approved fix, relative to the folder."""
        return f"fixes/{int(n)}.py"

    @staticmethod
    def code_beside(record: str) -> str:
        """Where the code a cell run executed is kept (what its tracebacks show)."""
        return os.path.join(os.path.dirname(record), CELL)

    @staticmethod
    def log_rel(ext: str) -> str:
        """A minimal reproducer's copy of its log (``ext``: ``.csv``, ``.jsonl``, ...)."""
        return "log" + ext

    @staticmethod
    def ranks_beside(record: str) -> str:
        """The folder where the processes a run started write their records.

        ``runs/0/record.ranks/`` beside ``runs/0/record.jsonl``: one folder per record (a
        Verify folder holds a record per seed and side).
        """
        stem = os.path.splitext(os.path.basename(record))[0]
        return os.path.join(os.path.dirname(record), stem + RANKS)

    @staticmethod
    def job_ranks_elsewhere(record: str) -> list[tuple[str, str]]:
        """The same run's process folders in the other sessions under the same root.

        A job on several nodes writes under a shared ``--root``: every node's session runs the
        same phases, so each node's ranks of this run sit at the same place in its own session.
        Returns ``(root, folder)`` pairs (folders that exist; read them with
        :func:`~model_debugger.safe_write.read_inside` under ``root``).
        """
        folder = Store.ranks_beside(os.path.abspath(record))
        session = os.path.dirname(folder)
        for _ in range(4):  # up to the folder that holds the session file (verify/<n>/...)
            if os.path.isfile(os.path.join(session, SESSION_FILE)):
                break
            session = os.path.dirname(session)
        else:
            return []
        root, rel = os.path.dirname(session), os.path.relpath(folder, session)
        try:
            names = sorted(os.listdir(root))
        except OSError:
            return []
        out = []
        for name in names:
            other = os.path.join(root, name)
            if other != session and os.path.isdir(os.path.join(other, rel)) and \
                    not os.path.islink(other):
                out.append((root, os.path.join(other, rel)))
        return out

    @staticmethod
    def findings_beside(record: str) -> str:
        """Where probes that ran beside ``record`` left their report."""
        return os.path.join(os.path.dirname(record), FINDINGS)

    @staticmethod
    def rank_findings(folder: str, rank: int) -> str:
        """Where one rank of a job left its probes' report, in the job's ranks ``folder``."""
        return os.path.join(folder, f"findings.rank{int(rank)}.json")

    def _folder(self, kind: str, n: int) -> str:
        path = os.path.join(self.directory, kind, str(int(n)))
        os.makedirs(path, mode=0o700, exist_ok=True)
        return path

    # -- IO ----------------------------------------------------------------------------------
    def write(self, rel: str, data: str | bytes) -> bool:
        """Write a file of the folder atomically; True when a file was replaced.

        The file is 0600, replaces an existing one, and no symlink is followed.
        """
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        return write_inside(self.directory, rel, data, overwrite=True, mode=0o600)

    def write_code(self, rel: str, text: str) -> bool:
        """Write Python source with its secrets redacted.

        Redacted by :func:`~model_debugger.redact.redact_code`: the session folder keeps no
        secret of the code it copies.
        """
        from .redact import redact_code

        return self.write(rel, redact_code(text))

    def read(self, rel: str, limit: int | None = None) -> bytes | None:
        """The bytes of a file of the folder (None when missing or reached through a link)."""
        try:
            return read_inside(self.directory, rel, limit=limit)
        except (OSError, ValueError):
            return None

    def exists(self, rel: str) -> bool:
        """True when a file of the folder, named relative to it, exists."""
        return os.path.exists(self.path(rel))

    def private(self) -> None:
        """Folders 0700 and files 0600 in the folder (symlinks neither followed nor changed)."""
        for path, dirs, files in os.walk(self.directory):
            for name, mode in [(d, 0o700) for d in dirs] + [(f, 0o600) for f in files]:
                full = os.path.join(path, name)
                try:
                    st = os.lstat(full)
                    if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) != mode:
                        os.chmod(full, mode)
                except OSError:
                    continue
        try:
            os.chmod(self.directory, 0o700)
        except OSError:
            pass


_COPY_DIRS = ("runs", "isolate", "verify")
CELL_LIMIT = 1 << 20


def cell_copy(path: str) -> str | None:
    """Which notebook cell a session's code copy holds: ``"reproduce"``, ``"fix"`` or None.

    A notebook session runs its cell from memory and writes the code beside each record
    (``cell.py``, ``runs/<i>/cell.py``, ``isolate/<n>/cell.py``, ``verify/<n>/cell.py``) so
    tracebacks and locations can name a line. A location in such a copy is a line of the
    ``%%reproduce`` cell when the copy holds the reproduced code, else of the ``%%fix`` cell.
    None for any other file (a script, a file outside a session folder).
    """
    if not isinstance(path, str) or os.path.basename(path) != CELL:
        return None
    path = os.path.abspath(path)
    parts = path.split(os.sep)
    if os.path.isfile(os.path.join(os.path.dirname(path), SESSION_FILE)):
        folder, top = os.path.dirname(path), True  # the reproduced cell itself
    elif len(parts) > 3 and parts[-3] in _COPY_DIRS and parts[-2].isdigit():
        folder, top = os.sep.join(parts[:-3]), False  # <kind>/<n>/cell.py
        if not os.path.isfile(os.path.join(folder, SESSION_FILE)):
            return None
    else:
        return None
    copy = read_inside(folder, path, CELL_LIMIT)
    if copy is None:
        return None
    reproduced = read_inside(folder, os.path.join(folder, CELL), CELL_LIMIT)
    return "reproduce" if top or copy == reproduced else "fix"


def session_file_of(path: str) -> str:
    """``path`` if it names a file, else ``path/session.json`` (a session folder)."""
    return os.path.join(path, SESSION_FILE) if os.path.isdir(path) else path


def session_file_ok(root: str, folder: str) -> bool:
    """True when ``folder/session.json`` is a safe regular file inside ``root``.

    Neither the file, nor the session folder, nor any folder above it up to ``root`` is a
    symlink.
    """
    return regular_inside(root, os.path.relpath(os.path.join(folder, SESSION_FILE), root))


def find_sessions(root: str, depth: int = SCAN_DEPTH) -> list[str]:
    """Session folders (absolute) under ``root``, in id order within each store.

    ``<dir>/.model_debugger/<id>/session.json`` in ``root`` and up to ``depth`` folder levels
    below it (hidden folders and virtual
    environments skipped; a session reached through a symlink is not listed), in id order
    within each store.
    """
    found: list[str] = []

    def walk(folder: str, level: int) -> None:
        store = os.path.join(folder, ROOT)
        if os.path.isdir(store):
            try:
                ids = sorted(os.listdir(store))
            except OSError:
                ids = []
            found.extend(os.path.join(store, sid) for sid in ids
                         if session_file_ok(root, os.path.join(store, sid)))
        if level >= depth:
            return
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and not entry.name.startswith(".") \
                    and entry.name not in _SKIP:
                walk(entry.path, level + 1)

    walk(root, 0)
    return found
