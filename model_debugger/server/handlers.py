"""Thin, authenticated REST handlers for saved sessions (usable when no kernel is running).

- ``GET  /model-debugger/sessions``: the sessions saved under the server root
  (``.model_debugger/<id>/session.json`` in the root and up to two folder levels below it).
- ``GET  /model-debugger/sessions/<path>``: one session's report; ``<path>`` is the session
  folder relative to the root (as listed).
- ``POST /model-debugger/export``: ``{"session": <path>, "path": <notebook path, optional>,
  "overwrite": false}`` writes the record notebook and ``repro.py`` beside it through the safe
  writer (:func:`model_debugger.export.export_files`): default inside the session folder; an
  existing file elsewhere is 409 unless ``"overwrite": true``; a symlink at any component, or a
  session id that is not one safe path component, is refused.

Every path is relative to the server root; anything resolving outside it is refused (403). Errors
are JSON (``{"message": ...}``). The domain code knows nothing of Tornado; these handlers only
translate.
"""

from __future__ import annotations

import asyncio
import json
import os

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

try:  # jupyter_server >= 2
    from jupyter_server.auth.decorator import authorized
except ImportError:  # pragma: no cover - jupyter_server 1.x
    def authorized(method):
        """A no-op stand-in for ``authorized`` (jupyter_server 1.x has none)."""
        return method

from ..store import Store, find_sessions, session_file_ok  # noqa: E402

AUTH_RESOURCE = "contents"


def _root(handler: APIHandler) -> str:
    root = handler.settings.get("server_root_dir") or os.getcwd()
    return os.path.realpath(os.path.expanduser(root))


def resolve(root: str, relative: str) -> str:
    """``relative`` under ``root`` as an absolute real path; HTTPError 403 when outside it."""
    if not isinstance(relative, str) or not relative.strip():
        raise tornado.web.HTTPError(400, "a path relative to the server root is required")
    if os.path.isabs(relative) or "\x00" in relative:
        raise tornado.web.HTTPError(403, f"{relative!r}: only paths inside the server root")
    full = os.path.realpath(os.path.join(root, relative))
    if full != root and not full.startswith(root + os.sep):
        raise tornado.web.HTTPError(403, f"{relative!r} is outside the server root")
    return full


def _rel(root: str, path: str) -> str:
    return os.path.relpath(path, root).replace(os.sep, "/")


def summary(root: str, folder: str) -> dict:
    """What the list shows of one session (``error`` instead when it cannot be loaded)."""
    from ..session import DebugSession, SessionError

    item = {"path": _rel(root, folder), "id": os.path.basename(folder)}
    try:
        session = DebugSession.load(folder)
        report = session.report()
    except (SessionError, OSError) as exc:
        return {**item, "error": str(exc)}
    cls = report.get("classification") or {}
    verification = report.get("verification") or {}
    return {**item, "phase": report["phase"], "primary": cls.get("primary"),
            "fix_allowed": report["fix_allowed"], "verdict": verification.get("verdict"),
            "title": session.title, "created": session.created}


def _load(root: str, relative: str):
    from ..session import DebugSession, SessionError

    folder = resolve(root, relative)
    # as named, not as resolved: a symlinked session folder or session.json is refused, even one
    # pointing inside the root (it could be swapped for one pointing outside)
    named = os.path.normpath(os.path.join(root, relative))
    if named != root and not named.startswith(root + os.sep):
        raise tornado.web.HTTPError(403, f"{relative!r} is outside the server root")
    if not session_file_ok(root, named):
        if os.path.lexists(Store(named).session_file) or os.path.islink(named):
            raise tornado.web.HTTPError(403, f"{relative!r}: a symlink or not a regular "
                                             "session file: refused")
        raise tornado.web.HTTPError(404, f"no model_debugger session at {relative!r}")
    folder = named
    try:
        return DebugSession.load(folder)
    except SessionError as exc:
        raise tornado.web.HTTPError(422, str(exc)) from None


