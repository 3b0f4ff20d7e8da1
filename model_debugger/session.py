"""DebugSession: the single source of truth of an investigation.

State is an append-only event log; everything else (phase, gates, the queue of findings, what was
resolved) is derived from it by one replay (:func:`replay`) into an immutable :class:`State`, so a
session reloaded after a restart is exactly the one that was saved. Events are appended only by
the ``record_*`` methods, which check the phase gates; every appended event notifies the
session's observers (:meth:`DebugSession.on_change`), so every view renders the same state. The
folder's layout belongs to :mod:`model_debugger.store`.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import types
import warnings
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .records import (
    VERDICTS,
    ArtifactInfo,
    Classification,
    Finding,
    FixPlan,
    RecordError,
    Reproduction,
    Verification,
)
from .redact import redact, redact_code, redact_value, remember_environment
from .store import ARTIFACT, LOCK_FILE, ROOT, SESSION_FILE, Store, session_file_of

SCHEMA = "model_debugger.session/1"
REPORT_SCHEMA = "model_debugger.report/1"
PHASES = ("reproduce", "classify", "isolate", "fix", "verify")
__all__ = ["DebugSession", "GateError", "SessionError", "SessionLocked", "State", "replay",
           "PHASES", "VERDICTS", "ROOT", "SESSION_FILE"]


class SessionError(Exception):
    """A session file that cannot be used, or an action the phase gates refuse."""


class GateError(SessionError):
    """An action refused by a phase gate; the session is unchanged."""


class SessionLocked(SessionError):
    """Another live process holds the session's lock (a phase is writing to it)."""


@dataclass(frozen=True)
class State:
    """What an event log says, replayed once (:func:`replay`); every view renders from it.

    Attributes
    ----------
    phase : str
        The current phase (the first one not done; ``done`` when nothing is left).
    gates : Mapping
        For each phase, None when it may run, else why it is blocked.
    strip : tuple of (phase, status)
        The phase strip every view shows: each phase ``done``, ``current``, ``open``
        (may run) or ``blocked``.
    queue : tuple of Finding
        Confirmed findings still to fix, in order (the first is current).
    plan : FixPlan or None
        A plan awaiting approval (survives a restart; dropped by any later phase event).
    pending : FixPlan or None
        The approved fix awaiting Verify.
    current : str
        The session's copy of the current code (relative): the reproduced code, or the last
        kept fix.
    current_source : str or None
        Where the current code came from (the user's script, or the kept fix's file).
    """

    events: int = 0
    artifact: ArtifactInfo | None = None
    reproduction: Reproduction | None = None
    classification: Classification | None = None
    signals: Mapping = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()
    isolate_info: Mapping = field(default_factory=dict)
    isolations: int = 0
    plan: FixPlan | None = None
    pending: FixPlan | None = None
    fixes: int = 0
    verification: Verification | None = None
    verifications: int = 0
    resolved: tuple[str, ...] = ()
    settled: tuple[str, ...] = ()
    remaining: tuple[str, ...] = ()
    reisolate: bool = False
    problem: str | None = None
    current: str = ARTIFACT
    current_source: str | None = None
    evidence: tuple[dict, ...] = ()
    queue: tuple[Finding, ...] = ()
    escalations: tuple[Finding, ...] = ()
    gates: Mapping = field(default_factory=dict)
    phase: str = "reproduce"
    strip: tuple[tuple[str, str], ...] = ()
    unobserved: str | None = None

    @property
    def fix_allowed(self) -> bool:
        """True exactly when a confirmed, unresolved finding exists (the Fix gate)."""
        return self.gates.get("fix") is None

    @property
    def root_cause(self) -> Finding | None:
        """The current confirmed finding (the root cause Fix works on), or None."""
        return self.queue[0] if self.queue else None


def _unobserved(rep: Reproduction | None, cls: Classification | None) -> str | None:
    """Why nothing can be classified; None when there is a classification or no reproduction.

    The reproduction observed no training step (or was interrupted before one).
    """
    if rep is None or cls is not None:
        return None
    if rep.status == "not_observed":
        return rep.reason or "no training step was observed"
    if rep.status == "interrupted" and not rep.steps:
        return "Reproduce was interrupted before the first training step"
    return None


