"""DebugSession: the single source of truth of an investigation.

State is an append-only event log; everything else (phase, classification, gates) is derived
from it by replay, so a session reloaded after a restart is exactly the one that was saved. The
file is written atomically (temp file + rename) under ``.model_debugger/<session-id>/``.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time

from .records import Classification, Finding
from .redact import redact, redact_code, redact_value, remember_environment
from .safe_write import write_inside

SCHEMA = "model_debugger.session/1"
REPORT_SCHEMA = "model_debugger.report/1"
PHASES = ("reproduce", "classify", "isolate", "fix", "verify")
VERDICTS = ("resolved", "partially_resolved", "not_resolved")
SESSION_FILE = "session.json"


def _ignore_all(root: str) -> None:
    """Write ``root/.gitignore`` (``*``) unless one exists; never follows a symlink."""
    try:
        fd = os.open(os.path.join(root, ".gitignore"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:  # there is one already (the user's), or the root is read-only
        return
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write("*\n")


def _private_tree(directory: str) -> None:
    """Folders 0700 and files 0600 under ``directory`` (symlinks are neither followed nor changed)."""
    import stat

    for path, dirs, files in os.walk(directory):
        for name, mode in [(d, 0o700) for d in dirs] + [(f, 0o600) for f in files]:
            full = os.path.join(path, name)
            try:
                st = os.lstat(full)
                if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) != mode:
                    os.chmod(full, mode)
            except OSError:
                continue
    try:
        os.chmod(directory, 0o700)
    except OSError:
        pass


class SessionError(Exception):
    """A session file that cannot be used, or an action the phase gates refuse."""


class GateError(SessionError):
    """An action refused by a phase gate; the session is unchanged."""


class SessionLocked(SessionError):
    """Another live process holds the session's lock (a phase is writing to it)."""


LOCK_FILE = ".lock"
APPEND_WAIT = 5.0  # seconds an event waits for another process's lock before SessionLocked
_held: dict[str, list] = {}  # session folder -> [fd, depth]: re-entrant within this process