class _Base(APIHandler):
    auth_resource = AUTH_RESOURCE

    def write_error(self, status_code: int, **kwargs) -> None:
        """Errors as JSON: ``{"message", "reason", "status"}``."""
        self.set_header("Content-Type", "application/json")
        reason = self._reason
        message = reason
        exc_info = kwargs.get("exc_info")
        if exc_info:
            exc = exc_info[1]
            if isinstance(exc, tornado.web.HTTPError):
                message = exc.log_message % exc.args if exc.log_message else reason
            else:
                message = f"{type(exc).__name__}: {exc}"
        self.finish(json.dumps({"message": message, "reason": reason, "status": status_code}))


class SessionsHandler(_Base):
    """``GET /model-debugger/sessions``: the sessions saved under the server root."""

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        """Reply ``{"root", "sessions"}``: one summary per session folder found."""
        root = _root(self)
        folders = await asyncio.get_running_loop().run_in_executor(None, find_sessions, root)
        items = [summary(root, f) for f in folders]
        self.finish(json.dumps({"root": root, "sessions": items}))


class SessionHandler(_Base):
    """``GET /model-debugger/sessions/<path>``: one session's report."""

    @tornado.web.authenticated
    @authorized
    async def get(self, path: str) -> None:
        """Reply ``{"path", "report"}`` for the session folder ``path`` (relative to the root)."""
        root = _root(self)
        session = _load(root, path)
        self.finish(json.dumps({"path": _rel(root, session.directory),
                                "report": session.report()}, default=str))


class ExportHandler(_Base):
    """``POST /model-debugger/export``: write a session's record notebook and ``repro.py``."""

    @tornado.web.authenticated
    @authorized
    async def post(self) -> None:
        """Export the session the JSON body names (``session``, ``path``, ``overwrite``)."""
        root = _root(self)
        try:
            body = json.loads(self.request.body or b"{}")
        except json.JSONDecodeError as exc:
            raise tornado.web.HTTPError(400, f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise tornado.web.HTTPError(400, "the body must be a JSON object")
        session = _load(root, body.get("session"))
        target, overwrite = body.get("path") or None, body.get("overwrite", False)
        if target is not None and not isinstance(target, str):
            raise tornado.web.HTTPError(400, "the export path must be a string")
        if not isinstance(overwrite, bool):
            raise tornado.web.HTTPError(400, "overwrite must be true or false")
        if target is not None and not target.endswith(".ipynb"):
            raise tornado.web.HTTPError(400, "the export path must end with .ipynb")
        if target is not None and (os.path.isabs(target) or "\x00" in target):
            raise tornado.web.HTTPError(403, f"{target!r}: only paths inside the server root")

        def run() -> dict:
            from ..export import export_files

            return export_files(session, target, root=root, overwrite=overwrite)

        from ..safe_write import TargetExists, UnsafePath, check_component

        try:
            check_component(session.id, "session id")
        except UnsafePath as exc:
            raise tornado.web.HTTPError(422, f"refused: {exc}") from None
        try:
            written = await asyncio.get_running_loop().run_in_executor(None, run)
        except TargetExists as exc:
            raise tornado.web.HTTPError(409, f"{_rel(root, exc.filename)} exists; send "
                                             "\"overwrite\": true to replace it") from None
        except UnsafePath as exc:
            raise tornado.web.HTTPError(403, f"export refused: {exc}") from None
        except (OSError, ValueError, RuntimeError) as exc:
            raise tornado.web.HTTPError(500, f"export failed: {exc}") from None
        self.finish(json.dumps({"notebook": _rel(root, written["notebook"]),
                                "repro": _rel(root, written["repro"]),
                                "replaced": [_rel(root, p) for p in written["replaced"]]}))


def setup_handlers(web_app) -> None:
    """Add the handlers under ``<base_url>/model-debugger/``."""
    base = url_path_join(web_app.settings.get("base_url", "/"), "model-debugger")
    web_app.add_handlers(".*$", [
        (url_path_join(base, "sessions"), SessionsHandler),
        (url_path_join(base, "sessions", "(.+)"), SessionHandler),
        (url_path_join(base, "export"), ExportHandler),
    ])
