"""The kernel end of the JupyterLab sidebar: a comm with target ``model_debugger``.

Protocol (every message is a JSON object with a ``type``):

- frontend -> kernel ``{"type": "hello"}`` (in the ``comm_open`` data or as a message):
  the kernel answers ``{"type": "snapshot", "snapshot": SNAPSHOT}``.
- kernel -> frontend ``{"type": "event", "snapshot": SNAPSHOT}`` after every event appended to
  the kernel's session, by whichever DebugSession object of the process
  (:meth:`model_debugger.session.DebugSession.on_change`).
- frontend -> kernel ``{"type": "request", "id": ID, "command": NAME, "args": {...}}``; the
  kernel answers ``{"type": "reply", "id": ID, "ok": true, "result": ...}`` or
  ``{"type": "reply", "id": ID, "ok": false, "error": "..."}``. Commands: ``snapshot``,
  ``export`` (``args.path``: where to write the record notebook, optional), ``fix_cell`` (the
  ``%%fix`` cell the sidebar's Fix button inserts).

SNAPSHOT follows ``model_debugger/schema/snapshot.schema.json`` (the sidebar's TypeScript types
are generated from the same file); its ``report`` is the session's
:meth:`~model_debugger.session.DebugSession.report` (with the phase strip, ``phases``), its
``running`` the phase the kernel runs now with its progress (pushed as it moves), or null.
:func:`register` also opens a comm from the kernel, so a sidebar that is already open connects
as soon as ``%load_ext model_debugger`` runs.

The comms, the target and the subscription live on a :class:`Sidebar` owned by the kernel's
:class:`~model_debugger.notebook.NotebookSession` (itself owned by the magics registered on the
shell); nothing is kept in module globals.

Everything here is a no-op outside a kernel (plain IPython, scripts).
"""

from __future__ import annotations

import json
import math
import os

TARGET = "model_debugger"
SNAPSHOT_SCHEMA = "model_debugger.snapshot/1"
PROTOCOL = 1


def _manager(shell):
    kernel = getattr(shell, "kernel", None) if shell is not None else None
    if kernel is None:
        return None
    manager = getattr(kernel, "comm_manager", None)
    if manager is None:
        try:
            from comm import get_comm_manager

            manager = get_comm_manager()
        except Exception:  # noqa: BLE001 - no comm support: stay a no-op
            return None
    return manager