def replay(events: list[dict]) -> State:
    """Replay an event log into its :class:`State`.

    Raises RecordError, KeyError or TypeError on events that do not hold what their kind needs.
    """
    st: dict = {"resolved": [], "settled": [], "remaining": [], "evidence": []}
    for e in events:
        kind = e["kind"]
        if kind == "artifact":
            info = ArtifactInfo.from_json({k: v for k, v in e.items()
                                           if k not in ("seq", "time", "kind")})
            st.update(artifact=info, current=info.copy or ARTIFACT,
                      current_source=info.script)
        elif kind == "reproduce":
            st.update(reproduction=Reproduction.from_json(e["result"]), classification=None,
                      signals={}, plan=None)
        elif kind == "classify":
            cls = Classification.from_json(e["classification"])
            st.update(classification=cls, signals=e.get("signals") or {}, problem=cls.primary,
                      plan=None)
        elif kind == "isolate":
            found = tuple(Finding.from_json(f) for f in e["findings"])
            st.update(findings=found, isolations=st.get("isolations", 0) + 1, plan=None,
                      isolate_info={k: e.get(k) for k in ("probe_seconds", "live", "noise",
                                                          "lr_range", "added")})
            if not e.get("added"):  # a new round (not probes added to this one)
                st.update(resolved=[], settled=[], reisolate=False, pending=None)
        elif kind == "plan":
            st["plan"] = FixPlan.from_json(e["plan"])
        elif kind == "fix":
            st.update(pending=FixPlan.from_json(e["fix"]), plan=None,
                      fixes=st.get("fixes", 0) + 1)
        elif kind == "verify" and st.get("pending") is not None:
            v, fix = Verification.from_json(e["verification"]), st["pending"]
            st.update(verification=v, verifications=st.get("verifications", 0) + 1,
                      pending=None, plan=None)
            if v.verdict in ("resolved", "partially_resolved"):
                st.update(current=fix.copy or st.get("current", ARTIFACT),
                          current_source=fix.fixed or st.get("current_source"))
            if v.verdict == "resolved":
                st["resolved"].append(fix.finding)
                if v.category:
                    st["settled"].append(v.category)
                st["remaining"] = list(v.remaining)
            elif v.verdict == "partially_resolved":
                st["reisolate"] = True
        elif kind == "evidence":
            st["evidence"].append({k: v for k, v in e.items() if k not in ("seq", "kind")})
    return _derive(len(events), st)