class DebugSession:
    """One investigation: Reproduce -> Classify -> Isolate -> Fix -> Verify.

    Parameters
    ----------
    directory : str
        The session folder (``.model_debugger/<id>``).
    data : dict
        The saved document: ``schema``, ``id``, ``created``, ``events``.
    """

    def __init__(self, directory: str, data: dict) -> None:
        self.directory = directory
        self._data = data

    # -- persistence -----------------------------------------------------------------------
    @classmethod
    def create(cls, root: str = ".model_debugger", title: str = "") -> DebugSession:
        """Create and save a new, empty session under ``root``.

        The session folder is private (0700, whatever the umask); a ``root`` this call creates,
        or one named ``.model_debugger``, gets a ``.gitignore`` of ``*`` so that sessions are
        never committed. The secret-looking environment values of this process are remembered
        for redaction (:func:`model_debugger.redact.remember_environment`).
        """
        remember_environment()
        sid = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
        root = os.path.abspath(root)
        made_root = not os.path.isdir(root)
        os.makedirs(root, mode=0o700, exist_ok=True)
        if made_root or os.path.basename(root) == ".model_debugger":
            _ignore_all(root)
        directory = os.path.join(root, sid)
        os.mkdir(directory, 0o700)
        os.chmod(directory, 0o700)
        session = cls(directory, {"schema": SCHEMA, "id": sid, "created": time.time(),
                                  "title": redact(title), "events": []})
        session.save()
        return session

    @classmethod
    def load(cls, path: str) -> DebugSession:
        """Load a session from its folder or its ``session.json``.

        Raises
        ------
        SessionError
            When the file is missing, not JSON, or not a model_debugger session.
        """
        file = os.path.join(path, SESSION_FILE) if os.path.isdir(path) else path
        try:
            with open(file, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            raise SessionError(f"no model_debugger session at {path!r} "
                               f"(expected {SESSION_FILE})") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SessionError(f"{file} is corrupt: not valid JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            found = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise SessionError(f"{file} is not a model_debugger session "
                               f"(schema {found!r}, expected {SCHEMA!r})")
        if not isinstance(data.get("events"), list) or not isinstance(data.get("id"), str):
            raise SessionError(f"{file} is corrupt: missing 'id' or 'events'")
        bad = [i for i, e in enumerate(data["events"])
               if not isinstance(e, dict) or not isinstance(e.get("kind"), str)]
        if bad:
            raise SessionError(f"{file} is corrupt: event {bad[0]} has no 'kind'")
        session = cls(os.path.dirname(os.path.abspath(file)), data)
        try:
            session.report()
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SessionError(f"{file} is corrupt: {type(exc).__name__}: {exc}") from None
        return session

    def save(self) -> None:
        """Write ``session.json`` atomically."""
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".session-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(self._data, fh, indent=1, default=str)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, os.path.join(self.directory, SESSION_FILE))
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    # -- the log ---------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self._data["id"]

    @property
    def events(self) -> list[dict]:
        """The append-only event log (a copy)."""
        return [dict(e) for e in self._data["events"]]

    def append(self, kind: str, /, **data) -> dict:
        """Append an event and save; a failed save leaves the session as it was.

        The event is appended under the session's lock (:meth:`lock`, re-entrant: a phase that
        holds it just re-enters), to the events saved on disk (read again first), so two
        writers (a CLI verify and a kernel's ``%%fix``) never overwrite each other's events.
        Another process's lock is waited for up to ``APPEND_WAIT`` seconds, then
        :class:`SessionLocked` is raised and the session is unchanged.

        Every string in the payload is redacted first (:func:`model_debugger.redact.redact_value`),
        and the folder's files are made private (0600, folders 0700): whatever a phase or the
        child process wrote, the session folder holds no secret and nothing others can read.
        """
        payload = redact_value(data)
        with _SessionLock(self, kind, wait=APPEND_WAIT):
            self._reload()
            event = {"seq": len(self._data["events"]), "time": time.time(), "kind": kind,
                     **payload}
            self._data["events"].append(event)
            try:
                self.save()
            except BaseException:
                self._data["events"].pop()
                raise
        _private_tree(self.directory)
        return event

    def _last(self, kind: str) -> dict | None:
        return next((e for e in reversed(self._data["events"]) if e["kind"] == kind), None)

    # -- locking -------------------------------------------------------------------------
    def lock(self, phase: str) -> _SessionLock:
        """Hold the session's lock while ``phase`` writes to it: ``with session.lock("verify"):``.

        The lock is ``.lock`` in the session folder, holding the pid and the phase, under an
        exclusive ``flock``: the kernel releases it when its process dies, so the lock of a dead
        (killed) process is taken over, whatever the file still says. Re-entrant within one
        process. On entry the session is reloaded from disk, so the phase sees what an earlier
        holder wrote.

        Raises
        ------
        SessionLocked
            When another live process holds it; one line naming the holder's pid and phase.
        """
        return _SessionLock(self, phase)

    def _reload(self) -> None:
        """Read the saved events again (another process may have appended since this loaded)."""
        try:
            with open(os.path.join(self.directory, SESSION_FILE), encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return
        if isinstance(data, dict) and data.get("id") == self.id and \
                isinstance(data.get("events"), list):
            self._data = data

    def run_dir(self, n: int) -> str:
        """The folder of the n-th captured run (created)."""
        path = os.path.join(self.directory, "runs", str(n))
        os.makedirs(path, exist_ok=True)
        return path

    # -- derived state ---------------------------------------------------------------------
    @property
    def reproduce(self) -> dict | None:
        e = self._last("reproduce")
        return e["result"] if e else None

    @property
    def classification(self) -> Classification | None:
        e = self._last("classify")
        return Classification.from_json(e["classification"]) if e else None

    @property
    def findings(self) -> list[Finding]:
        e = self._last("isolate")
        return [Finding.from_json(f) for f in e["findings"]] if e else []

    def _state(self) -> dict:
        """Replay Isolate/Fix/Verify events: the queue, the pending fix, what was resolved."""
        st: dict = {"resolved": [], "settled": [], "pending": None, "reisolate": False, "remaining": [],
                    "problem": None, "artifact": None, "copy": None, "verifications": 0}
        for e in self._data["events"]:
            kind = e["kind"]
            if kind == "artifact":
                st["artifact"] = e.get("script")
                st["copy"] = os.path.join(self.directory, e.get("copy") or "artifact.py")
            elif kind == "classify":
                st["problem"] = e["classification"]["primary"]
            elif kind == "isolate":
                st.update(resolved=[], settled=[], pending=None, reisolate=False)
            elif kind == "fix":
                st["pending"] = e["fix"]
            elif kind == "verify" and st["pending"] is not None:
                v, fix = e["verification"], st["pending"]
                st["verifications"] += 1
                st["pending"] = None
                if v["verdict"] in ("resolved", "partially_resolved"):
                    st["artifact"] = fix.get("fixed") or st["artifact"]
                    st["copy"] = os.path.join(self.directory, fix["copy"])
                if v["verdict"] == "resolved":
                    st["resolved"].append(fix["finding"])
                    if v.get("category"):
                        st["settled"].append(v["category"])
                    st["remaining"] = list(v.get("remaining", []))
                elif v["verdict"] == "partially_resolved":
                    st["reisolate"] = True
        return st

    @property
    def queue(self) -> list[Finding]:
        """Confirmed findings still to fix, in priority order (the first is current).

        A resolved verdict settles its finding and every other finding that explained the same
        category (they were causes of a symptom that is gone); findings about other categories
        stay queued.
        """
        st = self._state()
        if st["reisolate"]:
            return []
        return [f for f in self.findings if f.confirmed and f.root_cause != "hardware"
                and f.check not in st["resolved"]
                and (f.evidence or {}).get("category") not in st["settled"]]

    @property
    def escalations(self) -> list[Finding]:
        """Confirmed hardware findings: escalated (driver, device), never fixed in code."""
        return [f for f in self.findings if f.confirmed and f.root_cause == "hardware"]

    @property
    def pending_fix(self) -> dict | None:
        """The approved fix awaiting Verify, or None."""
        return self._state()["pending"]

    @property
    def artifact(self) -> str | None:
        """Where the current artifact came from: the reproduced script, or the last kept fix."""
        return self._state()["artifact"]

    @property
    def artifact_copy(self) -> str:
        """The session's own copy of the current artifact's code (what Fix diffs against)."""
        return self._state()["copy"] or os.path.join(self.directory, "artifact.py")

    @property
    def fix_allowed(self) -> bool:
        """True exactly when a confirmed, unresolved finding exists (the Fix gate)."""
        return bool(self.queue) and self._state()["pending"] is None

    @property
    def phase(self) -> str:
        """The current phase: the first one not yet done (``done`` when nothing is left)."""
        if self.reproduce is None or self._unobserved():
            return "reproduce"  # nothing was observed (or Ctrl-C came first): reproduce again
        if self.classification is None:
            return "classify"
        st = self._state()
        if st["pending"] is not None:
            return "verify"
        if self.queue:
            return "fix"
        if st["resolved"] and not st["remaining"] and not st["reisolate"]:
            return "done"
        return "isolate"

    def gates(self) -> dict[str, str | None]:
        """For each phase, None when it may run, else the reason it is blocked."""
        st = self._state()
        if st["pending"] is not None:
            fix_gate = "a fix is awaiting Verify"
        elif st["reisolate"]:
            fix_gate = "the last fix was partially resolved: run Isolate again"
        elif not self.queue and self.escalations:
            fix_gate = ("the confirmed cause is hardware: escalate it (driver, device, memory "
                        "test); there is nothing to fix in the training code")
        elif not self.queue:
            fix_gate = "needs a confirmed finding from Isolate"
        else:
            fix_gate = None
        unobserved = self._unobserved()
        return {
            "reproduce": None,
            "classify": (f"nothing to classify: {unobserved}" if unobserved else
                         None if self.reproduce is not None else "needs a reproduce record"),
            "isolate": (f"nothing to isolate: {unobserved}" if unobserved else
                        "needs a classification" if self.classification is None else
                        "a fix is awaiting Verify" if st["pending"] is not None else None),
            "fix": fix_gate,
            "verify": None if st["pending"] is not None else "needs an approved fix",
        }

    def _unobserved(self) -> str | None:
        """Why nothing can be classified: the reproduction observed no training step (or was
        interrupted before one); None when there is a classification or no reproduction yet."""
        rep = self.reproduce
        if rep is None or self.classification is not None:
            return None
        if rep.get("status") == "not_observed":
            return rep.get("reason") or "no training step was observed"
        if rep.get("status") == "interrupted" and not rep.get("steps"):
            return "Reproduce was interrupted before the first training step"
        return None

    def _require(self, phase: str) -> None:
        reason = self.gates()[phase]
        if reason:
            raise GateError(f"{phase} refused: {reason} (current phase: {self.phase})")

    # -- phase actions ---------------------------------------------------------------------
    def record_reproduce(self, result: dict) -> None:
        """Record the Reproduce result (status, steps, epochs, error, seconds, runs, ...)."""
        self.append("reproduce", result=result)

    def record_classification(self, classification: Classification, signals: dict) -> None:
        """Record the Classify result; needs a reproduce record."""
        self._require("classify")
        self.append("classify", classification=classification.to_json(), signals=signals)

    def record_findings(self, findings: list[Finding], **info) -> None:
        """Record Isolate's findings, confirmed first; needs a classification.

        ``info`` (probe timings, noise band, ...) is kept with the event.
        """
        self._require("isolate")
        ordered = sorted(findings, key=lambda f: not f.confirmed)
        self.append("isolate", findings=[f.to_json() for f in ordered], **info)

    def record_fix(self, fix: dict, approved: bool) -> None:
        """Record an approved fix plan (see :func:`model_debugger.fix.plan_fix`).

        Raises
        ------
        GateError
            Without a confirmed finding, without approval, or for a finding that is not the
            current one in the queue; the session is unchanged.
        """
        with _SessionLock(self, "fix", wait=APPEND_WAIT):  # gates and copy number: as saved
            self._reload()
            self._record_fix(fix, approved)

    def _record_fix(self, fix: dict, approved: bool) -> None:
        self._require("fix")
        if not approved:
            raise GateError("fix refused: the plan was not approved (approve it explicitly, "
                            "e.g. --yes or the Approve button)")
        current = self.queue[0]
        if not fix.get("source") and not fix.get("fixed"):
            raise GateError("fix refused: the plan holds no code (plan it with plan_fix)")
        if fix.get("finding") != current.check:
            raise GateError(f"fix refused: it addresses {fix.get('finding')!r}, but the current "
                            f"finding is {current.check!r} (one problem at a time, in order: "
                            f"{', '.join(f.check for f in self.queue)})")
        fix = dict(fix)
        source = fix.pop("source", None)
        n = sum(1 for e in self._data["events"] if e["kind"] == "fix")
        fix["copy"] = os.path.join("fixes", f"{n + 1}.py")
        if source is None and fix.get("fixed"):
            with open(fix["fixed"], encoding="utf-8", errors="surrogateescape") as fh:
                source = fh.read()
        write_inside(self.directory, fix["copy"],  # atomic, 0600, no symlink followed
                     redact_code(source or "").encode("utf-8", "surrogateescape"),
                     overwrite=True, mode=0o600)
        self.append("fix", fix={**fix, "approved": True})

    def record_verification(self, verification: dict) -> None:
        """Record Verify's verdict on the pending fix; needs an approved fix."""
        self._require("verify")
        if verification.get("verdict") not in VERDICTS:
            raise SessionError(f"unknown verdict {verification.get('verdict')!r}")
        self.append("verify", verification=verification)

    @property
    def root_cause(self) -> Finding | None:
        """The current confirmed finding (the root cause Fix works on), or None."""
        queue = self.queue
        return queue[0] if queue else None

    def report(self) -> dict:
        """The report shared by the CLI, notebooks, the sidebar and exports."""
        rep = self.reproduce
        cls = self.classification
        fix = self._last("fix")
        ver = self._last("verify")
        return {
            "schema": REPORT_SCHEMA,
            "session": self.id,
            "session_dir": self.directory,
            "phase": self.phase,
            "fix_allowed": self.fix_allowed,
            "reproduce": rep,
            "classification": cls.to_json() if cls else None,
            "findings": [f.to_json() for f in self.findings],
            "fix": fix["fix"] if fix else None,
            "verification": ver["verification"] if ver else None,
            "queue": [f.check for f in self.queue],
            "escalations": [f.to_json() for f in self.escalations],
            "gates": self.gates(),
        }


class _SessionLock:
    """The context manager of :meth:`DebugSession.lock`."""

    def __init__(self, session: DebugSession, phase: str, wait: float = 0.0) -> None:
        self.session = session
        self.phase = phase
        self.wait = wait  # seconds to wait for another process's lock (0: refuse at once)
        self.key = os.path.realpath(session.directory)

    def __enter__(self) -> DebugSession:
        held = _held.get(self.key)
        if held is not None:
            held[1] += 1
            return self.session
        import fcntl

        path = os.path.join(self.key, LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        deadline = time.monotonic() + self.wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
            os.close(fd)
            pid = holder[0] if holder else "unknown"
            what = f" ({holder[1]} running)" if len(holder) > 1 else ""
            raise SessionLocked(f"session {self.session.id} is locked by pid {pid}{what}; wait "
                                "for it to finish or stop it") from None
        try:  # ours: a stale file from a dead process is simply overwritten
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {self.phase}\n".encode(), 0)
        except OSError:
            pass
        _held[self.key] = [fd, 1]
        self.session._reload()
        return self.session

    def __exit__(self, *exc) -> bool:
        held = _held.get(self.key)
        if held is None:
            return False
        held[1] -= 1
        if held[1] == 0:
            del _held[self.key]
            try:
                os.ftruncate(held[0], 0)  # never unlinked: another process may hold it open
            except OSError:
                pass
            os.close(held[0])  # releases the flock
        return False