def _clean(value):
    """JSON-safe: non-finite floats as strings (the recorder's convention), unknowns as str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    try:
        as_float = float(value)  # numpy scalars
    except (TypeError, ValueError):
        return str(value)
    if isinstance(value, int) or getattr(value, "dtype", None) is not None and \
            getattr(value.dtype, "kind", "") in "iu":
        return int(as_float)
    return _clean(as_float)


def _cells_named(report: dict) -> dict:
    """``location.cell`` (``reproduce`` or ``fix``) on every location in a notebook cell.

    A notebook session's locations point into its copies of the cell; the sidebar shows them
    as the cell's line and reveals that cell (see :func:`model_debugger.store.cell_copy`).
    """
    from .store import cell_copy

    def named(item):
        loc = item.get("location") if isinstance(item, dict) else None
        cell = cell_copy(loc["file"]) if isinstance(loc, dict) and \
            isinstance(loc.get("file"), str) else None
        return {**item, "location": {**loc, "cell": cell}} if cell else item

    report = dict(report)
    report["findings"] = [named(f) for f in report.get("findings") or ()]
    for key in ("plan", "fix"):
        report[key] = named(report.get(key))
    return report


def snapshot(kernel) -> dict:
    """The sidebar's view of a kernel's session (see the module docstring).

    Parameters
    ----------
    kernel : NotebookSession
        The kernel's session; asking creates no DebugSession (``report`` is None until one
        exists).
    """
    from . import __version__

    session = kernel.session if kernel.has_session else None
    report = _cells_named(session.report()) if session is not None else None
    plan = report.get("plan") if report else None
    return _clean({"schema": SNAPSHOT_SCHEMA, "protocol": PROTOCOL, "version": __version__,
                   "cwd": os.getcwd(), "root": kernel.root, "report": report,
                   "plan": {k: v for k, v in plan.items() if k != "source"} if plan else None,
                   "running": getattr(kernel, "running", None)})


def export(kernel, args: dict) -> dict:
    """Export the kernel's session.

    ``args.path``: a notebook path inside the kernel's folder (the notebook's); default the
    session folder. ``args.overwrite``: replace existing files (otherwise an existing target is
    an error).
    """
    from .export import export_files

    if not kernel.has_session:
        raise ValueError("no session to export yet: run a %%reproduce cell first")
    path = args.get("path") or None
    if path is not None and not isinstance(path, str):
        raise ValueError("args.path must be a string")
    cwd = os.getcwd()
    written = export_files(kernel.session, path, root=cwd if path is not None else None,
                           overwrite=args.get("overwrite") is True)
    return {"notebook": written["notebook"], "repro": written["repro"],
            "replaced": written["replaced"],
            "relative": {k: os.path.relpath(written[k], cwd).replace(os.sep, "/")
                         for k in ("notebook", "repro")}}


def fix_cell(kernel, args: dict) -> dict:
    """The source of a ``%%fix`` cell to edit: the session's current code under the magic.

    The current code is what was reproduced, or the last kept fix: editing it is one change
    away from what the session measured. A session of a script (not a cell of this kernel) gets
    an empty ``%%fix`` cell with a comment, since its code lives in a file.
    """
    if not kernel.has_session:
        raise ValueError("no session yet: run a %%reproduce cell first")
    session = kernel.session
    info = session.state.artifact
    code = session.store.read(session.state.current) if info is not None and \
        info.type == "cell" else None
    if code is None:
        return {"source": FIX_COMMENT, "prefilled": False}
    body = code.decode("utf-8", "replace").rstrip("\n")
    return {"source": f"%%fix\n{body}\n", "prefilled": True}


FIX_COMMENT = "%%fix\n# the changed training code: one change, for the confirmed finding\n"
COMMANDS = {"snapshot": lambda kernel, args: snapshot(kernel), "export": export,
            "fix_cell": fix_cell}


class Sidebar:
    """The sidebar comms of one kernel session.

    A snapshot on hello, an event after every event of the session, replies to requests.

    Parameters
    ----------
    kernel : NotebookSession
        Whose session the sidebar shows (it follows the kernel's current DebugSession:
        :meth:`follow`).
    """

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.comms: list = []
        self.manager = None  # the kernel's comm manager the target is registered with
        self._unsubscribe = None
        if kernel.has_session:
            self.follow(kernel.session)

    def follow(self, session) -> None:
        """Push an event after every event appended to ``session`` (the kernel's, from now on).

        The new session's snapshot is pushed at once.
        """
        if self._unsubscribe is not None:
            self._unsubscribe()
        self._unsubscribe = session.on_change(self.push)
        self.push()

    def snapshot(self) -> dict:
        """The snapshot of the kernel's session."""
        return snapshot(self.kernel)

    def open(self, comm, open_msg: dict) -> None:
        """The comm target: a frontend opened a comm (``hello`` in its data gets a snapshot)."""
        self.adopt(comm, (open_msg.get("content") or {}).get("data"))

    def adopt(self, comm, open_data: dict | None = None) -> None:
        """Serve ``comm`` (opened by either end)."""
        self.comms.append(comm)
        comm.on_msg(lambda msg: self.receive(comm, msg))
        comm.on_close(lambda _msg: self._forget(comm))
        if (open_data or {}).get("type") == "hello":
            self._send(comm, {"type": "snapshot", "snapshot": self.snapshot()})

    def receive(self, comm, msg: dict) -> None:
        """Answer one message from the frontend (``hello`` or a ``request``)."""
        data = (msg.get("content") or {}).get("data") or {}
        kind = data.get("type")
        if kind == "hello":
            self._send(comm, {"type": "snapshot", "snapshot": self.snapshot()})
        elif kind == "request":
            rid = data.get("id")
            command = COMMANDS.get(data.get("command"))
            if command is None:
                self._send(comm, {"type": "reply", "id": rid, "ok": False,
                                  "error": f"unknown command {data.get('command')!r} "
                                           f"(known: {', '.join(sorted(COMMANDS))})"})
                return
            try:
                result = command(self.kernel, data.get("args") or {})
            except Exception as exc:  # noqa: BLE001 - every failure goes back as a reply
                self._send(comm, {"type": "reply", "id": rid, "ok": False,
                                  "error": f"{type(exc).__name__}: {exc}"})
                return
            self._send(comm, {"type": "reply", "id": rid, "ok": True, "result": result})

    def push(self, state=None) -> None:
        """Send every open comm the current snapshot as an ``event``."""
        if not self.comms:
            return
        data = {"type": "event", "snapshot": self.snapshot()}
        for comm in list(self.comms):
            self._send(comm, data)

    def _send(self, comm, data: dict) -> None:
        try:
            comm.send(json.loads(json.dumps(_clean(data))))
        except Exception:  # noqa: BLE001 - a closed frontend must never break the user's cell
            self._forget(comm)

    def _forget(self, comm) -> None:
        if comm in self.comms:
            self.comms.remove(comm)

    def close(self) -> None:
        """Close the comms, remove the target and stop following the session."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for comm in list(self.comms):
            try:
                comm.close()
            except Exception:  # noqa: BLE001
                pass
        self.comms.clear()
        if self.manager is not None:
            try:
                self.manager.unregister_target(TARGET, self.open)
            except Exception:  # noqa: BLE001 - never registered
                pass
            self.manager = None


def _kernel_of(shell, kernel):
    if kernel is not None:
        return kernel
    from .notebook import current_session

    try:
        return current_session(shell)
    except RuntimeError:
        return None


def register(shell, kernel=None) -> bool:
    """Register the comm target on ``shell``'s kernel for the kernel's session.

    Parameters
    ----------
    shell : InteractiveShell
        The shell whose kernel's comm manager gets the target.
    kernel : NotebookSession, optional
        The session the sidebar shows (default: the one the magics on ``shell`` own).

    Returns
    -------
    bool
        False (and nothing done) outside a kernel or without a loaded extension.
    """
    manager = _manager(shell)
    kernel = _kernel_of(shell, kernel)
    if manager is None or kernel is None:
        return False
    if kernel.sidebar is None:
        kernel.sidebar = Sidebar(kernel)
    sidebar = kernel.sidebar
    if sidebar.manager is not manager:
        manager.register_target(TARGET, sidebar.open)
        sidebar.manager = manager
    try:  # announce: a sidebar that is already open connects now
        from comm import create_comm

        comm = create_comm(target_name=TARGET, data={"type": "snapshot",
                                                     "snapshot": sidebar.snapshot()})
        sidebar.adopt(comm)
    except Exception:  # noqa: BLE001 - no frontend listening: it says hello later
        pass
    return True


def unregister(shell, kernel=None) -> None:
    """Close the sidebar's comms and remove the target (the saved session stays on disk)."""
    kernel = _kernel_of(shell, kernel)
    if kernel is not None and kernel.sidebar is not None:
        kernel.sidebar.close()
        kernel.sidebar = None