def _derive(count: int, st: dict) -> State:
    """Queue, gates, phase and phase strip from the replayed facts."""
    rep, cls = st.get("reproduction"), st.get("classification")
    findings, pending = st.get("findings", ()), st.get("pending")
    reisolate = bool(st.get("reisolate"))
    cleared = bool(st["resolved"]) and not st["remaining"]  # the fixed runs show no problem
    queue = () if reisolate or cleared else tuple(
        f for f in findings if f.confirmed and f.root_cause != "hardware"
        and f.check not in st["resolved"] and f.category not in st["settled"])
    escalations = tuple(f for f in findings if f.confirmed and f.root_cause == "hardware")
    unobserved = _unobserved(rep, cls)
    if pending is not None:
        fix_gate = "a fix is awaiting Verify"
    elif reisolate:
        fix_gate = "the last fix was partially resolved: run Isolate again"
    elif not queue and escalations:
        fix_gate = ("the confirmed cause is hardware: escalate it (driver, device, memory "
                    "test); there is nothing to fix in the training code")
    elif not queue:
        fix_gate = "needs a confirmed finding from Isolate"
    else:
        fix_gate = None
    gates = {
        "reproduce": None,
        "classify": (f"nothing to classify: {unobserved}" if unobserved else
                     None if rep is not None else "needs a reproduce record"),
        "isolate": (f"nothing to isolate: {unobserved}" if unobserved else
                    "needs a classification" if cls is None else
                    "a fix is awaiting Verify" if pending is not None else None),
        "fix": fix_gate,
        "verify": None if pending is not None else "needs an approved fix",
    }
    if rep is None or unobserved:
        phase = "reproduce"
    elif cls is None:
        phase = "classify"
    elif pending is not None:
        phase = "verify"
    elif queue:
        phase = "fix"
    elif st["resolved"] and not st["remaining"] and not reisolate:
        phase = "done"
    else:
        phase = "isolate"
    done = {"reproduce": rep is not None and not unobserved, "classify": cls is not None,
            "isolate": bool(st.get("isolations")) and not reisolate,
            "fix": pending is not None or bool(st.get("verifications")),
            "verify": phase == "done"}
    strip = tuple((p, "current" if p == phase else "done" if done[p] else
                   "open" if gates[p] is None else "blocked") for p in PHASES)
    return State(
        events=count, artifact=st.get("artifact"), reproduction=rep, classification=cls,
        signals=types.MappingProxyType(dict(st.get("signals") or {})), findings=findings,
        isolate_info=types.MappingProxyType(st.get("isolate_info", {})),
        isolations=st.get("isolations", 0), plan=st.get("plan"), pending=pending,
        fixes=st.get("fixes", 0), verification=st.get("verification"),
        verifications=st.get("verifications", 0), resolved=tuple(st["resolved"]),
        settled=tuple(st["settled"]), remaining=tuple(st["remaining"]), reisolate=reisolate,
        problem=st.get("problem"), current=st.get("current", ARTIFACT),
        current_source=st.get("current_source"), evidence=tuple(st["evidence"]), queue=queue,
        escalations=escalations, gates=types.MappingProxyType(gates), phase=phase, strip=strip,
        unobserved=unobserved)


