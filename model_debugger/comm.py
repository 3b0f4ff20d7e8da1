"""The kernel end of the JupyterLab sidebar: a comm with target ``model_debugger``.

Protocol (every message is a JSON object with a ``type``):

- frontend -> kernel ``{"type": "hello"}`` (in the ``comm_open`` data or as a message):
  the kernel answers ``{"type": "snapshot", "snapshot": SNAPSHOT}``.
- kernel -> frontend ``{"type": "event", "snapshot": SNAPSHOT}`` after every change of the
  notebook session (:meth:`model_debugger.notebook.NotebookSession.on_change`).
- frontend -> kernel ``{"type": "request", "id": ID, "command": NAME, "args": {...}}``; the
  kernel answers ``{"type": "reply", "id": ID, "ok": true, "result": ...}`` or
  ``{"type": "reply", "id": ID, "ok": false, "error": "..."}``. Commands: ``snapshot``,
  ``export`` (``args.path``: where to write the record notebook, optional).

SNAPSHOT follows ``model_debugger/schema/snapshot.schema.json`` (the sidebar's TypeScript types
are generated from the same file). :func:`register` also opens a comm from the kernel, so a
sidebar that is already open connects as soon as ``%load_ext model_debugger`` runs.

Everything here is a no-op outside a kernel (plain IPython, scripts).
"""

from __future__ import annotations

import json
import math
import os

TARGET = "model_debugger"
SNAPSHOT_SCHEMA = "model_debugger.snapshot/1"
PROTOCOL = 1

_STATE: dict = {"comms": [], "manager": None, "session": None}


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


def snapshot(ns=None) -> dict:
    """The sidebar's view of the kernel's session (see the module docstring)."""
    from . import __version__
    from .notebook import current_session

    ns = ns if ns is not None else current_session()
    session = ns.session if ns.has_session else None  # asking must not create a session
    report = session.report() if session is not None else None
    plan = ns.plan if isinstance(getattr(ns, "plan", None), dict) else None
    return _clean({"schema": SNAPSHOT_SCHEMA, "protocol": PROTOCOL, "version": __version__,
                   "cwd": os.getcwd(), "root": ns.root, "report": report,
                   "plan": {k: v for k, v in plan.items() if k != "source"} if plan else None})


def _send(comm, data: dict) -> None:
    try:
        comm.send(json.loads(json.dumps(_clean(data))))
    except Exception:  # noqa: BLE001 - a closed frontend must never break the user's cell
        _forget(comm)


def _forget(comm) -> None:
    if comm in _STATE["comms"]:
        _STATE["comms"].remove(comm)


def _export(args: dict) -> dict:
    """Export the kernel's session. ``args.path``: a notebook path inside the kernel's folder
    (the notebook's); default the session folder. ``args.overwrite``: replace existing files
    (otherwise an existing target is an error)."""
    from .export import export_files
    from .notebook import current_session

    ns = current_session()
    if not ns.has_session:
        raise ValueError("no session to export yet: run a %%reproduce cell first")
    path = args.get("path") or None
    if path is not None and not isinstance(path, str):
        raise ValueError("args.path must be a string")
    cwd = os.getcwd()
    written = export_files(ns.session, path, root=cwd if path is not None else None,
                           overwrite=args.get("overwrite") is True)
    return {"notebook": written["notebook"], "repro": written["repro"],
            "replaced": written["replaced"],
            "relative": {k: os.path.relpath(written[k], cwd).replace(os.sep, "/")
                         for k in ("notebook", "repro")}}


COMMANDS = {"snapshot": lambda args: snapshot(), "export": _export}


def _on_msg(comm, msg: dict) -> None:
    data = (msg.get("content") or {}).get("data") or {}
    kind = data.get("type")
    if kind == "hello":
        _send(comm, {"type": "snapshot", "snapshot": snapshot()})
    elif kind == "request":
        rid = data.get("id")
        command = COMMANDS.get(data.get("command"))
        if command is None:
            _send(comm, {"type": "reply", "id": rid, "ok": False,
                         "error": f"unknown command {data.get('command')!r} "
                                  f"(known: {', '.join(sorted(COMMANDS))})"})
            return
        try:
            result = command(data.get("args") or {})
        except Exception as exc:  # noqa: BLE001 - every failure goes back as a reply
            _send(comm, {"type": "reply", "id": rid, "ok": False,
                         "error": f"{type(exc).__name__}: {exc}"})
            return
        _send(comm, {"type": "reply", "id": rid, "ok": True, "result": result})


def _adopt(comm, open_data: dict | None) -> None:
    _STATE["comms"].append(comm)
    comm.on_msg(lambda msg: _on_msg(comm, msg))
    comm.on_close(lambda _msg: _forget(comm))
    if (open_data or {}).get("type") == "hello":
        _send(comm, {"type": "snapshot", "snapshot": snapshot()})


def _target(comm, open_msg: dict) -> None:
    _adopt(comm, (open_msg.get("content") or {}).get("data"))


def _changed() -> None:
    if not _STATE["comms"]:
        return
    data = {"type": "event", "snapshot": snapshot()}
    for comm in list(_STATE["comms"]):
        _send(comm, data)


def register(shell) -> bool:
    """Register the comm target on ``shell``'s kernel and follow the notebook session.

    Returns False (and does nothing) outside a kernel.
    """
    manager = _manager(shell)
    if manager is None:
        return False
    from .notebook import current_session

    if _STATE["manager"] is not manager:
        manager.register_target(TARGET, _target)
        _STATE["manager"] = manager
    ns = current_session()
    if _STATE["session"] is not ns:
        ns.on_change(_changed)
        _STATE["session"] = ns
    try:  # announce: a sidebar that is already open connects now
        from comm import create_comm

        comm = create_comm(target_name=TARGET, data={"type": "snapshot",
                                                     "snapshot": snapshot()})
        _adopt(comm, None)
    except Exception:  # noqa: BLE001 - no frontend listening: it says hello later
        pass
    return True


def unregister(shell) -> None:
    """Close the comms and remove the target (the saved session stays on disk)."""
    manager = _manager(shell) or _STATE["manager"]
    for comm in list(_STATE["comms"]):
        try:
            comm.close()
        except Exception:  # noqa: BLE001
            pass
    _STATE["comms"].clear()
    if manager is not None:
        try:
            manager.unregister_target(TARGET, _target)
        except Exception:  # noqa: BLE001 - never registered
            pass
    _STATE.update(manager=None, session=None)