APPEND_WAIT = 5.0  # seconds an event waits for another process's lock before SessionLocked
_held: dict[str, list] = {}  # session folder -> [fd, depth]: re-entrant within this process
_observers: dict[str, list] = {}  # session folder -> weak callbacks, shared by every instance


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
        self.store = Store(directory)
        self.directory = self.store.directory
        self._data = data
        self._cache: tuple[int, State] | None = None

    # -- persistence -----------------------------------------------------------------------
    @classmethod
    def create(cls, root: str = ROOT, title: str = "") -> DebugSession:
        """Create and save a new, empty session under ``root``.

        The session folder is private (0700, whatever the umask); a ``root`` this call creates,
        or one named ``.model_debugger``, gets a ``.gitignore`` of ``*`` so that sessions are
        never committed. The secret-looking environment values of this process are remembered
        for redaction (:func:`model_debugger.redact.remember_environment`).
        """
        remember_environment()
        store = Store.create(root)
        session = cls(store.directory, {"schema": SCHEMA, "id": store.id, "created": time.time(),
                                         "title": redact(title), "events": []})
        session.save()
        return session

    @classmethod
    def load(cls, path: str) -> DebugSession:
        """Load a session from its folder or its ``session.json``.

        Raises
        ------
        SessionError
            When the file is missing, not JSON, or not a model_debugger session, or an event
            does not hold what its kind needs (a category outside the vocabulary, ...).
        """
        file = session_file_of(path)
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
            what = "" if isinstance(exc, RecordError) else f"{type(exc).__name__}: "
            raise SessionError(f"{file} is corrupt: {what}{exc}") from None
        return session

    def save(self) -> None:
        """Write ``session.json`` atomically."""
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".session-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(self._data, fh, indent=1, default=str)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.store.session_file)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    # -- the log ---------------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The session id (its folder's name)."""
        return self._data["id"]

    @property
    def title(self) -> str:
        """The session's title (empty when it has none)."""
        return str(self._data.get("title", ""))

    @property
    def created(self) -> float | None:
        """When the session was created (seconds since the epoch), or None when not recorded."""
        return self._data.get("created")

    @property
    def events(self) -> list[dict]:
        """The append-only event log (a copy)."""
        return [dict(e) for e in self._data["events"]]

    def _append(self, kind: str, /, **data) -> dict:
        """Append an event and save; a failed save leaves the session as it was.

        Private: front ends call the ``record_*`` methods, which check the gates. The event is
        appended under the session's lock (:meth:`lock`, re-entrant: a phase that holds it just
        re-enters), to the events saved on disk (read again first), so two writers (a CLI
        verify and a kernel's ``%%fix``) never overwrite each other's events. Another process's
        lock is waited for up to ``APPEND_WAIT`` seconds, then :class:`SessionLocked` is raised
        and the session is unchanged.

        Every string in the payload is redacted first (:func:`model_debugger.redact.redact_value`),
        and the folder's files are made private (0600, folders 0700): whatever a phase or the
        child process wrote, the session folder holds no secret and nothing others can read.
        The observers are told after the event is saved.
        """
        payload = redact_value(data)
        with _SessionLock(self, kind, wait=APPEND_WAIT):
            self.reload()
            event = {"seq": len(self._data["events"]), "time": time.time(), "kind": kind,
                     **payload}
            self._data["events"].append(event)
            try:
                replay(self._data["events"])  # an event the state cannot read is never saved
                self.save()
            except BaseException:
                self._data["events"].pop()
                raise
        self.store.private()
        self._notify()
        return event

    # -- observers -------------------------------------------------------------------------
    def on_change(self, callback: Callable[[State], None]) -> Callable[[], None]:
        """Call ``callback(state)`` after every event appended to this session's folder.

        Events appended by any DebugSession of this process count. A bound method is held
        weakly (a closed widget does not stay alive for it). Returns a function that removes
        the callback.
        """
        ref = weakref.WeakMethod(callback) if hasattr(callback, "__self__") else \
            (lambda cb=callback: cb)
        entries = _observers.setdefault(self.store.directory, [])
        entries.append(ref)

        def remove() -> None:
            if ref in entries:
                entries.remove(ref)

        return remove

    def _notify(self) -> None:
        entries = _observers.get(self.store.directory, [])
        state = self.state
        for ref in list(entries):
            callback = ref()
            if callback is None:
                entries.remove(ref)
                continue
            try:
                callback(state)
            except Exception as exc:  # noqa: BLE001 - a broken view must not undo the event
                warnings.warn(f"model_debugger: a view failed to refresh: "
                              f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)

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

    def reload(self) -> None:
        """Read the saved events again (another process may have appended since this loaded).

        A file that cannot be read leaves the session as it was.
        """
        try:
            with open(self.store.session_file, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return
        if isinstance(data, dict) and data.get("id") == self.id and \
                isinstance(data.get("events"), list):
            self._data = data

    # -- the state -------------------------------------------------------------------------
    @property
    def state(self) -> State:
        """The replayed state of the events (replayed once per new event)."""
        events = self._data["events"]
        key = len(events)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, replay(events))
        return self._cache[1]

    def run_dir(self, n: int) -> str:
        """The folder of the n-th captured run (created)."""
        return self.store.run_dir(n)

    @property
    def reproduce(self) -> dict | None:
        """The Reproduce verdict as the report's JSON (None before Reproduce)."""
        rep = self.state.reproduction
        return rep.to_json() if rep is not None else None

    @property
    def classification(self) -> Classification | None:
        """The recorded classification (None before Classify)."""
        return self.state.classification

    @property
    def findings(self) -> list[Finding]:
        """The findings of the latest Isolate round, confirmed first."""
        return list(self.state.findings)

    @property
    def queue(self) -> list[Finding]:
        """Confirmed findings still to fix, in priority order (the first is current).

        A resolved verdict settles its finding and every other finding that explained the same
        category (they were causes of a symptom that is gone); findings about other categories
        stay queued.
        """
        return list(self.state.queue)

    @property
    def escalations(self) -> list[Finding]:
        """Confirmed hardware findings: escalated (driver, device), never fixed in code."""
        return list(self.state.escalations)

    @property
    def pending_fix(self) -> dict | None:
        """The approved fix awaiting Verify (its JSON), or None."""
        fix = self.state.pending
        return fix.to_json() if fix is not None else None

    @property
    def artifact(self) -> str | None:
        """Where the current artifact came from: the reproduced script, or the last kept fix."""
        return self.state.current_source

    @property
    def artifact_copy(self) -> str:
        """The session's own copy of the current artifact's code (what Fix diffs against)."""
        return self.store.path(self.state.current)

    @property
    def fix_allowed(self) -> bool:
        """True exactly when a confirmed, unresolved finding exists (the Fix gate)."""
        return self.state.fix_allowed

    @property
    def phase(self) -> str:
        """The current phase: the first one not yet done (``done`` when nothing is left)."""
        return self.state.phase

    def gates(self) -> dict[str, str | None]:
        """For each phase, None when it may run, else the reason it is blocked."""
        return dict(self.state.gates)

    @property
    def root_cause(self) -> Finding | None:
        """The current confirmed finding (the root cause Fix works on), or None."""
        return self.state.root_cause

    def require(self, phase: str) -> None:
        """Raise :class:`GateError` (one line with the reason) unless ``phase`` may run."""
        state = self.state
        reason = state.gates[phase]
        if reason:
            raise GateError(f"{phase} refused: {reason} (current phase: {state.phase})")

    _require = require

    # -- phase actions ---------------------------------------------------------------------
    def record_artifact(self, info: ArtifactInfo, **details) -> None:
        """Record what the session reproduces (the first event of a session).

        ``details`` (a cell's code and prelude, a log's path, ...) are kept with the event.
        """
        if any(e["kind"] == "artifact" for e in self._data["events"]):
            raise GateError("the session already has its artifact (a new reproduction is a "
                            "new session)")
        self._append("artifact", **{**info.to_json(), **details})

    def record_reproduce(self, result: dict | Reproduction) -> None:
        """Record the Reproduce result (status, steps, epochs, error, seconds, runs, ...)."""
        rep = result if isinstance(result, Reproduction) else Reproduction.from_json(result)
        self._append("reproduce", result=rep.to_json())

    def record_classification(self, classification: Classification, signals: dict) -> None:
        """Record the Classify result; needs a reproduce record."""
        self.require("classify")
        self._append("classify", classification=classification.to_json(), signals=signals)

    def record_findings(self, findings: list[Finding], *, added: bool = False, **info) -> None:
        """Record Isolate's findings, confirmed first; needs a classification.

        With ``added``, the findings join the current round's (same check ids replaced, the
        others kept, what was resolved stays resolved): probes run by name add evidence, they
        do not restart the investigation. ``info`` (probe timings, noise band, ...) is kept
        with the event.
        """
        self.require("isolate")
        found = list(findings)
        if added:
            new = {f.check for f in found}
            found = [f for f in self.state.findings if f.check not in new] + found
        ordered = sorted(found, key=lambda f: not f.confirmed)
        self._append("isolate", findings=[f.to_json() for f in ordered], added=added, **info)

    def record_evidence(self, code: str, outputs: str, numbers: dict[str, float]) -> dict:
        """Attach a cell's outputs and numbers to the current hypothesis (confirms nothing)."""
        state = self.state
        hypothesis = state.queue[0].check if state.queue else \
            (state.findings[0].check if state.findings else None)
        return self._append("evidence", hypothesis=hypothesis, phase=state.phase, code=code,
                            outputs=outputs, numbers=numbers, confirms=False)

    def record_note(self, text: str) -> dict:
        """A free-text note in the log (changes no phase)."""
        return self._append("note", text=str(text))

    def record_plan(self, plan: dict | FixPlan) -> FixPlan:
        """Record a fix plan awaiting approval (it survives a restart).

        The Fix gate must be open and the plan must address the current finding.
        """
        with _SessionLock(self, "fix", wait=APPEND_WAIT):
            self.reload()
            plan = self._check_plan(plan)
            self._append("plan", plan=plan.to_json())
        return self.state.plan

    def _check_plan(self, plan: dict | FixPlan) -> FixPlan:
        """The plan, typed, when the Fix gate is open and it addresses the current finding."""
        self.require("fix")
        try:
            plan = plan if isinstance(plan, FixPlan) else FixPlan.from_json(plan)
        except RecordError as exc:
            raise GateError(f"fix refused: not a fix plan ({exc}); plan it with plan_fix") \
                from None
        queue = self.state.queue
        if not plan.source and not plan.fixed:
            raise GateError("fix refused: the plan holds no code (plan it with plan_fix)")
        if plan.finding != queue[0].check:
            raise GateError(f"fix refused: it addresses {plan.finding!r}, but the current "
                            f"finding is {queue[0].check!r} (one problem at a time, in order: "
                            f"{', '.join(f.check for f in queue)})")
        return plan

    def approve(self) -> FixPlan:
        """Approve the recorded plan (:meth:`record_plan`).

        The same as ``record_fix(plan, approved=True)``.
        """
        with _SessionLock(self, "fix", wait=APPEND_WAIT):
            self.reload()
            plan = self.state.plan
            if plan is None:
                raise GateError("fix refused: no plan to approve; put the changed code in a "
                                "%%fix cell first")
            self.record_fix(plan, approved=True)
        return plan

    def record_fix(self, fix: dict | FixPlan, approved: bool) -> None:
        """Record an approved fix plan (see :func:`model_debugger.phases.fix.plan_fix`).

        Raises
        ------
        GateError
            Without a confirmed finding, without approval, or for a finding that is not the
            current one in the queue; the session is unchanged.
        """
        with _SessionLock(self, "fix", wait=APPEND_WAIT):  # gates and copy number: as saved
            self.reload()
            plan = self._check_plan(fix)
            if not approved:
                raise GateError("fix refused: the plan was not approved (approve it explicitly, "
                                "e.g. --yes or the Approve button)")
            source = plan.source
            if source is None and plan.fixed:
                with open(plan.fixed, encoding="utf-8", errors="surrogateescape") as fh:
                    source = fh.read()
            copy = self.store.fix_rel(self.state.fixes + 1)
            self.store.write(copy, redact_code(source or ""))  # atomic, 0600, no link followed
            out = {k: v for k, v in plan.to_json().items() if k != "source"}
            self._append("fix", fix={**out, "copy": copy, "approved": True})

    def record_verification(self, verification: dict | Verification) -> None:
        """Record Verify's verdict on the pending fix; needs an approved fix."""
        self.require("verify")
        if isinstance(verification, dict) and verification.get("verdict") not in VERDICTS:
            raise SessionError(f"unknown verdict {verification.get('verdict')!r}")
        v = verification if isinstance(verification, Verification) else \
            Verification.from_json(verification)
        self._append("verify", verification=v.to_json())

    def report(self) -> dict:
        """The report shared by the CLI, notebooks, the sidebar and exports (one replay)."""
        st = self.state
        return {
            "schema": REPORT_SCHEMA,
            "session": self.id,
            "session_dir": self.directory,
            "phase": st.phase,
            "fix_allowed": st.fix_allowed,
            "reproduce": st.reproduction.to_json() if st.reproduction else None,
            "classification": st.classification.to_json() if st.classification else None,
            "findings": [f.to_json() for f in st.findings],
            "fix": st.pending.to_json() if st.pending else _last_fix(self._data["events"]),
            "verification": st.verification.to_json() if st.verification else None,
            "queue": [f.check for f in st.queue],
            "escalations": [f.to_json() for f in st.escalations],
            "gates": dict(st.gates),
            "phases": [{"phase": p, "status": s} for p, s in st.strip],
            "plan": st.plan.to_json() if st.plan else None,
        }


def _last_fix(events: list[dict]) -> dict | None:
    e = next((e for e in reversed(events) if e["kind"] == "fix"), None)
    return e["fix"] if e else None


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
        self.session.reload()
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
